"""Each misuse below raises, or warns, under GPUlayer an exception of the type Lightning 2.6 raises for it, so a
ported script's ``except`` (or warning filter) keeps working; and under manual optimization the schedulers are taken
as returned, as Lightning's ``_configure_schedulers_manual_opt`` takes them."""

import tempfile
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning


def _loader():
    return DataLoader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), batch_size=4)


class _NoStep:
    """A scheduler with state but no ``step``: not PyTorch's LRScheduler API."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _module(framework, manual=False, schedulers=None, **hooks):
    base = gl.Module if framework is gl else framework.LightningModule

    class Regressor(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).sum()
            if manual:
                self.manual_backward(loss)
                return None
            return loss

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return optimizer if schedulers is None else ([optimizer], [schedulers(optimizer)])

    for name, hook in hooks.items():
        setattr(Regressor, name, hook)
    return Regressor()


def _trainer(framework, **arguments):
    extra = {} if framework is gl else {"enable_progress_bar": False, "enable_model_summary": False}
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tempfile.mkdtemp())
    return framework.Trainer(**(options | {"max_epochs": 1} | arguments), **extra)


def _fit(framework, module, datamodule=None, loaders=None, **arguments):
    if loaders is None:
        loaders = {"datamodule": datamodule} if datamodule is not None else {"train_dataloaders": _loader()}
    _trainer(framework, **arguments).fit(module, **loaders)


def _step_with_index(self, batch, batch_idx, dataloader_idx=0):
    return self.layer(batch[0]).sum()


def _clashing_hyperparameters(framework):
    """A module and a DataModule that both save ``width``, with different values, under a logger."""
    module_base = gl.Module if framework is gl else framework.LightningModule
    data_base = gl.DataModule if framework is gl else framework.LightningDataModule

    class Wide(module_base):
        def __init__(self, width=1):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(data_base):
        def __init__(self, width=2):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return _loader()

    logger = (gl if framework is gl else framework.loggers).CSVLogger(tempfile.mkdtemp())
    _fit(framework, Wide(), datamodule=Data(), logger=logger)


MISUSES = {
    "self.log in on_fit_start": (
        lambda f: _fit(f, _module(f, on_fit_start=lambda self: self.log("x", 1.0))),
        "MisconfigurationException",
        RuntimeError,
    ),
    "save_checkpoint without a model": (
        lambda f: _trainer(f).save_checkpoint(tempfile.mktemp()),
        AttributeError,
        None,
    ),
    "a scheduler without step": (
        lambda f: _fit(f, _module(f, schedulers=_NoStep)),
        "MisconfigurationException",
        TypeError,
    ),
    "the module and the DataModule save different values": (_clashing_hyperparameters, RuntimeError, ValueError),
    "a batch hook without dataloader_idx under two loaders": (
        lambda f: _trainer(f).validate(
            _module(f, validation_step=_step_with_index, on_validation_batch_end=lambda self, out, batch, i: None),
            [_loader(), _loader()],
        ),
        RuntimeError,
        None,
    ),
    "a batch hook requiring dataloader_idx under one loader": (
        lambda f: _trainer(f).test(
            _module(f, test_step=_step_with_index, on_test_batch_start=lambda self, batch, i, dataloader_idx: None),
            _loader(),
        ),
        RuntimeError,
        None,
    ),
    "predict_step set to None": (
        lambda f: _trainer(f).predict(_module(f, predict_step=None), _loader()),
        "MisconfigurationException",
        TypeError,
    ),
    "predict with neither predict_step nor forward": (
        lambda f: _trainer(f).predict(_module(f), _loader()),
        "MisconfigurationException",
        NotImplementedError,
    ),
    "an undefined DataModule loader called directly": (
        lambda f: (gl.DataModule if f is gl else f.LightningDataModule)().val_dataloader(),
        "MisconfigurationException",
        NotImplementedError,
    ),
    "train_dataloader() returning None": (
        lambda f: _fit(f, _module(f, train_dataloader=lambda self: None), datamodule=None, loaders={}),
        TypeError,
        None,
    ),
    "a loader that is not iterable": (
        lambda f: _trainer(f).validate(_module(f, validation_step=_step_with_index), 5),
        TypeError,
        None,
    ),
}


@pytest.mark.parametrize("misuse", MISUSES)
def test_a_misuse_raises_lightnings_type(misuse):
    """And, where GPUlayer raised a builtin type before, still that type (its message stays GPUlayer's)."""
    act, raised, kept = MISUSES[misuse]
    with warnings.catch_warnings():
        pl = quiet_lightning()
        with pytest.raises(Exception) as lightning:
            act(pl)
        with pytest.raises(Exception) as ours:
            act(gl)
    named = isinstance(raised, str)  # Lightning's MisconfigurationException, under each framework's own class
    assert isinstance(lightning.value, getattr(pl.utilities.exceptions, raised) if named else raised)
    assert isinstance(ours.value, getattr(gl, raised) if named else raised), (misuse, ours.value)
    assert kept is None or isinstance(ours.value, kept)


def test_a_scheduler_with_its_own_lr_scheduler_step_is_accepted():
    def lr_scheduler_step(self, scheduler, metric):
        pass

    with warnings.catch_warnings():
        pl = quiet_lightning()
        for framework in (pl, gl):
            module = _module(framework, schedulers=_NoStep, lr_scheduler_step=lr_scheduler_step)
            _fit(framework, module, max_steps=1)


def test_max_epochs_unset_is_a_possible_user_warning():
    def on_train_start(self):
        self.trainer.should_stop = True

    with warnings.catch_warnings():
        pl = quiet_lightning()
    for framework, category in ((pl, pl.utilities.warnings.PossibleUserWarning), (gl, gl.PossibleUserWarning)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _fit(framework, _module(framework, on_train_start=on_train_start), max_epochs=None)
        assert any(w.category is category and "max_epochs" in str(w.message) for w in caught), framework


@pytest.mark.parametrize(
    "schedulers",
    [
        lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o),
        lambda o: {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o), "monitor": "nope", "strict": True},
    ],
    ids=["plateau", "plateau dict"],
)
def test_manual_optimization_takes_schedulers_as_returned(schedulers):
    """No monitor needed, an unlogged one not refused: the module steps its schedulers; the dict's ``monitor`` and
    ``strict`` are dropped with Lightning's warning."""
    warned = {}
    with warnings.catch_warnings():
        pl = quiet_lightning()
        for framework in (pl, gl):
            trainer = _trainer(framework, max_epochs=2)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer.fit(_module(framework, manual=True, schedulers=schedulers), _loader())
            warned[framework] = [str(w.message) for w in caught if "will be ignored" in str(w.message)]
            (config,) = trainer.lr_scheduler_configs
            assert (config.monitor, config.strict, config.reduce_on_plateau) == (None, True, False)
    assert warned[gl] == warned[pl]
