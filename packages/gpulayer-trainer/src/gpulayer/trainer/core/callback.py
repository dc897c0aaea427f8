"""``Callback``: Lightning's callback hooks, each a no-op until overridden. Callbacks run before the module."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.core.lightning_classes import is_lightnings, lightning_modules

if TYPE_CHECKING:
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.trainer import Trainer

CALLBACK_HOOKS = (
    "setup",
    "teardown",
    "on_fit_start",
    "on_fit_end",
    "on_sanity_check_start",
    "on_sanity_check_end",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_validation_epoch_start",
    "on_validation_epoch_end",
    "on_test_epoch_start",
    "on_test_epoch_end",
    "on_predict_epoch_start",
    "on_predict_epoch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
    "on_train_start",
    "on_train_end",
    "on_validation_start",
    "on_validation_end",
    "on_test_start",
    "on_test_end",
    "on_predict_start",
    "on_predict_end",
    "on_exception",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)


TRAIN_BATCH_HOOKS = ("on_train_batch_start", "on_train_batch_end")


def follows_cadence(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a train batch hook that acts only at the batches ``trainer.cadence`` plans (its callback adds its
    triggers there in ``on_train_start``): the fit loop then calls it at those batches alone, and
    ``on_train_batch_end`` receives ``outputs=None``. A subclass that overrides the hook is called at every batch."""
    hook.follows_cadence = True  # type: ignore[attr-defined]
    return hook


class Callback:
    """Override the hooks you need; each receives ``(trainer, pl_module, ...)`` as in Lightning."""

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint: its class name, as Lightning has it."""
        return self.__class__.__qualname__

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        pass

    def teardown(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        pass

    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_fit_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_sanity_check_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_sanity_check_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_train_batch_start(self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int) -> None:
        pass

    def on_train_batch_end(self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        pass

    def on_train_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_test_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_test_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        pass

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        pass

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        pass

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        pass

    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        pass

    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        pass

    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_validation_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_validation_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_test_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_test_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_predict_start(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_predict_end(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_exception(self, trainer: Trainer, pl_module: Module, exception: BaseException) -> None:
        pass

    def on_save_checkpoint(self, trainer: Trainer, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        pass

    def on_load_checkpoint(self, trainer: Trainer, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        pass

    def on_before_backward(self, trainer: Trainer, pl_module: Module, loss: torch.Tensor) -> None:
        pass

    def on_after_backward(self, trainer: Trainer, pl_module: Module) -> None:
        pass

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: Module, optimizer: torch.optim.Optimizer) -> None:
        pass

    def on_before_zero_grad(self, trainer: Trainer, pl_module: Module, optimizer: torch.optim.Optimizer) -> None:
        pass


class Checkpoint(Callback):
    """Lightning's base of checkpoint callbacks: placed last in ``trainer.callbacks``, run after the module at
    ``on_train_epoch_end``, and searched for ``ckpt_path="last"`` (``dirpath``) and ``"best"`` (``best_model_path``)."""

    _runs_after_module_on_train_epoch_end = True
    dirpath: str | None = None
    best_model_path: str = ""


# Lightning's Callback, recognised by its name and module.
_LIGHTNING_CALLBACK_MODULES = lightning_modules("callbacks.callback")


def callback_base(callback: Any) -> type | None:
    """The class ``callback``'s hooks override: GPUlayer's ``Callback``, or Lightning's for a callback another
    library built on it (Optuna's pruning callback, a research utility), whose classes between it and Lightning's
    ``Callback`` are all its own; None for anything else, Lightning's own callbacks among them."""
    return Callback if isinstance(callback, Callback) else callback_class_base(type(callback))


def callback_class_base(kind: type) -> type | None:
    """``callback_base`` of an instance of the class ``kind``."""
    if issubclass(kind, Callback):
        return Callback
    for parent in kind.__mro__:
        if is_lightnings(parent):
            return (
                parent if parent.__name__ == "Callback" and parent.__module__ in _LIGHTNING_CALLBACK_MODULES else None
            )
    return None
