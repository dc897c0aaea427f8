"""``gpulayer port --verify``: the comparison's verdicts, the caps both trainers take alike, bad input refused with
exit status 2 and nothing left behind, and (marked ``porting``: they run Lightning) a port that differs reported at
its call and step, and a port that fails reported with its error."""

import inspect
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from gpulayer.port.cli import main
from gpulayer.port.comparison import compare_records, compare_values
from gpulayer.port.trainer_caps import capped
from gpulayer.port.verify import Run, not_installed
from gpulayer.runtime.testing import run_command

COMMAND_TIMEOUT_S = 300
CAPPED = (
    "max_epochs",
    "max_steps",
    "limit_train_batches",
    "limit_val_batches",
    "limit_test_batches",
    "val_check_interval",
    "num_sanity_val_steps",
)


def _record(**changes) -> dict:
    call = {
        "call": "fit",
        "trainer": "lightning.pytorch.trainer.trainer.Trainer",
        "global_step": 4,
        "current_epoch": 1,
        "callback_metrics": {"val_loss": torch.tensor(0.5)},
        "logged_metrics": {"val_loss": torch.tensor(0.5)},
        "returned": None,
        "rows": [{"logger": 0, "step": 1, "metrics": {"train_loss": 0.75, "epoch": 0}}],
        "checkpoints": ["lightning_logs/version_0/checkpoints/epoch=0-step=4.ckpt"],
        "error": None,
    }
    weights = {"layer.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    record = {
        "calls": [call],
        "trainers": ["lightning.pytorch.trainer.trainer.Trainer"],
        "weights": weights,
        "optimizers": [],
        "error": None,
    }
    for path, value in changes.items():  # "calls/0/rows/0/metrics/train_loss": a value deep inside
        *parents, last = path.split("/")
        inner = record
        for key in parents:
            inner = inner[int(key)] if isinstance(inner, list) else inner[key]
        inner[int(last) if isinstance(inner, list) else last] = value
    return record


def test_the_verdict_is_identical_close_or_the_first_difference_with_both_values():
    assert compare_records(_record(), _record()).verdict == "identical"
    nearly = _record(**{"weights/layer.weight": torch.tensor([[1.0, 2.0], [3.0, 4.000001]])})
    assert compare_records(_record(), nearly).verdict == "close (max |dw| = 9.54e-07, within float tolerance)"
    row = _record(**{"calls/0/rows/0/metrics/train_loss": 0.5})
    assert str(compare_records(_record(), row).difference) == (
        "call 1 (fit), step 1: logged row 1['train_loss']: Lightning 0.75 != GPUlayer 0.5"
    )
    no_row = _record(**{"calls/0/rows": []})
    assert compare_records(_record(), no_row).verdict == (
        "differs at call 1 (fit), step 1: logged row 1: Lightning {'train_loss': 0.75, 'epoch': 0} != GPUlayer no row"
    )
    weights = _record(**{"weights/layer.weight": torch.tensor([[1.0, 2.0], [3.5, 4.0]])})
    assert str(compare_records(_record(), weights).difference) == (
        "the end, step 4: weights['layer.weight'][1, 0]: Lightning 3 != GPUlayer 3.5"
    )
    steps = _record(**{"calls/0/global_step": 5})
    assert str(compare_records(_record(), steps).difference) == (
        "call 1 (fit), step 4 (its end): global_step: Lightning 4 != GPUlayer 5"
    )
    files = _record(**{"calls/0/checkpoints": []})
    assert str(compare_records(_record(), files).difference) == (
        "call 1 (fit), step 4 (its end): checkpoints (length): Lightning 1 != GPUlayer 0"
    )
    test = _record()
    test["calls"].append({**test["calls"][0], "call": "test", "rows": []})
    assert str(compare_records(test, _record()).difference) == (
        "call 2: Lightning 2 calls (fit, test) != GPUlayer 1 calls (fit)"
    )
    assert compare_values([1, 2.0], [1, 2.0 + 1e-7]).verdict.startswith("close (max |dw| = 1e-07")
    assert compare_values({"a": 1}, {"b": 1}, "metrics").verdict.startswith(
        "differs at metrics (keys): Lightning ['a']"
    )


