"""What a ``Trainer`` adds by default, as Lightning does: the ``max_time`` Timer, the default checkpoint (with
every checkpoint callback moved last) and the CSV logger."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

from gpulayer.trainer.core.callback import Callback, Checkpoint, callback_base, callback_class_base
from gpulayer.trainer.core.hooks import is_overridden
from gpulayer.trainer.core.lightning_classes import is_lightnings, lightning_modules
from gpulayer.trainer.default_checkpoint import DefaultCheckpoint
from gpulayer.trainer.exceptions import MisconfiguredValueError
from gpulayer.trainer.logging.csv_logger import CSVLogger
from gpulayer.trainer.logging.logger import DummyLogger
from gpulayer.trainer.logging.rank_zero import rank_zero_only
from gpulayer.trainer.loops.timer import Timer

log = logging.getLogger(__name__)


def default_callbacks(callbacks: list[Callback], args: Any) -> list[Callback]:
    """User callbacks, then the ``max_time`` Timer, then those of installed packages' callback factories, then every
    checkpoint callback last (Lightning's order); the default checkpoint when checkpointing is on and none is given."""
    check_state_keys(callbacks)
    checkpoints = [c for c in callbacks if isinstance(c, Checkpoint)]
    if checkpoints and not args.enable_checkpointing:
        raise MisconfiguredValueError(
            "enable_checkpointing=False but callbacks holds a checkpoint callback "
            f"({type(checkpoints[0]).__name__}); remove one of them"
        )
    if args.enable_checkpointing and not checkpoints:
        checkpoints = [_default_checkpoint()]
    timer = [Timer(args.max_time)] if args.max_time is not None else []
    if timer and any(isinstance(c, Timer) for c in callbacks):
        if rank_zero_only.rank == 0:  # Lightning's message, on rank 0 alone
            log.info("Ignoring `Trainer(max_time=...)`, callbacks list already contains a Timer.")
        timer = []
    external = _factory_callbacks()
    if external:
        check_state_keys(callbacks + external)
    ordered = [c for c in callbacks if not isinstance(c, Checkpoint)] + timer + external
    return (
        [c for c in ordered if not isinstance(c, Checkpoint)]
        + checkpoints
        + [c for c in external if isinstance(c, Checkpoint)]
    )


# Lightning's entry point group through which installed packages add callbacks to every Trainer.
CALLBACKS_FACTORY = "lightning.pytorch.callbacks_factory"


def _factory_callbacks() -> list[Callback]:
    """Lightning's ``_load_external_callbacks``: each factory registered under ``CALLBACKS_FACTORY`` is called, and
    the callback or list it returns joins the Trainer's, checked as ``callbacks=`` is."""
    found: list[Callback] = []
    for factory in entry_points(group=CALLBACKS_FACTORY):
        made = factory.load()()
        found += callback_list(made if isinstance(made, list) else [made])
    return found


def _default_checkpoint() -> Checkpoint:
    """Lightning's ``ModelCheckpoint()`` when gpulayer-callbacks is installed (found through its entry point, the
    trainer importing nothing above it), so ``isinstance(trainer.checkpoint_callback, ModelCheckpoint)`` holds;
    else ``DefaultCheckpoint``, which behaves the same."""
    found = [point for point in entry_points(group="gpulayer.checkpoints") if point.name == "default"]
    return found[0].load()() if found else DefaultCheckpoint()


def check_state_keys(callbacks: list[Callback]) -> None:
    """Lightning's rule, at construction: two callbacks with state (``state_dict`` overridden) under one
    ``state_key`` would overwrite each other in a checkpoint."""
    seen: dict[str, Callback] = {}
    for callback in callbacks:
        if not is_overridden("state_dict", callback, callback_base(callback)):
            continue
        if callback.state_key in seen:
            raise RuntimeError(
                f"callbacks: {type(seen[callback.state_key]).__name__} and {type(callback).__name__} have state under "
                f"one state_key ({callback.state_key!r}), so a checkpoint would keep only one of them; give one "
                "different arguments or a state_key of its own"
            )
        seen[callback.state_key] = callback


def default_loggers(logger: bool | list[Any], args: Any) -> list[Any]:
    """``logger`` as checked (``logger.py``): True gives a ``CSVLogger`` in ``default_root_dir`` (Lightning's
    default without TensorBoard; GPUlayer's always), False none, a list those loggers. ``fast_dev_run`` puts
    Lightning's ``DummyLogger`` in their place, which writes nothing."""
    chosen = [CSVLogger(args.default_root_dir)] if logger is True else logger or []
    return [DummyLogger()] if args.fast_dev_run and chosen else chosen


def callback_list(callbacks: Any) -> list[Callback]:
    """``callbacks=`` as a list of Callbacks, checked: GPUlayer's, and other libraries' built on Lightning's
    ``Callback`` (called as Lightning calls them); Lightning's display-only callbacks dropped with a warning."""
    if callbacks is None:
        return []
    many = [callbacks] if callback_base(callbacks) or _display_only(type(callbacks)) else callbacks
    many = list(many) if isinstance(many, Iterable) and not isinstance(many, (str, bytes)) else None
    if many is None:
        raise TypeError(f"callbacks={callbacks!r}: accepted values are None, a Callback, or a list of Callbacks")
    for index, callback in enumerate(many):
        if not (callback_base(callback) or _display_only(type(callback))):
            raise TypeError(f"callbacks[{index}] is {_described(callback)}")
    dropped = [type(callback).__name__ for callback in many if _display_only(type(callback))]
    if dropped:
        warnings.warn(
            f"callbacks: Lightning's {', '.join(dropped)} only display progress or a model summary; GPUlayer prints "
            "its own log line every log_every_n_steps steps and no model summary, so they are dropped",
            UserWarning,
            stacklevel=3,
        )
    return [callback for callback in many if not _display_only(type(callback))]


def takes_callback_class(kind: type) -> bool:
    """Whether ``callbacks=`` takes an instance of the class ``kind`` (``callback_list``'s rule, asked of a class a
    LightningCLI config names)."""
    return callback_class_base(kind) is not None or _display_only(kind)


# Lightning's callbacks that only display, and change nothing about training: accepted and dropped. Recognised by
# name and module, so the trainer never imports Lightning.
_DISPLAY_ONLY = ("RichProgressBar", "TQDMProgressBar", "RichModelSummary", "ModelSummary")
_LIGHTNING_CALLBACK_MODULES = lightning_modules("callbacks")


def _display_only(kind: type) -> bool:
    return kind.__name__ in _DISPLAY_ONLY and kind.__module__.startswith(_LIGHTNING_CALLBACK_MODULES)


# What GPUlayer does in place of Lightning's other progress bars (subclasses of its ProgressBar).
_PROGRESS_BAR = (
    "GPUlayer prints one log line every log_every_n_steps steps (enable_progress_bar=False turns it off); remove the "
    "callback"
)


# Lightning's callbacks that GPUlayer has, by class name: what a ported script imports instead.
_EQUIVALENTS = {
    "EarlyStopping": "gpulayer.callbacks.EarlyStopping",
    "ModelCheckpoint": "gpulayer.callbacks.ModelCheckpoint",
    "LearningRateMonitor": "gpulayer.callbacks.LearningRateMonitor",
    "Timer": "gpulayer.callbacks.Timer",
    "LambdaCallback": "gpulayer.callbacks.LambdaCallback",
    "GradientAccumulationScheduler": "gpulayer.callbacks.GradientAccumulationScheduler",
    "BasePredictionWriter": "gpulayer.callbacks.BasePredictionWriter",
    "OnExceptionCheckpoint": "gpulayer.callbacks.OnExceptionCheckpoint",
    "BaseFinetuning": "gpulayer.callbacks.BaseFinetuning",
    "BackboneFinetuning": "gpulayer.callbacks.BackboneFinetuning",
    "SpikeDetection": "gpulayer.callbacks.SpikeDetection",
    "ModelPruning": "gpulayer.callbacks.ModelPruning",
    "ThroughputMonitor": "gpulayer.callbacks.ThroughputMonitor",
    "DeviceStatsMonitor": "gpulayer.callbacks.DeviceStatsMonitor",
    "StochasticWeightAveraging": "gpulayer.callbacks.StochasticWeightAveraging",
    "WeightAveraging": "gpulayer.callbacks.WeightAveraging",
    "EMAWeightAveraging": "gpulayer.callbacks.EMAWeightAveraging",
}


def _described(callback: Any) -> str:
    """What a ``callbacks=`` entry that is not a GPUlayer ``Callback`` is, and what to do instead."""
    if isinstance(callback, type):
        instead = f"pass {callback.__qualname__}(...)" if issubclass(callback, Callback) else "pass a Callback instance"
        return f"the class {callback.__module__}.{callback.__qualname__}, not an instance: {instead}"
    kind = type(callback)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if is_lightnings(kind):
        if any(base.__name__ == "ProgressBar" for base in kind.__mro__):
            return f"Lightning's {kind.__qualname__} ({name}): {_PROGRESS_BAR}"
        equivalent = _EQUIVALENTS.get(kind.__qualname__)
        if equivalent is not None:
            return f"Lightning's {kind.__qualname__} ({name}), not a gpulayer.trainer.Callback: use {equivalent}"
        return (
            f"Lightning's {kind.__qualname__} ({name}), not a gpulayer.trainer.Callback: GPUlayer has no counterpart "
            "of it; write it as a gpulayer.trainer.Callback, or keep Lightning's Trainer for it"
        )
    built_on = next((k for k in kind.__mro__ if is_lightnings(k)), None)
    if built_on is not None:
        instead = _EQUIVALENTS.get(built_on.__qualname__, "gpulayer.trainer.Callback")
        return (
            f"{name}, built on Lightning's {built_on.__qualname__}: GPUlayer takes other libraries' callbacks built "
            f"on Lightning's Callback itself, not on its other callbacks; build it on {instead}, or keep Lightning's "
            "Trainer for it"
        )
    return f"{callback!r} ({name}), not a gpulayer.trainer.Callback: accepted are Callback instances"
