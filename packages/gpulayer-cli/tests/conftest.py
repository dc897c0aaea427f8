"""One project written twice, on Lightning 2.6's classes and on GPUlayer's, importable by class path, and a runner
that calls each framework's LightningCLI in this process with the same arguments."""

import textwrap
import warnings

import pytest

PROJECT = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
{imports}


class Regressor({module}):
    """A linear regressor.

    Args:
        width: Inputs per sample.
        lr: The SGD learning rate.
    """

    def __init__(self, width: int = 4, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class DeepRegressor(Regressor):
    """A regressor with a hidden layer.

    Args:
        hidden: Hidden units.
    """

    def __init__(self, width: int = 4, lr: float = 0.05, hidden: int = 8):
        super().__init__(width, lr)
        self.layer = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


class Numbers({datamodule}):
    """Random regression data.

    Args:
        batch_size: Samples per batch.
        samples: How many samples.
    """

    def __init__(self, batch_size: int = 4, samples: int = 24):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.data = TensorDataset(
            torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator)
        )
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=8)

    def test_dataloader(self):
        return DataLoader(self.data, batch_size=8)

    def predict_dataloader(self):
        return DataLoader(self.data, batch_size=8)


class SavedNumbers(Numbers):
    """Random regression data that saves its hyperparameters."""

    def __init__(self, batch_size: int = 4, samples: int = 24):
        super().__init__(batch_size, samples)
        self.save_hyperparameters()
'''

FRAMEWORKS = {
    "lightning": (
        "from lightning.pytorch import LightningModule, LightningDataModule",
        "LightningModule",
        "LightningDataModule",
    ),
    "gpulayer": ("from gpulayer.trainer import Module, DataModule", "Module", "DataModule"),
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """Writes ``lightning_project.py`` and ``gpulayer_project.py`` and returns a runner: ``run(framework, args,
    **cli_options)`` builds that framework's LightningCLI on them in ``tmp_path/framework`` and returns it."""
    pytest.importorskip("lightning.pytorch.cli")
    for name, (imports, module, datamodule) in FRAMEWORKS.items():
        source = PROJECT.format(imports=imports, module=module, datamodule=datamodule)
        (tmp_path / f"{name}_project.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("sys.argv", ["train.py"])

    def run(framework, args, model="Regressor", data="Numbers", **options):
        import importlib

        module = importlib.import_module(f"{framework}_project")
        if framework == "lightning":
            from lightning.pytorch.cli import LightningCLI
        else:
            from gpulayer.cli import LightningCLI
        folder = tmp_path / framework
        folder.mkdir(exist_ok=True)
        monkeypatch.chdir(folder)
        model_class = getattr(module, model) if model else None
        data_class = getattr(module, data) if data else None
        quiet = {"enable_progress_bar": False, "enable_model_summary": False}
        options["trainer_defaults"] = quiet | options.get("trainer_defaults", {})
        options.setdefault("seed_everything_default", 1)  # True seeds 0 with a warning, under both
        if framework == "gpulayer":  # warnings are errors in the suite: GPUlayer's CLI warns of nothing here
            return LightningCLI(model_class, data_class, args=args, **options)
        with warnings.catch_warnings():  # Lightning's tips and its calls that jsonargparse deprecates
            warnings.simplefilter("ignore")
            return LightningCLI(model_class, data_class, args=args, **options)

    return run