@pytest.mark.parametrize("given", [{}, {"max_epochs": 10, "limit_val_batches": 0.5, "val_check_interval": 3}])
def test_both_trainers_take_the_caps_alike(given, tmp_path, monkeypatch):
    """Each Trainer's own defaults (and a script's values), capped at 4 steps of 2 accumulated batches: one epoch of
    8 batches, 4 batches per evaluation loop, one validation at the epoch's end, on the CPU."""
    import lightning.pytorch as lightning

    from gpulayer.trainer import Trainer

    monkeypatch.chdir(tmp_path)
    seen = []
    for trainer_class in (lightning.Trainer, Trainer):
        parameters = inspect.signature(trainer_class.__init__).parameters.values()
        defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
        arguments = capped({**defaults, **given, "accumulate_grad_batches": 2}, 4)
        trainer = trainer_class(**{**arguments, "logger": False, "enable_progress_bar": False})
        seen.append({name: getattr(trainer, name) for name in CAPPED})
        assert trainer.strategy.root_device == torch.device("cpu")
    assert (
        seen[0]
        == seen[1]
        == {
            "max_epochs": 1,
            "max_steps": -1,
            "limit_train_batches": 8,
            "limit_val_batches": 4,
            "limit_test_batches": 4,
            "val_check_interval": 1.0,
            "num_sanity_val_steps": 2,
        }
    )


def test_a_scripts_own_smaller_limits_stay():
    arguments = {"max_epochs": 0, "max_steps": 3, "limit_train_batches": 2, "limit_val_batches": 0.0, "min_steps": 50}
    assert capped({**arguments, "accumulate_grad_batches": 1}, 32) == {
        **arguments,
        "min_steps": 32,
        "accumulate_grad_batches": 1,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train.py", "--verify", "--steps", "0"], "argument --steps: '0' (accepted: a whole number of at least 1)"),
        (
            ["train.py", "--verify", "--steps", "two"],
            "argument --steps: 'two' (accepted: a whole number of at least 1)",
        ),
        (["train.py", "--verify", "--timeout", "0"], "argument --timeout: '0' (accepted: a number of seconds of at"),
        (["train.py", "--check", "--steps", "4"], "--steps: only with --verify"),
        (["train.py", "--check", "--", "--lr", "1"], "arguments after --: only with --verify"),
        (["missing.py", "--verify"], "missing.py: no such file"),
        (["project", "--verify"], "--verify runs a script: give it as the first SOURCE, or name it with --script"),
        (["project", "--verify", "--script", "train.py"], "--script train.py: not among the SOURCE files, nor in a"),
        (["project", "--verify", "--script", "project/notes.txt"], "--script project/notes.txt: not a script"),
        (["train.py", "--verify", "--script", "project/.hidden/run.py"], "--script project/.hidden/run.py: not among"),
    ],
)
def test_bad_input_is_refused_naming_the_argument_before_any_work(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "project" / ".hidden").mkdir(parents=True)
    for name in ("train.py", "project/notes.txt", "project/.hidden/run.py"):
        (tmp_path / name).write_text("print('hello')\n")
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err
    assert list((tmp_path / "tmp").iterdir()) == []


def test_without_lightning_verify_is_refused_saying_what_to_install(tmp_path, monkeypatch, capsys):
    """An entry of None in ``sys.modules`` is how Python marks a module as not importable."""
    monkeypatch.chdir(tmp_path)
    for name in ("lightning", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, name, None)
    Path("train.py").write_text("print('hello')\n")
    with pytest.raises(SystemExit) as exit:
        main(["train.py", "--verify"])
    assert exit.value.code == 2
    assert "--verify runs the original under Lightning, which is not installed here" in capsys.readouterr().err


def _failed_importing(framework: str, module: str) -> Run:
    error = {"text": f"ModuleNotFoundError: No module named '{module}'", "missing_module": module}
    return Run(framework, 1, {"calls": [], "trainers": [], "error": error}, "")


