"""``GradientAccumulationScheduler``: Lightning 2.6's per-epoch ``accumulate_grad_batches``
(``lightning/pytorch/callbacks/gradient_accumulation_scheduler.py``)."""

from __future__ import annotations

import warnings
from typing import Any

from gpulayer.trainer import Callback, Module
from gpulayer.trainer.core.hooks import is_overridden
from gpulayer.trainer.exceptions import MisconfiguredValueError


class GradientAccumulationScheduler(Callback):
    """Sets ``trainer.accumulate_grad_batches`` as each epoch starts, from ``scheduling`` (``{epoch: factor}``,
    epochs from 0; epoch 0 accumulates 1 batch unless given). The fit loop reads the window at each batch, as
    Lightning's does: the loss is divided by it, an epoch's last batch always steps, and ``global_step`` and
    step-interval schedulers count the steps taken.

    ``scheduling={4: 2}`` accumulates 2 batches from the fifth epoch on.
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not scheduling:  # Lightning's messages, word for word
            raise TypeError("Empty dict cannot be interpreted correct")
        if any(not isinstance(key, int) or key < 0 for key in scheduling):
            raise MisconfiguredValueError(
                f"Epoch should be an int greater than or equal to 0. Got {list(scheduling.keys())}."
            )
        if any(not isinstance(value, int) or value < 1 for value in scheduling.values()):
            raise MisconfiguredValueError(
                f"Accumulation factor should be an int greater than 0. Got {list(scheduling.values())}."
            )
        # Lightning adds {0: 1} to the dict it was given; GPUlayer to its own copy.
        self.scheduling = dict(scheduling) if 0 in scheduling else {**scheduling, 0: 1}
        self.epochs = sorted(self.scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        return any(value > 1 for value in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor of the last scheduled epoch at or before ``epoch``."""
        return self.scheduling[max(key for key in self.epochs if key <= epoch)]

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Lightning's refusals of settings the schedule cannot work with."""
        if not pl_module.automatic_optimization:
            raise RuntimeError(
                """Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported for
                manual optimization. Please remove the callback or switch to automatic optimization."""
            )
        overridden = any(is_overridden(name, pl_module, Module) for name in ("optimizer_step", "optimizer_zero_grad"))
        if overridden and self.going_to_accumulate_grad_batches() and trainer.is_global_zero:
            warnings.warn(
                "When using `Trainer(accumulate_grad_batches != 1)` and overriding"
                " `LightningModule.optimizer_{step,zero_grad}`, the hooks will not be called on every batch"
                " (rather, they are called on every optimization step).",
                UserWarning,
                stacklevel=2,
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                "You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler`"
                " callback. Either remove `accumulate_grad_batches` from the Trainer or remove the callback."
            )

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)
