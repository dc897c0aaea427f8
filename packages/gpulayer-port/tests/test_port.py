"""``gpulayer port``: the rewrite of each form Lightning's names take in real code, the report, the exit status, and
bad input refused before anything is written."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer.port import registry
from gpulayer.port.cli import main
from gpulayer.port.rewrite import port_code

TUNER = registry.REGISTRY["lightning.pytorch.tuner."].note
PROFILERS = registry.REGISTRY["lightning.pytorch.profilers."].note
PACKAGES = Path(__file__).resolve().parents[2]


def test_the_command_and_libcst_are_declared_here_and_in_gpulayers_all_extra_and_not_by_the_trainer():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    port = tomllib.loads((PACKAGES / "gpulayer-port" / "pyproject.toml").read_text())["project"]
    module, function = port["entry-points"]["gpulayer.commands"]["port"].split(":")
    assert getattr(importlib.import_module(module), function) is main
    assert [requirement.split(">")[0] for requirement in port["dependencies"] if "gpulayer" not in requirement] == [
        "libcst",
        "pyyaml",
    ]
    meta = tomllib.loads((PACKAGES / "gpulayer" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("gpulayer-port==") for r in meta["all"]), meta["all"]
    trainer = tomllib.loads((PACKAGES / "gpulayer-trainer" / "pyproject.toml").read_text())["project"]
    assert "port" not in trainer["entry-points"]["gpulayer.commands"]
    assert "port" not in trainer["optional-dependencies"]


def test_each_import_form_is_rewritten_and_every_other_byte_stays():
    source = (
        "import os  # why os\n"
        "import lightning as L\n"
        "import pytorch_lightning as pl\n"
        "from lightning.pytorch.callbacks import (\n"
        "    EarlyStopping as Stop,\n"
        "    LearningRateMonitor,\n"
        ")\n"
        "\n"
        "\n"
        "class Net(L.LightningModule):  # the model\n"
        "    def  forward(self,x):   return x   # odd spacing kept\n"
        "\n"
        "\n"
        "trainer = pl.Trainer(callbacks=[Stop('val'), LearningRateMonitor(),\n"
        "    L.pytorch.callbacks.ModelCheckpoint()])\n"
        "pl.seed_everything(0)\n"
        "self_named = trainer.LightningModule  # an attribute of something else: not Lightning's\n"
    )
    ported = port_code(source)
    assert ported.findings == []
    assert ported.code == (
        "import os  # why os\n"
        "from gpulayer.callbacks import EarlyStopping as Stop, LearningRateMonitor, ModelCheckpoint\n"
        "from gpulayer.trainer import Module, Trainer, seed_everything\n"
        "\n"
        "\n"
        "class Net(Module):  # the model\n"
        "    def  forward(self,x):   return x   # odd spacing kept\n"
        "\n"
        "\n"
        "trainer = Trainer(callbacks=[Stop('val'), LearningRateMonitor(),\n"
        "    ModelCheckpoint()])\n"
        "seed_everything(0)\n"
        "self_named = trainer.LightningModule  # an attribute of something else: not Lightning's\n"
    )
    assert port_code(ported.code).code == ported.code  # a second port changes nothing


def test_the_comments_of_a_replaced_import_stay():
    """A comment on a one-line import stays on its replacement (a ``# noqa`` keeps working); the comments of lines
    merged into one block go above it."""
    assert port_code("from lightning.pytorch import Trainer  # noqa: F401\n").code == (
        "from gpulayer.trainer import Trainer  # noqa: F401\n"
    )
    source = (
        "from pytorch_lightning.callbacks import EarlyStopping as ES  # patience from the config\n"
        "from lightning.pytorch.callbacks import (\n"
        "    ModelCheckpoint,  # the best two\n"
        "    LearningRateMonitor,\n"
        ")\n"
    )
    assert port_code(source).code == (
        "# patience from the config\n"
        "# the best two\n"
        "from gpulayer.callbacks import EarlyStopping as ES, LearningRateMonitor, ModelCheckpoint\n"
    )


def test_a_dotted_import_a_local_import_and_a_taken_name():
    source = (
        "import lightning.pytorch\n"
        "from torch.nn import Module\n"
        "from lightning.pytorch import LightningModule\n"
        "\n"
        "class Net(LightningModule):\n"
        "    pass\n"
        "\n"
        "def main():\n"
        "    from pytorch_lightning import Trainer as T\n"
        "    return lightning.pytorch.Trainer(), T(), Module\n"
    )
    assert port_code(source).code == (
        "from gpulayer.trainer import Trainer\n"
        "from torch.nn import Module\n"
        "from gpulayer.trainer import Module as LightningModule\n"  # torch's Module keeps its name
        "\n"
        "class Net(LightningModule):\n"
        "    pass\n"
        "\n"
        "def main():\n"
        "    from gpulayer.trainer import Trainer as T\n"
        "    return Trainer(), T(), Module\n"
    )


def test_a_module_imported_from_a_lightning_package_is_followed_through_its_attributes():
    source = (
        "from lightning.pytorch import callbacks\n"
        "from lightning import pytorch as pl\n"
        "c = [callbacks.ModelCheckpoint(), callbacks.RichProgressBar()]\n"
        "m = pl.LightningModule.load_from_checkpoint('x.ckpt')\n"
    )
    assert port_code(source).code == (
        "from gpulayer.callbacks import ModelCheckpoint\n"
        "from gpulayer.trainer import Module\n"
        "from lightning.pytorch import callbacks\n"  # still needed for the progress bar
        "c = [ModelCheckpoint(), callbacks.RichProgressBar()]\n"
        "m = Module.load_from_checkpoint('x.ckpt')\n"
    )


def test_loggers_and_display_callbacks_stay_lightnings_without_a_finding():
    source = (
        "from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, TQDMProgressBar\n"
        "from lightning.pytorch.loggers import TensorBoardLogger, CSVLogger\n"
        "import lightning.pytorch as pl\n"
        "logger = pl.loggers.WandbLogger()\n"
        "callbacks = [RichProgressBar(), TQDMProgressBar(), ModelCheckpoint()]\n"
    )
    ported = port_code(source)
    assert ported.findings == []
    assert ported.code == (
        "from gpulayer.callbacks import ModelCheckpoint\n"
        "from gpulayer.trainer import CSVLogger\n"
        "from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar\n"
        "from lightning.pytorch.loggers import TensorBoardLogger\n"
        "import lightning.pytorch as pl\n"
        "logger = pl.loggers.WandbLogger()\n"
        "callbacks = [RichProgressBar(), TQDMProgressBar(), ModelCheckpoint()]\n"
    )


@pytest.mark.parametrize(
    "source, ported",
    [
        (
            "from lightning.pytorch.callbacks.early_stopping import EarlyStopping",
            "from gpulayer.callbacks import EarlyStopping",
        ),
        (
            "from lightning.pytorch.callbacks.model_checkpoint import ModelCheckpoint",
            "from gpulayer.callbacks import ModelCheckpoint",
        ),
        (
            "from pytorch_lightning.callbacks.lr_monitor import LearningRateMonitor",
            "from gpulayer.callbacks import LearningRateMonitor",
        ),
        ("from pytorch_lightning.core.module import LightningModule", "from gpulayer.trainer import Module"),
        (
            "from lightning.pytorch.core.datamodule import LightningDataModule",
            "from gpulayer.trainer import DataModule",
        ),
        ("from lightning.pytorch.loggers.csv_logs import CSVLogger", "from gpulayer.trainer import CSVLogger"),
        (
            "from lightning.fabric.utilities.rank_zero import rank_zero_only",
            "from gpulayer.trainer import rank_zero_only",
        ),
        (
            "from lightning.pytorch.callbacks import early_stopping\nstop = early_stopping.EarlyStopping('loss')",
            "from gpulayer.callbacks import EarlyStopping\nstop = EarlyStopping('loss')",
        ),
        (  # accepted by GPUlayer's Trainer: kept, as from its package
            "from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBar",
            "from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBar",
        ),
        (
            "from lightning.pytorch.loggers.tensorboard import TensorBoardLogger",
            "from lightning.pytorch.loggers.tensorboard import TensorBoardLogger",
        ),
    ],
)
def test_a_name_imported_from_lightnings_submodules_is_ported_as_from_its_package(source, ported):
    """issue 43: Lightning's submodule paths of the names GPUlayer adopts or takes map like their package's path
    (``tests/test_port_registry_homes.py`` walks Lightning's modules for every such path)."""
    result = port_code(source + "\n")
    assert (result.code, result.findings, result.notes) == (ported + "\n", [], [])


def test_lightnings_helpers_that_work_as_they_are_are_named_without_a_finding(tmp_path, capsys):
    """issue 43: a helper that needs no Lightning Trainer (``suggested_max_num_workers``, ``grad_norm``) keeps its
    import, and the report says it works, where ``lightning.fabric``'s other names get the advice to use launch()."""
    script = tmp_path / "data.py"
    script.write_text(
        "import lightning.pytorch as pl\n"
        "from lightning.fabric.utilities.data import suggested_max_num_workers\n"
        "from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars\n"
        "workers = suggested_max_num_workers(1)\n"
        "norms = pl.utilities.grad_norm(model, norm_type=2)\n"
    )
    before = script.read_text()
    assert main([str(script), "--in-place"]) == 0
    helper = registry.REGISTRY["lightning.fabric.utilities.suggested_max_num_workers"].note
    assert registry.answer("lightning.fabric.utilities.data.suggested_max_num_workers").status == registry.WORKS
    assert capsys.readouterr().out.splitlines() == [
        f"{script}:2:45: suggested_max_num_workers: {helper}",
        f"{script}:3:51: convert_tensors_to_scalars: {helper}",
        f"{script}:5:9: pl.utilities.grad_norm: {helper}",
    ]
    assert script.read_text() == before
    assert registry.answer("lightning.fabric.Fabric").status == registry.NOT_ADOPTED


def test_lightning_cli_names_port_to_gpulayer_cli_and_the_rest_of_its_module_is_reported():
    source = (
        "from lightning.pytorch.cli import LightningCLI, LightningArgumentParser, OptimizerCallable\n"
        "from pytorch_lightning.cli import SaveConfigCallback, LRSchedulerTypeUnion\n"
        "cli = LightningCLI(Net, run=False)\n"
    )
    ported = port_code(source)
    assert ported.code.splitlines() == [
        "from gpulayer.cli import LightningArgumentParser, LightningCLI, OptimizerCallable, SaveConfigCallback",
        f"# gpulayer port: LRSchedulerTypeUnion: {registry.REGISTRY['lightning.pytorch.cli.'].note}",
        "from pytorch_lightning.cli import LRSchedulerTypeUnion",
        "cli = LightningCLI(Net, run=False)",
    ]
    assert [finding.format("x.py") for finding in ported.findings] == [
        f"x.py:2:55: LRSchedulerTypeUnion: {registry.REGISTRY['lightning.pytorch.cli.'].note}"
    ]


def test_what_is_not_adopted_is_reported_and_its_import_marked_once():
    source = (
        "import lightning as L\n"
        "from lightning.pytorch.tuner import Tuner  # tune\n"
        "trainer = L.Trainer(strategy='deepspeed', profiler=None, accelerator='GPU', plugins=my_plugins)\n"
        "Tuner(trainer)\n"
        "profiler = L.pytorch.profilers.XLAProfiler\n"
    )
    ported = port_code(source)
    findings = [finding.format("x.py") for finding in ported.findings]
    assert findings[0] == f"x.py:2:37: Tuner: {TUNER}"
    assert findings[1].startswith("x.py:3:21: Trainer: strategy='deepspeed': accepted values are 'auto', ")
    assert findings[2].startswith("x.py:3:77: Trainer: plugins=my_plugins: GPUlayer takes no plugins")
    assert findings[3] == f"x.py:5:12: L.pytorch.profilers.XLAProfiler: {PROFILERS}"
    assert len(findings) == 4  # profiler=None and accelerator='GPU' are accepted
    assert ported.code.splitlines()[:4] == [
        "from gpulayer.trainer import Trainer",
        f"# gpulayer port: L.pytorch.profilers.XLAProfiler: {PROFILERS}",
        "import lightning as L",
        f"# gpulayer port: Tuner: {TUNER}",
    ]
    assert port_code(ported.code).code == ported.code  # the marks are not added twice


@pytest.fixture
def project(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "model.py").write_text("from lightning.pytorch import LightningModule\n")
    (tmp_path / "src" / "pkg" / "tune.py").write_text("from lightning.pytorch.tuner import Tuner\n")
    (tmp_path / "src" / "notes.txt").write_text("not python\n")
    notebook = {
        "cells": [
            {"cell_type": "code", "source": ["%matplotlib inline\n", "import lightning as L"], "metadata": {}},
            {"cell_type": "markdown", "source": ["L.Trainer in prose"], "metadata": {}},
            {"cell_type": "code", "source": "%%bash\necho L.Trainer", "metadata": {}},
            {"cell_type": "code", "source": ["t = L.Trainer()\n", "f = L.fabric.Fabric()"], "metadata": {}},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (tmp_path / "src" / "run.ipynb").write_text(json.dumps(notebook))
    return tmp_path


def test_a_tree_is_ported_under_out_and_the_report_says_what_is_left(project, capsys):
    (project / "src" / "configs").mkdir()
    (project / "src" / "configs" / "base.yaml").write_bytes(b"trainer:\n  max_epochs: 3\n")
    (project / "src" / "data.bin").write_bytes(bytes(range(256)))
    for hidden in (".git/HEAD", "pkg/__pycache__/model.cpython-311.pyc", ".env"):
        (project / "src" / hidden).parent.mkdir(parents=True, exist_ok=True)
        (project / "src" / hidden).write_text("not copied\n")
    assert main([str(project / "src"), "--out", str(project / "ported")]) == 1
    out = project / "ported" / "src"
    assert (out / "pkg" / "model.py").read_text() == "from gpulayer.trainer import Module\n"
    assert (out / "pkg" / "tune.py").read_text() == f"# gpulayer port: Tuner: {TUNER}\n" + (
        "from lightning.pytorch.tuner import Tuner\n"
    )
    # The project's other files come along unchanged (a config naming no Lightning class too); hidden ones do not.
    assert (out / "notes.txt").read_text() == "not python\n"
    assert (out / "configs" / "base.yaml").read_bytes() == b"trainer:\n  max_epochs: 3\n"
    assert (out / "data.bin").read_bytes() == bytes(range(256))
    assert not (out / ".git").exists() and not (out / ".env").exists() and not (out / "pkg" / "__pycache__").exists()
    cells = json.loads((out / "run.ipynb").read_text())["cells"]
    fabric = registry.REGISTRY["lightning.fabric."].note
    assert cells[0]["source"] == [
        "%matplotlib inline\n",
        "from gpulayer.trainer import Trainer\n",
        f"# gpulayer port: L.fabric.Fabric: {fabric}\n",
        "import lightning as L",
    ]
    assert cells[1:3] == json.loads((project / "src" / "run.ipynb").read_text())["cells"][1:3]
    assert cells[3]["source"] == ["t = Trainer()\n", "f = L.fabric.Fabric()"]
    printed = capsys.readouterr()
    assert printed.out.splitlines() == [
        f"{project / 'src' / 'pkg' / 'tune.py'}:1:37: Tuner: {TUNER}",
        f"{project / 'src' / 'run.ipynb'}[cell 4]:2:5: L.fabric.Fabric: {fabric}",
    ]
    assert printed.err == (
        "gpulayer port: 4 files ported, 4 files written, 2 other files copied, 2 findings to do by hand\n"
    )


def test_in_place_and_check(project):
    model = project / "src" / "pkg" / "model.py"
    assert main([str(model), "--check"]) == 0
    assert model.read_text() == "from lightning.pytorch import LightningModule\n"
    assert main([str(model), "--in-place"]) == 0
    assert model.read_text() == "from gpulayer.trainer import Module\n"


def test_a_file_that_cannot_be_parsed_is_named_and_left_as_it_is(project, capsys):
    broken = project / "src" / "pkg" / "broken.py"
    broken.write_text("from lightning.pytorch import Trainer\ndef f(:\n")
    assert main([str(project / "src" / "pkg"), "--in-place"]) == 2
    assert broken.read_text() == "from lightning.pytorch import Trainer\ndef f(:\n"
    assert (project / "src" / "pkg" / "model.py").read_text() == "from gpulayer.trainer import Module\n"
    error = capsys.readouterr().err
    assert f"{broken}: cannot be parsed: Syntax Error @ 2:" in error


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["missing.py", "--check"], "missing.py: no such file or folder"),
        (
            ["src/notes.txt", "--check"],
            "src/notes.txt: not a Python file, notebook or YAML config (accepted: .py, .ipynb, .yaml, .yml or a folder)",
        ),
        (["src/bad.ipynb", "--check"], "src/bad.ipynb: a notebook must be JSON"),
        (["src", "--out", "src/pkg/out"], "--out src/pkg/out is inside the source folder src"),
    ],
)
def test_bad_input_is_refused_by_name_before_anything_is_written(project, monkeypatch, capsys, arguments, message):
    monkeypatch.chdir(project)
    (project / "src" / "bad.ipynb").write_text("{not json")
    with pytest.raises(SystemExit) as refused:
        main(["src/pkg/model.py", *arguments[:-1], "--in-place"] if "--check" in arguments else arguments)
    assert refused.value.code == 2
    assert message in capsys.readouterr().err
    assert (project / "src" / "pkg" / "model.py").read_text() == "from lightning.pytorch import LightningModule\n"
    assert not (project / "src" / "pkg" / "out").exists()


def test_the_installed_gpulayer_command_ports(tmp_path):
    """``gpulayer port`` through the entry point gpulayer-port declares (ADR 0014), as a user runs it:
    ``--check`` reports and writes nothing; without it the file is ported."""
    command = Path(sys.executable).with_name("gpulayer")
    script = tmp_path / "train.py"
    script.write_text("import lightning.pytorch as pl\n\n\nclass Net(pl.LightningModule):\n    pass\n")
    checked = subprocess.run([command, "port", script, "--check"], capture_output=True, text=True, timeout=120)
    assert (checked.returncode, checked.stdout) == (0, "")  # no finding
    assert checked.stderr == "gpulayer port: 1 file ported, nothing written (--check), 0 findings to do by hand\n"
    assert "pl.LightningModule" in script.read_text()
    ported = subprocess.run([command, "port", script, "--in-place"], capture_output=True, text=True, timeout=120)
    assert ported.returncode == 0, ported.stderr
    assert script.read_text() == "from gpulayer.trainer import Module\n\n\nclass Net(Module):\n    pass\n"


def test_each_kind_of_tensorboard_reliance_is_found():
    uses = port_code(
        "def f(self, trainer, TensorBoardLogger):\n"
        "    self.logger.experiment.add_histogram('w', self.w)\n"
        "    trainer.logger._log_graph = True\n"
        "    self.logger.log_graph(self)\n"
        "    return isinstance(trainer.logger, TensorBoardLogger)\n"
        "    self.logger.experiment.log_metrics({})\n"  # the CSV logger's experiment has this: no reliance
    ).tensorboard_uses
    assert [(use.line, use.name) for use in uses] == [
        (2, "self.logger.experiment.add_histogram"),
        (3, "trainer.logger._log_graph"),
        (4, "self.logger.log_graph"),
        (5, "isinstance(trainer.logger, TensorBoardLogger)"),
    ]


HYDRA_CONFIG = """\
# the run's Trainer, as Hydra instantiates it
trainer:
  _target_: lightning.pytorch.trainer.Trainer  # Lightning's module path
  max_epochs: 3
  profiler: simple
  model_registry: my-model
  callbacks:
    - _target_: "lightning.pytorch.callbacks.ModelCheckpoint"
      monitor: val_loss
    - _target_: lightning.pytorch.callbacks.LearningRateFinder
      min_lr: 0.0001
  logger:
    _target_: lightning.pytorch.loggers.TensorBoardLogger
    save_dir: logs
model:
  class_path: pytorch_lightning.LightningModule
data:
  _target_: my_project.data.Digits
"""


def test_a_config_names_gpulayers_classes_reports_what_is_not_adopted_and_keeps_every_other_byte(tmp_path, capsys):
    """Hydra's ``_target_`` and LightningCLI's ``class_path`` go through the registry; a Lightning Trainer's arguments
    in the config are judged by GPUlayer's Trainer; comments, quotes and the rest stay."""
    config = tmp_path / "configs" / "train.yaml"
    config.parent.mkdir()
    config.write_text(HYDRA_CONFIG)
    assert main([str(tmp_path / "configs"), "--in-place"]) == 1
    assert config.read_text() == (
        HYDRA_CONFIG.replace("lightning.pytorch.trainer.Trainer", "gpulayer.trainer.Trainer")
        .replace('"lightning.pytorch.callbacks.ModelCheckpoint"', '"gpulayer.callbacks.ModelCheckpoint"')
        .replace("pytorch_lightning.LightningModule", "gpulayer.trainer.Module")
    )
    tuner = registry.REGISTRY["lightning.pytorch.callbacks."].note
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{config}:6:3: Trainer: model_registry='my-model': ")
    assert printed[1:] == [f"{config}:10:17: lightning.pytorch.callbacks.LearningRateFinder: {tuner}"]
    assert main([str(config), "--check"]) == 1  # a second port changes nothing more, and still reports


def test_a_config_that_is_not_yaml_is_named_and_left_as_it_is(tmp_path, capsys):
    config = tmp_path / "broken.yaml"
    config.write_text("trainer: [unclosed\n")
    assert main([str(config), "--in-place"]) == 2
    assert config.read_text() == "trainer: [unclosed\n"
    assert f"{config}: cannot be parsed:" in capsys.readouterr().err


def test_known_integrations_are_named_with_their_status(tmp_path, capsys):
    """Other libraries' Lightning integrations: one that works as it is is named without a finding (exit status 0);
    one that does not is a finding, its import marked."""
    script = tmp_path / "tune.py"
    script.write_text("import optuna\nfrom optuna_integration import PyTorchLightningPruningCallback\n")
    assert main([str(script), "--check"]) == 0
    printed = capsys.readouterr()
    optuna_note = registry.INTEGRATIONS["optuna_integration.PyTorchLightningPruningCallback"].note
    assert printed.out == f"{script}:2:32: PyTorchLightningPruningCallback: {optuna_note}\n"
    assert printed.err.endswith("0 findings to do by hand, 1 note\n")
    script.write_text("from ray.tune.integration.pytorch_lightning import TuneReportCheckpointCallback\n")
    assert main([str(script), "--check"]) == 0
    tune_note = registry.INTEGRATIONS["ray.tune.integration.pytorch_lightning."].note
    assert capsys.readouterr().out == f"{script}:1:52: TuneReportCheckpointCallback: {tune_note}\n"
    script.write_text("from ray.train.lightning import RayDDPStrategy, prepare_trainer\nimport ray.train.lightning\n")
    assert main([str(script), "--in-place"]) == 1
    ray = registry.INTEGRATIONS["ray.train.lightning."].note
    assert capsys.readouterr().out.splitlines() == [
        f"{script}:1:33: RayDDPStrategy: {ray}",
        f"{script}:1:49: prepare_trainer: {ray}",
        f"{script}:2:8: ray.train.lightning: {ray}",
    ]
    assert script.read_text().startswith(f"# gpulayer port: RayDDPStrategy: {ray}\n")


@pytest.mark.parametrize("name", ["ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_spawn_find_unused_parameters_true"])
def test_lightnings_started_ddp_names_port_unchanged(name):
    source = (
        "import lightning as L\n"
        f"trainer = L.Trainer(strategy={name!r}, devices=2, accelerator='cpu')\n"
        "notebook = L.Trainer(strategy=L.pytorch.strategies.DDPStrategy(start_method='fork'), devices=2)\n"
    )
    ported = port_code(source)
    assert ported.findings == []
    assert ported.code == (
        "from gpulayer.trainer import DDPStrategy, Trainer\n"
        f"trainer = Trainer(strategy={name!r}, devices=2, accelerator='cpu')\n"
        "notebook = Trainer(strategy=DDPStrategy(start_method='fork'), devices=2)\n"
    )