def test_a_run_that_cannot_import_its_framework_names_what_to_install():
    """Lightning for the original; for the port, the GPUlayer distribution of the module it imports (gpulayer-port
    alone does not install gpulayer-callbacks, which a ported ModelCheckpoint needs)."""
    finished = Run(
        "Lightning", 0, {"calls": [], "trainers": ["lightning.pytorch.trainer.trainer.Trainer"], "error": None}, ""
    )
    ours = _failed_importing("GPUlayer", "gpulayer.callbacks")
    assert not_installed((finished, ours)) == (
        "the port imports gpulayer.callbacks, which is not installed here: pip install gpulayer-callbacks"
    )
    theirs = _failed_importing("Lightning", "pytorch_lightning")
    assert not_installed((theirs, ours)) == (
        "the original imports pytorch_lightning, which is not installed here: pip install 'lightning==2.6.*'"
    )
    assert not_installed((finished, _failed_importing("GPUlayer", "torchvision"))) is None  # the script's own


def _verify(tmp_path: Path, script: str, *options: str, source: str = "train.py") -> tuple[int, str, str]:
    """``gpulayer port SOURCE --verify OPTIONS`` run in ``tmp_path/project`` (holding the script as ``train.py``), its
    temporary folders under ``tmp_path/tmp``, which must be empty afterwards, with no process of the runs left."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(textwrap.dedent(script))
    (tmp_path / "tmp").mkdir()
    environment = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    command = [sys.executable, "-m", "gpulayer.runtime", "port", source, "--verify", *options]
    finished = run_command(command, cwd=str(project), env=environment, timeout=COMMAND_TIMEOUT_S)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert _processes_naming(tmp_path / "tmp") == []
    return finished.returncode, finished.stdout, finished.stderr


def _processes_naming(folder: Path) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if entry.isdigit() and str(folder) in line:
            found.append(line)
    return found


def test_a_script_that_builds_no_trainer_is_refused_with_nothing_left(tmp_path):
    """The script's arguments (after ``--``) reach it in both runs, as ``python train.py --lr 0.1`` gives them."""
    script = "import sys\nassert sys.argv[1:] == ['--lr', '0.1'], sys.argv\n"
    status, out, err = _verify(tmp_path, script, "--", "--lr", "0.1")
    assert status == 2, out + err
    assert "gpulayer port --verify: train.py --lr 0.1 under lightning" in out
    assert "gpulayer port --verify: train.py built no Trainer under Lightning: nothing to compare" in err
    assert "Lightning: exit status 0: no Trainer call" in out


def test_the_project_folder_one_runs_in_is_verified_as_dot(tmp_path):
    """issue 48: ``gpulayer port . --verify --script train.py`` from inside the project: both copies laid out alike
    (the script found in each), where ``.`` was once copied onto the run's folder (``FileExistsError``)."""
    status, out, err = _verify(tmp_path, "print('ran')\n", "--script", "train.py", source=".")
    assert status == 2, out + err
    assert "gpulayer port --verify: train.py built no Trainer under Lightning: nothing to compare" in err
    assert "Lightning: exit status 0: no Trainer call" in out and "GPUlayer: exit status 0: no Trainer call" in out


def test_a_run_that_exits_with_a_status_shows_the_end_of_what_it_printed(tmp_path):
    """issue 48: a run ended by ``SystemExit: 2`` (a command line's parse error, as LightningCLI's) shows the end of
    its output, argparse's usage and error, above the exit, as a run's traceback is shown."""
    script = "import argparse\nargparse.ArgumentParser(prog='train.py').parse_args()\n"
    status, out, err = _verify(tmp_path, script, "--", "--epochs", "3")
    assert status == 1, out + err
    shown = [
        "    usage: train.py [-h]",
        "    train.py: error: unrecognized arguments: --epochs 3",
        "    SystemExit: 2",
    ]
    for framework in ("Lightning", "GPUlayer"):
        start = out.splitlines().index(f"{framework}: exit status 1: no Trainer call")
        assert out.splitlines()[start + 1 : start + 4] == shown, out
    assert (
        out.splitlines()[-1]
        == "failed: the Lightning run and the GPUlayer run did not finish (the end of its error above)"
    )


