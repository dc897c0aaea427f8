"""``gpulayer port`` where a project relies on Lightning's default logger, a TensorBoardLogger: the logger written
into each Trainer built on the default (a call's or a Hydra config's), a finding where it cannot be, and the run's
event files the same as Lightning's (issue 48)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpulayer.port.cli import main


def _relying_on_tensorboard(folder: Path) -> Path:
    """A project whose module needs TensorBoard, and its script of Trainers on Lightning's default logger and not."""
    (folder / "model.py").write_text(
        "import lightning as L\n\n\nclass Net(L.LightningModule):\n"
        "    def on_validation_epoch_end(self):\n"
        "        self.logger.experiment.add_image('digits', self.grid, self.current_epoch)\n"
    )
    (folder / "train.py").write_text(
        "import lightning as L\n"
        "from lightning.pytorch.loggers import TensorBoardLogger\n\n"
        "a = L.Trainer(max_epochs=2)\n"
        "b = L.Trainer(logger=True, default_root_dir='runs')\n"
        "c = L.Trainer(logger=TensorBoardLogger('logs'))\n"
        "d = L.Trainer(**config)\n"
        "e = L.Trainer(\n    max_epochs=2,\n)\n"
    )
    return folder / "train.py"


def test_lightnings_default_logger_is_written_where_the_project_relies_on_tensorboard(tmp_path, capsys):
    """issue 48: Lightning's default logger is a TensorBoardLogger (tensorboard installed), GPUlayer's a CSVLogger: in
    a project whose code needs TensorBoard, each Trainer built on the default gets Lightning's logger by name, with
    Lightning's save_dir (the Trainer's default_root_dir, else the working folder) and name, and a line saying so."""
    script = _relying_on_tensorboard(tmp_path)
    assert main([str(tmp_path), "--in-place"]) == 0
    assert script.read_text() == (
        "from gpulayer.trainer import Trainer\n"
        "from lightning.pytorch.loggers import TensorBoardLogger\n\n"
        'a = Trainer(max_epochs=2, logger=TensorBoardLogger(save_dir=".", name="lightning_logs"))\n'
        "b = Trainer(logger=TensorBoardLogger(save_dir='runs', name=\"lightning_logs\"), default_root_dir='runs')\n"
        "c = Trainer(logger=TensorBoardLogger('logs'))\n"
        "d = Trainer(**config)\n"
        'e = Trainer(\n    max_epochs=2,\n    logger=TensorBoardLogger(save_dir=".", name="lightning_logs"),\n)\n'
    )
    use = f"{tmp_path / 'model.py'}:6 (self.logger.experiment.add_image)"
    written = [
        (4, 'logger=TensorBoardLogger(save_dir=".", name="lightning_logs")'),
        (5, "logger=TensorBoardLogger(save_dir='runs', name=\"lightning_logs\")"),
        (8, 'logger=TensorBoardLogger(save_dir=".", name="lightning_logs")'),
    ]
    assert capsys.readouterr().out.splitlines() == [
        f"{script}:{line}:5: Trainer: {code} written: Lightning's default logger, which {use} relies on"
        for line, code in written
    ]
    assert main([str(tmp_path), "--check"]) == 0  # a second port changes nothing


