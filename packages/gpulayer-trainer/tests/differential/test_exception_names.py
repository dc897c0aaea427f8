"""A ported script catches GPUlayer's errors under Lightning's names: each misuse below raises, under Lightning 2.6,
a ``MisconfigurationException`` (or a builtin type), and under GPUlayer an exception of that name too."""

import tempfile
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning


def _loader():
    return DataLoader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), batch_size=4)


class _Stream(IterableDataset):
    def __iter__(self):
        return iter([(torch.ones(2), torch.ones(1))] * 8)


def _module(framework, step=None, optimizers=None, without=()):
    base = gl.Module if framework is gl else framework.LightningModule

    class Regressor(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            if step is not None:
                return step(self, batch)
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            pass

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return optimizer if optimizers is None else optimizers(optimizer)

    for name in without:
        setattr(Regressor, name, getattr(base, name))
    return Regressor()


def _trainer(framework, **arguments):
    extra = {} if framework is gl else {"enable_progress_bar": False, "enable_model_summary": False}
    root = tempfile.mkdtemp()
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, max_epochs=1, default_root_dir=root)
    return framework.Trainer(**options, **extra, **arguments)


def _fit(framework, trainer=None, module=None, **loaders):
    loaders = {"train_dataloaders": _loader()} | loaders
    (trainer or _trainer(framework)).fit(module or _module(framework), **loaders)


def _scheduled(scheduler):
    return lambda optimizer: {"optimizer": optimizer, "lr_scheduler": scheduler(optimizer)}


def _logging(**log_options):
    def step(self, batch):
        self.log(**log_options)
        return self.layer(batch[0]).sum()

    return step


MISUSES = {
    "devices=0": lambda f: _trainer(f, devices=0),
    "limit_train_batches=1.5": lambda f: _trainer(f, limit_train_batches=1.5),
    "limit_val_batches=-1": lambda f: _trainer(f, limit_val_batches=-1),
    "fast_dev_run=-1": lambda f: _trainer(f, fast_dev_run=-1),
    "check_val_every_n_epoch=1.5": lambda f: _trainer(f, check_val_every_n_epoch=1.5),
    "a fractional interval without epochs": lambda f: _trainer(f, check_val_every_n_epoch=None, val_check_interval=0.5),
    "reload_dataloaders_every_n_epochs=-1": lambda f: _trainer(f, reload_dataloaders_every_n_epochs=-1),
    "gradient_clip_algorithm='max'": lambda f: _trainer(f, gradient_clip_algorithm="max"),
    "val_check_interval='1:2'": lambda f: _trainer(f, val_check_interval="1:2"),
    "max_epochs=-2": lambda f: _trainer(f, max_epochs=-2),
    "max_steps=-2": lambda f: _trainer(f, max_steps=-2),
    "profiler='bogus'": lambda f: _trainer(f, profiler="bogus"),
    "no training_step": lambda f: _fit(f, module=_module(f, without=["training_step"])),
    "no configure_optimizers": lambda f: _fit(f, module=_module(f, without=["configure_optimizers"])),
    "configure_optimizers returns a str": lambda f: _fit(f, module=_module(f, optimizers=lambda o: "adam")),
    "a scheduler dict without 'scheduler'": lambda f: _fit(
        f, module=_module(f, optimizers=_scheduled(lambda o: {"interval": "step"}))
    ),
    "interval='bogus'": lambda f: _fit(
        f,
        module=_module(
            f, optimizers=_scheduled(lambda o: {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "interval": "x"})
        ),
    ),
    "ReduceLROnPlateau without a monitor": lambda f: _fit(
        f, module=_module(f, optimizers=_scheduled(torch.optim.lr_scheduler.ReduceLROnPlateau))
    ),
    "ReduceLROnPlateau monitoring an unlogged name": lambda f: _fit(
        f,
        module=_module(
            f,
            optimizers=_scheduled(
                lambda o: {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o), "monitor": "nope"}
            ),
        ),
    ),
    "reduce_fx='bogus'": lambda f: _fit(f, module=_module(f, step=_logging(name="x", value=1.0, reduce_fx="bogus"))),
    "a name holding /dataloader_idx_": lambda f: _fit(
        f, module=_module(f, step=_logging(name="x/dataloader_idx_0", value=1.0))
    ),
    "training_step returns a dict without 'loss'": lambda f: _fit(
        f, module=_module(f, step=lambda self, batch: {"x": self.layer(batch[0]).sum()})
    ),
    "training_step returns a str": lambda f: _fit(f, module=_module(f, step=lambda self, batch: "loss")),
    "a datamodule and loaders": lambda f: _fit(f, datamodule=(gl.DataModule if f is gl else f.LightningDataModule)()),
    "limit_val_batches=0.1 of 4 batches": lambda f: _fit(
        f, trainer=_trainer(f, limit_val_batches=0.1), val_dataloaders=_loader()
    ),
    "limit_train_batches=0.5 of a stream": lambda f: _fit(
        f, trainer=_trainer(f, limit_train_batches=0.5), train_dataloaders=DataLoader(_Stream(), batch_size=2)
    ),
    "val_check_interval=0.5 of a stream": lambda f: _fit(
        f,
        trainer=_trainer(f, val_check_interval=0.5),
        train_dataloaders=DataLoader(_Stream(), batch_size=2),
        val_dataloaders=_loader(),
    ),
    "predict without data": lambda f: _trainer(f).predict(_module(f)),
    "validate without a model": lambda f: _trainer(f).validate(),
}


def _raised(framework, misuse) -> BaseException:
    with pytest.raises(Exception) as raised:
        MISUSES[misuse](framework)
    return raised.value


@pytest.mark.parametrize("misuse", list(MISUSES))
def test_the_exception_is_catchable_under_lightnings_name(misuse):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        from lightning.pytorch.utilities.exceptions import MisconfigurationException

        theirs = _raised(pl, misuse)
    ours = _raised(gl, misuse)
    if isinstance(theirs, MisconfigurationException):
        assert isinstance(ours, gl.MisconfigurationException), repr(ours)
    else:
        assert isinstance(ours, type(theirs)), (repr(theirs), repr(ours))