def test_runs_past_the_timeout_are_killed_and_refused_with_nothing_left(tmp_path):
    status, out, err = _verify(tmp_path, "while True:\n    pass\n", "--timeout", "1")
    assert status == 2, out + err
    assert (
        "gpulayer port --verify: --timeout 1: the Lightning and GPUlayer runs were still going after 1 s, and stopped"
        in err
    )


def test_importing_the_port_does_not_import_lightning():
    modules = ("cli", "verify", "recording", "comparison", "run_recorded", "trainer_caps")
    probe = f"import sys; import {', '.join(f'gpulayer.port.{m}' for m in modules)}; "
    probe += "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))"
    finished = run_command([sys.executable, "-c", probe], timeout=COMMAND_TIMEOUT_S)
    assert (finished.returncode, finished.stdout) == (0, "[]\n"), finished.stderr


RESUMED = """\
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset


    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)


    def trainer(max_steps):
        checkpoint = ModelCheckpoint(dirpath="checkpoints", save_last=True)
        return L.Trainer(max_steps=max_steps, log_every_n_steps=1, callbacks=[checkpoint], {logger})


    L.seed_everything(0)
    x = torch.randn(96, 8)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
    trainer(6).fit(Net(), loader)  # stops in the middle of a 12-batch epoch
    trainer(12).fit(Net(), loader, ckpt_path="checkpoints/last.ckpt")
"""


@pytest.mark.porting
def test_a_resume_after_a_max_steps_stop_differs_at_the_resumed_call_and_step(tmp_path):
    """docs/porting-from-lightning.md: from a checkpoint of a ``max_steps`` stop inside an epoch, GPUlayer finishes
    the epoch, and Lightning (one epoch allowed: ``--verify`` runs one) counts it done and trains nothing more."""
    status, out, err = _verify(tmp_path, RESUMED.format(logger=""))
    assert status == 1, out + err
    assert out.splitlines()[-4:-2] == [
        "Lightning: exit status 0: fit (step 6, epoch 1), fit (step 6, epoch 1)",
        "GPUlayer: exit status 0: fit (step 6, epoch 1), fit (step 12, epoch 1)",
    ]
    assert out.splitlines()[-1].startswith(
        "differs at call 2 (fit), step 6: logged row 1: Lightning no row != GPUlayer {'train_loss': "
    )


@pytest.mark.porting
def test_a_port_that_fails_is_reported_after_the_findings_with_its_error(tmp_path):
    status, out, err = _verify(tmp_path, RESUMED.format(logger="model_registry='m'"))
    assert status == 1, out + err
    lines = out.splitlines()
    assert lines[0] == (
        "train.py:24:88: Trainer: model_registry='m': GPUlayer uploads nothing; save with ModelCheckpoint and upload "
        "the file yourself (accepted: None)"
    )
    assert lines[2] == "Lightning: exit status 0: fit (step 6, epoch 1), fit (step 6, epoch 1)"
    assert lines[3] == "GPUlayer: exit status 1: no Trainer call"
    assert (
        "model_registry='m'" in lines[-2]
        and lines[-1] == "failed: the GPUlayer run did not finish (the end of its error above)"
    )


LIBRARY = """\
import lightning as L
import torch
from torch.utils.data import DataLoader


class _Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit():
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(_Model(), DataLoader(torch.ones(8, 2), batch_size=2))
"""


@pytest.mark.porting
def test_a_port_that_runs_lightnings_trainer_alone_is_not_ported_not_identical(tmp_path, monkeypatch):
    """issue 48: a library that builds Lightning's Trainer itself (installed, outside the project) trains under
    Lightning in both runs: the verdict says no GPUlayer Trainer ran, with exit status 3, not ``identical``."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "trains_itself.py").write_text(LIBRARY)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    status, out, err = _verify(tmp_path, "import trains_itself\n\ntrains_itself.fit()\n")
    assert status == 3, out + err
    assert "GPUlayer: exit status 0: fit (step 4, epoch 1)" in out
    assert out.splitlines()[-1] == (
        "not ported: no GPUlayer Trainer ran in the port (it built lightning.pytorch.trainer.trainer.Trainer alone): "
        "both runs trained on Lightning, so they were not compared (a library that builds Lightning's Trainer "
        "itself keeps the project on Lightning: the report above names it)"
    )
