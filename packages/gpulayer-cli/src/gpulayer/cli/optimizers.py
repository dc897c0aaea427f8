"""The optimizer and learning rate scheduler that ``LightningCLI`` builds from ``--optimizer``/``--lr_scheduler``
and gives the module as its ``configure_optimizers``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
from jsonargparse import Namespace

# The types a module's __init__ names to have the CLI build its optimizer and scheduler later (dependency injection).
OptimizerCallable = Callable[[Iterable], torch.optim.Optimizer]


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ``ReduceLROnPlateau`` with the metric it steps on, ``monitor``, so a config can name it."""

    def __init__(self, optimizer: torch.optim.Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


LRSchedulerCallable = Callable[
    [torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau
]


def with_class_path(cls: type, init_args: Namespace | dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": ...}`` for a group added with one class (no ``class_path`` in its config)."""
    if isinstance(init_args, Namespace):
        init_args = init_args.as_dict()
    return {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": init_args or {}}


def class_path_adder(cls: type) -> Any:
    """A ``link_arguments`` compute function that gives a one-class group its ``class_path``."""
    return lambda init_args: with_class_path(cls, init_args)


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """Build ``init["class_path"]`` from ``args`` (one positional argument, or a tuple of them) and
    ``init["init_args"]``."""
    module, name = init["class_path"].rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    return cls(*(args if isinstance(args, tuple) else (args,)), **init.get("init_args", {}))


def configure_optimizers(module: Any, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None) -> Any:
    """What ``configure_optimizers`` returns for a built optimizer and scheduler: the optimizer alone, a dict naming
    a ``ReduceLROnPlateau``'s monitor, or the two lists."""
    if lr_scheduler is None:
        return optimizer
    if isinstance(lr_scheduler, ReduceLROnPlateau):
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor}}
    return [optimizer], [lr_scheduler]
