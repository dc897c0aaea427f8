"""``LightningArgumentParser``: jsonargparse's parser with Lightning's argument groups for GPUlayer's classes.

The Trainer's group is the Trainer's declared arguments (``gpulayer.trainer.arguments.DECLARATIONS``, which
``Trainer.__init__``'s signature repeats), each with its declaration's line of doc as its help. Its ``logger`` and
``callbacks`` take any class the Trainer takes, Lightning's loggers and callbacks built on Lightning's ``Callback``
among them (a Lightning 2.6 config names those), not only GPUlayer's ``Logger`` and ``Callback``.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
from jsonargparse import ArgumentParser, class_from_function

import gpulayer.callbacks  # noqa: F401  (imported, its callbacks resolve by short name: --trainer.callbacks+=EarlyStopping)
from gpulayer.trainer import Callback, DataModule, Logger, MisconfigurationException, Module, Trainer
from gpulayer.trainer.arguments import DECLARATIONS
from gpulayer.trainer.defaults import takes_callback_class
from gpulayer.trainer.logging.logger import takes_logger_class

LR_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
AUTOMATIC = "AUTOMATIC"  # an optimizer or scheduler group the CLI gives the module's configure_optimizers

Group = tuple[type | tuple[type, ...], str]  # the class (or classes) of an optimizer/scheduler group, and its link


class _TakenAsLogger(abc.ABC):  # noqa: B024 (a virtual base: its __subclasshook__ is all it has)
    """Any class whose instances ``Trainer(logger=...)`` takes, for jsonargparse's ``class_path`` check."""

    @classmethod
    def __subclasshook__(cls, kind: type) -> bool:
        return takes_logger_class(kind)


class _TakenAsCallback(abc.ABC):  # noqa: B024 (as _TakenAsLogger)
    """Any class whose instances ``Trainer(callbacks=...)`` takes, for jsonargparse's ``class_path`` check."""

    @classmethod
    def __subclasshook__(cls, kind: type) -> bool:
        return takes_callback_class(kind)


# GPUlayer's bases stay in the unions: jsonargparse resolves a short name (``EarlyStopping``) among their subclasses.
_TRAINER_TYPES = {
    "logger": bool | Logger | _TakenAsLogger | Iterable[Logger | _TakenAsLogger] | None,
    "callbacks": Callback | _TakenAsCallback | list[Callback | _TakenAsCallback] | None,
}


class LightningArgumentParser(ArgumentParser):
    """jsonargparse's ``ArgumentParser`` that adds a Trainer's, Module's, DataModule's or Callback's arguments under a
    key, and optimizer and learning rate scheduler groups, as Lightning 2.6's parser of the same name does."""

    def __init__(
        self,
        *args: Any,
        description: str = "Lightning Trainer command line tool",
        env_prefix: str = "PL",
        default_env: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        self.callback_keys: list[str] = []
        self.trainer_keys: list[str] = []  # the keys holding Trainer arguments: checked before anything is built
        self._optimizers: dict[str, Group] = {}
        self._lr_schedulers: dict[str, Group] = {}

    def add_lightning_class_args(
        self,
        lightning_class: type | Callable[..., Any],
        nested_key: str,
        subclass_mode: bool = False,
        required: bool = True,
    ) -> list[str]:
        """Add the arguments of ``lightning_class`` (a ``Trainer``, ``Module``, ``DataModule`` or ``Callback`` class,
        or a function returning one) under ``nested_key``; with ``subclass_mode``, any subclass by ``class_path``."""
        if callable(lightning_class) and not isinstance(lightning_class, type):
            lightning_class = class_from_function(lightning_class)
        if not (
            isinstance(lightning_class, type) and issubclass(lightning_class, (Trainer, Module, DataModule, Callback))
        ):
            raise MisconfigurationException(
                f"Cannot add arguments from: {lightning_class}. You should provide either a callable or a subclass "
                "of: Trainer, Module (LightningModule), DataModule (LightningDataModule), or Callback."
            )
        if issubclass(lightning_class, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required)
        trainer = issubclass(lightning_class, Trainer)
        widened = _TRAINER_TYPES.keys() & inspect.signature(lightning_class).parameters.keys() if trainer else set()
        added = self.add_class_arguments(
            lightning_class, nested_key, fail_untyped=False, instantiate=not trainer, sub_configs=True, skip=widened
        )
        if trainer:
            for name in sorted(widened):
                default = inspect.signature(lightning_class).parameters[name].default
                self.add_argument(f"--{nested_key}.{name}", type=_TRAINER_TYPES[name], default=default)
                added.append(f"{nested_key}.{name}")
            self.trainer_keys.append(nested_key)
            self._document_trainer_arguments(nested_key)
        return added

    def add_optimizer_args(
        self,
        optimizer_class: type[torch.optim.Optimizer] | tuple[type[torch.optim.Optimizer], ...] = (
            torch.optim.Optimizer,
        ),
        nested_key: str = "optimizer",
        link_to: str = AUTOMATIC,
    ) -> None:
        """An optimizer's arguments (all but ``params``) under ``nested_key``; a tuple of classes takes any subclass
        by ``class_path``. ``link_to`` is a key to link the group to, or ``AUTOMATIC``."""
        self._add_group(optimizer_class, nested_key, {"params"})
        self._optimizers[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(
        self,
        lr_scheduler_class: type | tuple[type, ...] = LR_SCHEDULERS,
        nested_key: str = "lr_scheduler",
        link_to: str = AUTOMATIC,
    ) -> None:
        """A learning rate scheduler's arguments (all but ``optimizer``) under ``nested_key``, as the optimizer's."""
        self._add_group(lr_scheduler_class, nested_key, {"optimizer"})
        self._lr_schedulers[nested_key] = (lr_scheduler_class, link_to)

    def _add_group(self, classes: type | tuple[type, ...], nested_key: str, skip: set[str]) -> None:
        options: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": skip}
        if isinstance(classes, tuple):
            self.add_subclass_arguments(classes, nested_key, **options)
        else:
            self.add_class_arguments(classes, nested_key, sub_configs=True, **options)

    def _document_trainer_arguments(self, nested_key: str) -> None:
        for action in self._actions:
            name = action.dest.removeprefix(f"{nested_key}.")
            if name in DECLARATIONS:
                action.help = DECLARATIONS[name].doc