def test_without_tensorboard_or_a_free_name_a_trainer_on_the_default_logger_is_a_finding(tmp_path, monkeypatch, capsys):
    """Where tensorboard is not importable (Lightning's default is then a CSVLogger) or ``TensorBoardLogger`` means
    something else at the call, nothing is written and the Trainer is a finding naming the fix; a project whose code
    needs no TensorBoard keeps the default silently."""
    script = _relying_on_tensorboard(tmp_path)
    note = (
        "no logger given: GPUlayer's default logger is a CSVLogger where Lightning's is a TensorBoardLogger "
        f"(tensorboard installed), and {tmp_path / 'model.py'}:6 (self.logger.experiment.add_image) relies on "
        "TensorBoard; pass logger=TensorBoardLogger(...) from lightning.pytorch.loggers, which GPUlayer takes as it is"
    )
    with monkeypatch.context() as patched:
        for name in ("tensorboard", "tensorboardX"):
            patched.setitem(sys.modules, name, None)  # how Python marks a module as not importable
        assert main([str(tmp_path), "--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [f"{script}:{line}:5: Trainer: {note}" for line in (4, 5, 8)]
    script.write_text("import lightning as L\n\nTensorBoardLogger = print\na = L.Trainer(max_epochs=2)\n")
    assert main([str(tmp_path), "--in-place"]) == 1
    assert (
        script.read_text()
        == "from gpulayer.trainer import Trainer\n\nTensorBoardLogger = print\na = Trainer(max_epochs=2)\n"
    )
    assert capsys.readouterr().out.splitlines() == [f"{script}:4:5: Trainer: {note}"]
    (tmp_path / "model.py").write_text("import lightning as L\n\n\nclass Net(L.LightningModule):\n    pass\n")
    assert main([str(tmp_path), "--check"]) == 0  # nothing needs TensorBoard: the default is fine


def test_a_hydra_trainer_on_the_default_logger_gets_lightnings_logger_where_the_project_relies_on_it(tmp_path, capsys):
    """The config's Trainer as a call's: Lightning's logger written as a mapping Hydra instantiates, after its last
    key (``save_dir`` its ``default_root_dir``), or in place of ``logger: true``; comments and the rest stay."""
    (tmp_path / "model.py").write_text("def f(self):\n    self.logger.experiment.add_text('a', 'b')\n")
    config = tmp_path / "train.yaml"
    config.write_text(
        "trainer:\n  _target_: lightning.pytorch.Trainer  # Lightning's\n  default_root_dir: ${oc.env:OUT}\n"
        "  callbacks:\n    - _target_: lightning.pytorch.callbacks.ModelCheckpoint\nother:\n"
        "  _target_: lightning.pytorch.Trainer\n  logger: true\n"
    )
    assert main([str(tmp_path), "--in-place"]) == 0
    logger = "{_target_: lightning.pytorch.loggers.TensorBoardLogger, save_dir: %s, name: lightning_logs}"
    quoted = "'${oc.env:OUT}'"  # a flow mapping takes an interpolation quoted
    assert config.read_text() == (
        "trainer:\n  _target_: gpulayer.trainer.Trainer  # Lightning's\n  default_root_dir: ${oc.env:OUT}\n"
        "  callbacks:\n    - _target_: gpulayer.callbacks.ModelCheckpoint\n"
        f"  logger: {logger % quoted}\nother:\n"
        f"  _target_: gpulayer.trainer.Trainer\n  logger: {logger % '.'}\n"
    )
    assert [line.split(" written: ")[0].split(": an ")[0] for line in capsys.readouterr().out.splitlines()] == [
        f"{config}:2:13: Trainer: logger: {logger % quoted}",
        f"{config}:3:3: Trainer: default_root_dir=${{oc.env:OUT}}",  # an interpolation it cannot judge
        f"{config}:7:13: Trainer: logger: {logger % '.'}",
    ]
    assert yaml.safe_load(config.read_text())["trainer"]["logger"]["save_dir"] == "${oc.env:OUT}"
    beside = "trainer:\n  _target_: lightning.pytorch.Trainer\nlogger:\n  _target_: lightning.pytorch.loggers.TensorBoardLogger\n"
    config.write_text(beside)  # a logger the config builds beside the Trainer, for the code to pass it: no default
    assert main([str(config), "--in-place"]) == 0
    assert config.read_text() == beside.replace("lightning.pytorch.Trainer", "gpulayer.trainer.Trainer")


RELIES_ON_TENSORBOARD = """\
import lightning as L
import torch
from torch.utils.data import DataLoader


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        self.logger.experiment.add_histogram("weight", self.layer.weight, self.global_step)
        loss = self.layer(batch).sum()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


for root in ("runs", None):
    trainer = L.Trainer(max_epochs=1, default_root_dir=root, accelerator="cpu", enable_progress_bar=False)
    trainer.fit(Net(), DataLoader(torch.ones(8, 2), batch_size=2))
"""


@pytest.mark.porting
def test_the_written_logger_keeps_lightnings_event_files(tmp_path):
    """The script under Lightning, and its port under GPUlayer, write the same files: each Trainer's
    ``lightning_logs/version_0`` (under its default_root_dir, else the working folder) with its event file and
    checkpoint."""
    (tmp_path / "lightning").mkdir()
    (tmp_path / "lightning" / "train.py").write_text(RELIES_ON_TENSORBOARD)
    assert main([str(tmp_path / "lightning" / "train.py"), "--out", str(tmp_path / "gpulayer")]) == 0
    assert "TensorBoardLogger(save_dir=" in (tmp_path / "gpulayer" / "train.py").read_text()
    files = []
    for framework in ("lightning", "gpulayer"):
        folder = tmp_path / framework
        ran = subprocess.run([sys.executable, "train.py"], capture_output=True, text=True, timeout=300, cwd=folder)
        assert ran.returncode == 0, ran.stderr
        written = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
        files.append([re.sub(r"events\.out\.tfevents\..*", "events.out.tfevents.*", path) for path in written])
    assert files[0] == files[1]
    assert "runs/lightning_logs/version_0/events.out.tfevents.*" in files[0]
    assert "lightning_logs/version_0/checkpoints/epoch=0-step=4.ckpt" in files[0]
