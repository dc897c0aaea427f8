"""``gpulayer plot``: a real run's metrics.csv drawn through the installed ``gpulayer`` command, and bad input refused."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer
from gpulayer.trainer.logging.plot import INSTALL_HINT, main, read_panels

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Regression(Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(root: Path, max_epochs: int = 3) -> Path:
    """A real run with the default CSV logger; returns its metrics.csv."""
    torch.manual_seed(0)
    x = torch.randn(32, 3)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    trainer = Trainer(max_epochs=max_epochs, log_every_n_steps=1, enable_checkpointing=False, default_root_dir=root)
    trainer.fit(Regression(), loader, loader)
    return Path(trainer.logger.log_dir) / "metrics.csv"


def _gpulayer(*args: str) -> subprocess.CompletedProcess:
    """The installed ``gpulayer`` command (it finds ``plot`` through the gpulayer.commands entry point)."""
    command = Path(sys.executable).with_name("gpulayer")
    return subprocess.run([str(command), *args], capture_output=True, text=True, timeout=120)


def test_a_runs_curves_are_grouped_by_measure_with_the_csvs_steps_and_values(tmp_path):
    metrics_csv = _fit(tmp_path)
    panels = read_panels(metrics_csv)
    assert list(panels) == ["loss"]
    names = [curve.name for curve in panels["loss"]]
    assert names == ["train_loss_epoch", "train_loss_step", "val_loss"]
    with open(metrics_csv, newline="") as file:
        rows = list(csv.DictReader(file))
    val = panels["loss"][2]
    assert val.steps == [float(row["step"]) for row in rows if row["val_loss"]]
    assert val.values == [float(row["val_loss"]) for row in rows if row["val_loss"]]
    assert len(panels["loss"][1].values) == 12  # 4 batches x 3 epochs, logged on every step


def test_gpulayer_plot_draws_the_newest_run_below_a_folder(tmp_path):
    pytest.importorskip("matplotlib")
    _fit(tmp_path, max_epochs=1)
    newest = _fit(tmp_path, max_epochs=2)
    output = tmp_path / "figures" / "curves.png"
    done = _gpulayer("plot", str(tmp_path), "-o", str(output))
    assert done.returncode == 0, done.stderr
    assert f"3 curves from {newest}" in done.stdout
    assert output.read_bytes().startswith(PNG_SIGNATURE)
    assert [path.name for path in output.parent.iterdir()] == ["curves.png"]  # no temporary left


@pytest.mark.parametrize(
    ("source", "output", "message"),
    [
        ("missing", "curves.png", "source '{tmp}/missing': no such file or folder"),
        ("empty", "curves.png", "source '{tmp}/empty': no metrics.csv below it"),
        ("other.csv", "curves.png", "source '{tmp}/other.csv': not a metrics.csv (expected a 'step' column)"),
        ("run", "curves.txt", "--output '{tmp}/curves.txt': expected a file name ending in one of ."),
    ],
)
def test_bad_input_is_refused_naming_the_argument_before_anything_is_written(tmp_path, capsys, source, output, message):
    pytest.importorskip("matplotlib")
    (tmp_path / "empty").mkdir()
    (tmp_path / "other.csv").write_text("epoch,loss\n0,1.0\n")
    _fit(tmp_path / "run", max_epochs=1)
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / source), "-o", str(tmp_path / output)])
    assert exited.value.code == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
    assert not (tmp_path / output).exists()


def test_without_matplotlib_it_says_how_to_install_it(tmp_path):
    metrics_csv = _fit(tmp_path, max_epochs=1)
    hide_matplotlib = "import sys; sys.modules['matplotlib'] = None"  # as if it were not installed
    code = f"{hide_matplotlib}; from gpulayer.trainer.logging.plot import main; sys.exit(main([{str(metrics_csv)!r}]))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == INSTALL_HINT
    assert os.listdir(tmp_path) == ["lightning_logs"]  # no curves.png
