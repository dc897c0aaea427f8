"""Automatic optimization: accumulation, clipping, precision, configure_optimizers forms, scheduler step points
and what training_step may return. Learning rates seen by every training_step are part of each record.
"""

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau, StepLR


@pytest.mark.parametrize("accumulate", [1, 2, 3])
@pytest.mark.parametrize("train_size", [10, 20], ids=["3-batches", "5-batches"])
def test_accumulate_grad_batches(differential, accumulate, train_size):
    """Steps after every k-th batch and on the last batch (the incomplete window, loss still divided by k)."""
    both = differential(trainer=dict(max_epochs=2, accumulate_grad_batches=accumulate), train_size=train_size)
    batches = -(-train_size // 4)
    steps_per_epoch = -(-batches // accumulate)
    assert both.lightning.counters["fit"] == (2 * steps_per_epoch, 2)


def test_accumulation_global_step_sequence(differential):
    """5 batches, k=2: global_step seen by each training_step is 0,1,1,2,3 | 3,4,4,5,6 after the batch (Lightning's
    ``_TrainingEpochLoop._should_accumulate``: an epoch's last batch always steps)."""
    both = differential(trainer=dict(max_epochs=2, accumulate_grad_batches=2), train_size=20)
    seen = [step for stage, _, _, step in both.lightning.calls if stage == "train"]
    assert seen == [0, 0, 1, 1, 2, 3, 3, 4, 4, 5]


def record_gradient_norm(self, trainer, pl_module, optimizer):
    """Callback on_before_optimizer_step: the gradient norm it sees (unclipped in Lightning)."""
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in pl_module.parameters()]))
    pl_module.record("gradient norm before step", float(norm))


@pytest.mark.parametrize(
    "clipping",
    [
        dict(gradient_clip_val=0.05),  # algorithm defaults to "norm"
        dict(gradient_clip_val=0.05, gradient_clip_algorithm="norm"),
        dict(gradient_clip_val=0.02, gradient_clip_algorithm="value"),
        dict(gradient_clip_val=0.05, gradient_clip_algorithm="norm", accumulate_grad_batches=2),
        dict(gradient_clip_val=0, gradient_clip_algorithm="value"),  # 0: no clipping
    ],
    ids=lambda value: str(value),
)
def test_gradient_clipping(differential, clipping):
    differential(trainer=dict(max_epochs=2, **clipping), callback={"on_before_optimizer_step": record_gradient_norm})


def record_dtypes(self, batch, batch_idx):
    """training_step recording the dtypes of the input and of the forward output."""
    x, y = batch
    output = self(x)
    self.record("dtypes", (str(x.dtype), str(output.dtype)))
    loss = torch.nn.functional.mse_loss(output.float(), y.to(output.dtype).float())
    self.log("train_loss", loss)
    return loss


@pytest.mark.parametrize(
    ("precision", "resolved", "warns"),
    [
        ("32-true", "32-true", False),
        (32, "32-true", False),
        ("bf16-mixed", "bf16-mixed", False),
        ("64-true", "64-true", False),
        ("64", "64-true", False),
        ("16-mixed", "bf16-mixed", True),  # on CPU Lightning warns and uses bf16-mixed
        (16, "bf16-mixed", True),
    ],
    ids=lambda value: repr(value),
)
def test_precision(differential, precision, resolved, warns):
    both = differential(
        trainer=dict(max_epochs=2, precision=precision),
        stages=("fit", "validate", "predict"),
        module={"training_step": record_dtypes},
        documented_warning=warns,
    )
    assert both.lightning.precision == resolved


