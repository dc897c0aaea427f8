"""Misuse that Lightning refuses while running: GPUlayer refuses it at the same point, with the same hooks run
before it and the same exception path (callbacks' and the data module's on_exception; no teardown, no
on_fit_end). Only the fact of the error is compared, not its type or message.
"""

import pytest
import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR


def returning_a_float(self, batch, batch_idx):
    return float(self.loss(batch))


def returning_a_dict_without_loss(self, batch, batch_idx):
    return {"value": self.loss(batch)}


def failing_at_epoch_1_batch_1(self, batch, batch_idx):
    if (self.current_epoch, batch_idx) == (1, 1):
        raise RuntimeError("user error")
    return self.loss(batch)


def logging_twice_with_different_options(self, batch, batch_idx):
    loss = self.loss(batch)
    self.log("twice", loss, on_epoch=True)
    self.log("twice", loss, on_epoch=False)
    return loss


def logging_with_an_unknown_reduction(self, batch, batch_idx):
    loss = self.loss(batch)
    self.log("value", loss, on_epoch=True, reduce_fx="median")
    return loss


def logging_a_vector(self, batch, batch_idx):
    loss = self.loss(batch)
    self.log("vector", torch.ones(2))
    return loss


def logging_in_on_fit_start(self):
    self.log("not_here", 1.0)


def logging_on_step_in_on_train_epoch_start(self):
    self.log("not_on_step", 1.0, on_step=True)


def logging_in_predict_step(self, batch, batch_idx, dataloader_idx=0):
    self.log("not_in_predict", 1.0)
    return self(batch[0])


def validation_step_requiring_dataloader_idx(self, batch, batch_idx, dataloader_idx):
    self.log("val_loss", self.loss(batch))


def validation_step_without_dataloader_idx(self, batch, batch_idx):
    self.log("val_loss", self.loss(batch))


def training_epoch_end(self, outputs):
    """Removed in Lightning 2.0: defining it is an error."""


MODULE_MISUSE = {
    "training_step returns a float": {"training_step": returning_a_float},
    "training_step returns a dict without loss": {"training_step": returning_a_dict_without_loss},
    "training_step raises at epoch 1 batch 1": {"training_step": failing_at_epoch_1_batch_1},
    "the same key logged twice with different options": {"training_step": logging_twice_with_different_options},
    "an unknown reduce_fx": {"training_step": logging_with_an_unknown_reduction},
    "a logged vector": {"training_step": logging_a_vector},
    "logging in on_fit_start": {"on_fit_start": logging_in_on_fit_start},
    "logging on_step in on_train_epoch_start": {"on_train_epoch_start": logging_on_step_in_on_train_epoch_start},
    "one val loader, dataloader_idx required": {"validation_step": validation_step_requiring_dataloader_idx},
    "training_epoch_end defined": {"training_epoch_end": training_epoch_end},
}


@pytest.mark.parametrize("misuse", MODULE_MISUSE)
@pytest.mark.parametrize("data_source", ["module", "datamodule"])
def test_module_misuse_during_fit(differential, misuse, data_source):
    differential(module=MODULE_MISUSE[misuse], data_source=data_source, expect_error=True)


def test_two_val_loaders_and_no_dataloader_idx_parameter(differential):
    differential(
        val_sizes=(6, 3), module={"validation_step": validation_step_without_dataloader_idx}, expect_error=True
    )


def test_logging_in_predict_step(differential):
    differential(stages=("predict",), module={"predict_step": logging_in_predict_step}, expect_error=True)


OPTIMIZER_MISUSE = {
    "two optimizers in automatic optimization": lambda m: [m.sgd(), m.sgd()],
    "plateau without a monitor": lambda m: {"optimizer": (o := m.sgd()), "lr_scheduler": ReduceLROnPlateau(o)},
    "plateau in a config with only a top-level monitor": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {"scheduler": ReduceLROnPlateau(o)},
        "monitor": "train_loss",
    },
    "plateau monitoring a missing metric, strict": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {"scheduler": ReduceLROnPlateau(o), "monitor": "missing"},
    },
    "an unknown scheduler interval": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {"scheduler": StepLR(o, 1), "interval": "batch"},
    },
    "a dict without optimizer": lambda m: {"lr_scheduler": StepLR(m.sgd(), 1)},
}


@pytest.mark.parametrize("misuse", OPTIMIZER_MISUSE)
def test_configure_optimizers_misuse(differential, misuse):
    differential(configure_optimizers=OPTIMIZER_MISUSE[misuse], expect_error=True)


@pytest.mark.parametrize(
    "trainer",
    [
        dict(max_epochs=1, val_check_interval=4),  # more than the 3 training batches
        dict(max_epochs=1, limit_train_batches=0.1),  # int(3 * 0.1) = 0 batches from a fraction > 0
        dict(max_epochs=1, limit_val_batches=0.1),
    ],
    ids=lambda value: str(value),
)
def test_limits_that_only_fail_once_the_loaders_are_known(differential, trainer):
    differential(trainer=trainer, expect_error=True)


@pytest.mark.parametrize("arguments", [dict(accumulate_grad_batches=0), dict(check_val_every_n_epoch=0)])
def test_zero_divisors_are_refused_before_running(run, arguments):
    """DELIBERATE DEVIATION: Lightning accepts these and fails with ZeroDivisionError at run time (the ``%`` in
    ``_TrainingEpochLoop._accumulated_batches_reached`` and ``_should_check_val_epoch``); GPUlayer refuses them at
    Trainer(...). Both refuse; only the moment differs, so the records differ."""
    lightning = run("lightning", trainer=dict(max_epochs=1, **arguments), expect_error=True)
    assert lightning.raised and lightning.hooks["fit"]  # hooks ran before Lightning's ZeroDivisionError
    with pytest.raises(ValueError, match=next(iter(arguments))):
        run("gpulayer", trainer=dict(max_epochs=1, **arguments))
