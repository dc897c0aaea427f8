"""``gpulayer port``'s report of names it cannot move or need not: libraries that build Lightning's Trainer
themselves, Lightning's typing aliases, and a config's interpolated Trainer values (issue 48)."""

import subprocess
import sys

import pytest

from gpulayer.port import registry
from gpulayer.port.cli import main

# One script per library the registry says builds Lightning's Trainer itself: how the library is imported to train.
OWN_TRAINER_SCRIPTS = {
    "pytorch_tabular": "from pytorch_tabular import TabularModel\n",
    "darts": "from darts.models import NBEATSModel, TFTModel\n",
    "neuralforecast": "from neuralforecast.models import NHITS\n",
    "anomalib.engine": "from anomalib.engine import Engine\n",
    "scvi": "import scvi\n",
    "gluonts.torch": "from gluonts.torch import DeepAREstimator\n",
    "autogluon.multimodal": "from autogluon.multimodal import MultiModalPredictor\n",
    "autogluon.timeseries": "import autogluon.timeseries as agts\n",
}


def test_each_library_that_builds_lightnings_trainer_itself_is_tested():
    assert set(OWN_TRAINER_SCRIPTS) == set(registry.OWN_TRAINER_LIBRARIES)


@pytest.mark.parametrize("library", sorted(OWN_TRAINER_SCRIPTS))
def test_a_library_that_builds_lightnings_trainer_itself_is_named_at_its_import(library, tmp_path, capsys):
    """issue 48: the script has no Trainer to rewrite; the library, not installed here, is named once at each import
    of it, and the import is marked."""
    script = tmp_path / "train.py"
    imports = OWN_TRAINER_SCRIPTS[library]
    script.write_text(f"import lightning as L\n{imports}\n\nclass Net(L.LightningModule):\n    pass\n")
    assert main([str(script), "--in-place"]) == 1
    column = imports.index(" import ") + 9 if imports.startswith("from") else 8
    note = "builds Lightning's Trainer inside the library: this project stays on Lightning"
    assert capsys.readouterr().out == f"{script}:2:{column}: {library}: {note}\n"
    assert f"# gpulayer port: {library}: {note}\n{imports}" in script.read_text()


def test_a_library_whose_models_the_users_trainer_fits_is_not_named_as_staying_on_lightning(tmp_path, capsys):
    """pytorch_forecasting's and anomalib's models are LightningModules the script's own Trainer fits: that Trainer is
    ported, and pytorch_forecasting, whose models a test fits under both trainers, is named as working (ADR 0031);
    GluonTS's MXNet models need no Trainer."""
    script = tmp_path / "train.py"
    script.write_text(
        "from pytorch_forecasting import TemporalFusionTransformer\nfrom anomalib.models import Padim\n"
        "from gluonts.mx import Trainer\n"
    )
    assert main([str(script), "--check"]) == 0
    note = registry.INTEGRATIONS["pytorch_forecasting."].note
    assert capsys.readouterr().out == f"{script}:1:33: TemporalFusionTransformer: {note}\n"
    assert note.startswith("works as it is: its models are built on Lightning's LightningModule")


def test_lightnings_typing_aliases_are_named_as_working(tmp_path, capsys):
    """issue 48: ``STEP_OUTPUT``, ``OptimizerLRScheduler`` and the rest of ``lightning.pytorch.utilities.types``'s
    aliases only annotate: the import stays, named as working, and the module they annotate trains under GPUlayer."""
    script = tmp_path / "net.py"
    script.write_text(
        "import torch\n"
        "from lightning.pytorch import LightningModule, Trainer\n"
        "from pytorch_lightning.utilities.types import EVAL_DATALOADERS, STEP_OUTPUT, TRAIN_DATALOADERS\n"
        "from lightning.pytorch.utilities.types import OptimizerLRScheduler\n\n\n"
        "class Net(LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layer = torch.nn.Linear(2, 1)\n\n"
        "    def training_step(self, batch, batch_idx) -> STEP_OUTPUT:\n"
        "        return self.layer(batch).sum()\n\n"
        "    def train_dataloader(self) -> TRAIN_DATALOADERS:\n"
        "        return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)\n\n"
        "    def val_dataloader(self) -> EVAL_DATALOADERS:\n"
        "        return []\n\n"
        "    def configure_optimizers(self) -> OptimizerLRScheduler:\n"
        "        return torch.optim.SGD(self.parameters(), lr=0.1)\n\n\n"
        "trainer = Trainer(max_steps=2, logger=False, enable_checkpointing=False, accelerator='cpu')\n"
        "trainer.fit(Net())\n"
        "assert type(trainer).__module__.startswith('gpulayer') and trainer.global_step == 2\n"
    )
    assert main([str(script), "--in-place"]) == 0
    printed = capsys.readouterr()
    works = registry.REGISTRY["lightning.pytorch.utilities.types.STEP_OUTPUT"].note
    assert [line.split(": ", 2)[1:] for line in printed.out.splitlines()] == [
        [name, works] for name in ("EVAL_DATALOADERS", "STEP_OUTPUT", "TRAIN_DATALOADERS", "OptimizerLRScheduler")
    ]
    assert "from lightning.pytorch.utilities.types import OptimizerLRScheduler\n" in script.read_text()
    ran = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr


INTERPOLATED = """\
strategy: ddp
devices: 2
trainer:
  _target_: lightning.pytorch.Trainer
  strategy: ${strategy}
  devices: ${devices}
  accelerator: ${oc.env:ACCELERATOR}
  precision: ${..precision}
"""


def test_a_configs_interpolation_is_judged_by_the_key_it_names_or_said_to_be_unjudged(tmp_path, capsys):
    """issue 48: ``${strategy}`` names a top-level key of the same file: its value is judged (``ddp`` accepted,
    ``deepspeed`` refused); a resolver or a relative interpolation is named as one the port cannot judge."""
    config = tmp_path / "train.yaml"
    config.write_text(INTERPOLATED)
    assert main([str(config), "--check"]) == 0
    unjudged = (
        "an interpolation the port cannot judge (it names no plain value of this file); GPUlayer's Trainer judges "
        "the resolved value when the config is instantiated"
    )
    printed = capsys.readouterr()
    assert printed.out.splitlines() == [
        f"{config}:7:3: Trainer: accelerator=${{oc.env:ACCELERATOR}}: {unjudged}",
        f"{config}:8:3: Trainer: precision=${{..precision}}: {unjudged}",
    ]
    assert printed.err.endswith("0 findings to do by hand, 2 notes\n")
    config.write_text(INTERPOLATED.replace("strategy: ddp", "strategy: deepspeed"))
    assert main([str(config), "--check"]) == 1
    assert (
        capsys.readouterr()
        .out.splitlines()[0]
        .startswith(f"{config}:5:3: Trainer: ${{strategy}}: strategy='deepspeed': accepted values are 'auto'")
    )
