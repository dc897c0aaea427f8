"""``Logger``: Lightning 2.6's logger interface (``lightning/fabric/loggers/logger.py`` and
``lightning/pytorch/loggers/logger.py``), the base of ``CSVLogger`` and of users' own loggers.

The Trainer takes any object with this interface, Lightning's own loggers included, recognised by its members so
that the trainer never imports Lightning. As Lightning, GPUlayer calls loggers on every rank (but
``after_save_checkpoint``, on rank 0 alone); Lightning's loggers guard themselves with ``rank_zero_only``, whose rank
``LoggerRows.set_up`` sets as Lightning's strategies do, and ``CSVLogger`` with GPUlayer's own ``rank_zero_only``.
"""

from __future__ import annotations

import inspect
import os
import weakref
from abc import ABC, abstractmethod
from argparse import Namespace
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from gpulayer.trainer.trainer import Trainer

# What the Trainer and ModelCheckpoint use of a logger (``experiment`` is the logger's own, for user code).
INTERFACE = (
    "name",
    "version",
    "save_dir",
    "log_dir",
    "log_metrics",
    "log_hyperparams",
    "log_graph",
    "save",
    "finalize",
    "after_save_checkpoint",
)


class Logger(ABC):
    """Base class for experiment loggers: ``name``, ``version``, ``log_metrics`` and ``log_hyperparams`` to write;
    the rest default as in Lightning (no local folder, nothing to save, ``finalize`` saves; empty methods on
    purpose, hence B027)."""

    @property
    @abstractmethod
    def name(self) -> str | None:
        """The experiment name."""

    @property
    @abstractmethod
    def version(self) -> int | str | None:
        """The experiment version."""

    @property
    def root_dir(self) -> str | None:
        """The folder holding every version of the experiment, or None when the logger saves nothing locally."""
        return None

    @property
    def log_dir(self) -> str | None:
        """The folder of this version, or None when the logger saves nothing locally."""
        return None

    @property
    def save_dir(self) -> str | None:
        """The root folder of the logs, or None when the logger saves nothing locally."""
        return None

    @property
    def group_separator(self) -> str:
        return "/"

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Records ``metrics`` (names to numbers) at ``step``."""

    @abstractmethod
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """Records the hyperparameters."""

    def log_graph(self, model: torch.nn.Module, input_array: torch.Tensor | None = None) -> None:  # noqa: B027
        """Records the model's graph; nothing by default."""

    def save(self) -> None:  # noqa: B027
        """Writes what is buffered; nothing by default."""

    def finalize(self, status: str) -> None:
        """The run ended with ``status`` (``"success"``, ``"failed"`` or ``"finished"``): saves by default."""
        self.save()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:  # noqa: B027
        """ModelCheckpoint saved a checkpoint; nothing by default."""


class DummyLogger(Logger):
    """``fast_dev_run``'s logger, as Lightning's: it writes nothing, and its ``experiment`` (like any method of its
    own) takes every call, so that ``self.logger.experiment.add_image(...)`` runs unchanged."""

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def experiment(self) -> _Anything:
        return _Anything()

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        pass

    def __getitem__(self, index: int) -> DummyLogger:  # self.logger[0].experiment...
        return self

    def __getattr__(self, name: str) -> Any:
        return _Anything().nothing


class _Anything:
    """Lightning's ``_DummyExperiment``: every attribute is a method that does nothing."""

    def nothing(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return self.nothing

    def __getitem__(self, index: int) -> _Anything:
        return self

    def __setitem__(self, *args: Any) -> None:
        pass


def logger_list(logger: Any) -> bool | list[Any]:
    """``Trainer(logger=...)`` checked: ``None``/``True`` give True (the default logger), ``False`` gives False, a
    logger or an iterable of them a list; anything else is refused, before any work."""
    if logger is None or logger is True or logger is False:
        return logger is not False
    if _has_interface(logger):
        return [logger]
    many = list(logger) if isinstance(logger, Iterable) and not isinstance(logger, (str, bytes, dict)) else None
    if many is None:
        raise TypeError(f"logger={logger!r}: {_ACCEPTED}; {_missing(logger)}")
    for index, one in enumerate(many):
        if not _has_interface(one):
            raise TypeError(f"logger={logger!r}: item {index} is not a logger ({_missing(one)}); {_ACCEPTED}")
    return many


_ACCEPTED = (
    "accepted values are True, False, None, a logger (a gpulayer.trainer.Logger such as CSVLogger, a Lightning "
    "logger such as TensorBoardLogger, or any object with Lightning's logger interface) or an iterable of loggers"
)


def takes_logger_class(kind: type) -> bool:
    """Whether ``logger=`` takes an instance of the class ``kind``: the class has Lightning's logger interface (asked
    of a class a LightningCLI config names)."""
    return not _absent(kind)


def _has_interface(candidate: Any) -> bool:
    return not isinstance(candidate, type) and not _absent(candidate)


def _absent(candidate: Any) -> list[str]:
    """The interface members ``candidate`` lacks, found without running a property (a version is not picked)."""
    absent = []
    for member in INTERFACE:
        try:
            inspect.getattr_static(candidate, member)
        except AttributeError:
            absent.append(member)
    return absent


def _missing(candidate: Any) -> str:
    if isinstance(candidate, type):
        return f"it is the class {candidate.__qualname__}: pass an instance"
    return f"it lacks {', '.join(_absent(candidate))}"


# Lightning's Trainer.log_dir is the log_dir of these loggers and the save_dir of any other.
_LOG_DIR_LOGGERS = ("TensorBoardLogger", "CSVLogger")
_LOG_DIR_MODULES = ("lightning.pytorch.loggers", "pytorch_lightning.loggers", "gpulayer.trainer.logging.csv_logger")


def logger_folder(logger: Any) -> str | None:
    """The folder Lightning's ``Trainer.log_dir`` names for ``logger``, as this rank sees it."""
    in_log_dir = any(
        kind.__name__ in _LOG_DIR_LOGGERS and kind.__module__.startswith(_LOG_DIR_MODULES)
        for kind in type(logger).__mro__
    )
    return logger.log_dir if in_log_dir else logger.save_dir


def checkpoint_dir(trainer: Trainer) -> str:
    """ModelCheckpoint's default ``dirpath`` (Lightning's ``__resolve_ckpt_dir``): ``save_dir/name/version``
    of the first logger (``default_root_dir`` for a logger without ``save_dir``), else ``default_root_dir``;
    then ``checkpoints``."""
    if not trainer.loggers:
        return os.path.join(trainer.default_root_dir, "checkpoints")
    first = trainer.loggers[0]
    save_dir = first.save_dir if first.save_dir is not None else trainer.default_root_dir
    version = first.version if isinstance(first.version, str) else f"version_{first.version}"
    return os.path.join(save_dir, str(first.name), version, "checkpoints")


def after_save_checkpoint(trainer: Trainer, checkpoint_callback: Any) -> None:
    """Tells the loggers, on rank 0 alone as Lightning's ModelCheckpoint does, that ``checkpoint_callback`` saved (a
    weak proxy of it, as Lightning passes). A full-state save behind training (``background_writes``) tells them
    once its file is in place, on the training thread."""
    if not trainer.is_global_zero:
        return
    loggers, proxy = list(trainer.loggers), weakref.proxy(checkpoint_callback)
    writes = trainer.strategy.background_writes
    if writes is None:
        for logger in loggers:
            logger.after_save_checkpoint(proxy)
    else:
        writes.when_written(lambda: [logger.after_save_checkpoint(proxy) for logger in loggers])