# configure_optimizers forms. Each takes the module; `module.sgd()` builds an SGD the harness can read lrs from.
OPTIMIZER_FORMS = {
    "optimizer": lambda m: m.sgd(),
    "list": lambda m: [m.sgd()],
    "tuple of one": lambda m: (m.sgd(),),
    "dict without scheduler": lambda m: {"optimizer": m.sgd()},
    "lists of optimizers and schedulers": lambda m: ([o := m.sgd()], [StepLR(o, step_size=1, gamma=0.5)]),
    "list of optimizers and one scheduler": lambda m: ([o := m.sgd()], StepLR(o, step_size=1, gamma=0.5)),
    "dict with a scheduler": lambda m: {"optimizer": (o := m.sgd()), "lr_scheduler": StepLR(o, 1, gamma=0.5)},
    "list with one dict": lambda m: [{"optimizer": (o := m.sgd()), "lr_scheduler": StepLR(o, 1, gamma=0.5)}],
    "scheduler config, epoch interval": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {"scheduler": StepLR(o, 1, gamma=0.5), "interval": "epoch"},
    },
    "scheduler config, epoch interval, frequency 2": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {"scheduler": StepLR(o, 1, gamma=0.5), "interval": "epoch", "frequency": 2, "name": "lr"},
    },
    "scheduler config, step interval": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {"scheduler": LambdaLR(o, lambda step: 0.8**step), "interval": "step"},
    },
    "scheduler config, step interval, frequency 2": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {"scheduler": StepLR(o, 1, gamma=0.5), "interval": "step", "frequency": 2},
    },
    "plateau with top-level monitor": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": ReduceLROnPlateau(o, factor=0.5, patience=0),
        "monitor": "train_loss",
    },
    "plateau config on a validation metric": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {
            "scheduler": ReduceLROnPlateau(o, mode="max", factor=0.5, patience=0),
            "monitor": "val_loss",
            "strict": True,
            "name": "plateau",
        },
    },
    "plateau config, step interval": lambda m: {
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {
            "scheduler": ReduceLROnPlateau(o, mode="max", factor=0.5, patience=0),
            "monitor": "train_loss",
            "interval": "step",
        },
    },
}


@pytest.mark.parametrize("form", OPTIMIZER_FORMS)
def test_configure_optimizers_forms_and_scheduler_step_points(differential, form):
    """Hook traces show when lr_scheduler_step runs; learning_rates shows what each training_step saw."""
    differential(trainer=dict(max_epochs=3), configure_optimizers=OPTIMIZER_FORMS[form])


def test_plateau_scheduler_with_a_missing_monitor_and_strict_false_is_skipped(differential):
    """strict=False: Lightning warns that the monitor is missing and does not step the scheduler."""
    form = lambda m: {  # noqa: E731
        "optimizer": (o := m.sgd()),
        "lr_scheduler": {"scheduler": ReduceLROnPlateau(o, patience=0), "monitor": "missing", "strict": False},
    }
    differential(trainer=dict(max_epochs=2), configure_optimizers=form, documented_warning=True)


def test_step_scheduler_with_accumulation_steps_only_on_optimizer_steps(differential):
    differential(
        trainer=dict(max_epochs=2, accumulate_grad_batches=2),
        train_size=20,
        configure_optimizers=OPTIMIZER_FORMS["scheduler config, step interval"],
    )


def returning_dict(self, batch, batch_idx):
    loss = self.loss(batch)
    return {"loss": loss, "double": 2 * loss.detach(), "batch_idx": batch_idx}


def returning_none_on_odd_batches(self, batch, batch_idx):
    loss = self.loss(batch)
    return None if batch_idx % 2 else loss


@pytest.mark.parametrize(
    ("training_step", "warns"),
    [(returning_dict, False), (returning_none_on_odd_batches, True)],
    ids=["dict with loss", "None"],
)
@pytest.mark.parametrize("accumulate", [1, 2])
def test_training_step_return_values(differential, training_step, warns, accumulate):
    """Dict extras reach on_train_batch_end; None skips backward but still counts a step (Lightning warns)."""
    both = differential(
        trainer=dict(max_epochs=2, accumulate_grad_batches=accumulate),
        module={"training_step": training_step},
        documented_warning=warns,
    )
    assert both.lightning.counters["fit"][0] == 2 * -(-3 // accumulate)


def recording_loss(self, batch, batch_idx):
    loss = self.loss(batch)
    self.record("loss", float(loss))
    return loss


def test_accumulated_loss_reaches_on_train_batch_end_divided(differential):
    """outputs["loss"] in on_train_batch_end is the training_step loss divided by accumulate_grad_batches (Lightning's
    ``_AutomaticOptimization._training_step``)."""
    both = differential(trainer=dict(max_epochs=1, accumulate_grad_batches=3), module={"training_step": recording_loss})
    divided = [loss / 3 for loss in both.lightning.extra["loss"]]
    assert [outputs["loss"] for outputs in both.lightning.batch_end_outputs] == pytest.approx(divided)
