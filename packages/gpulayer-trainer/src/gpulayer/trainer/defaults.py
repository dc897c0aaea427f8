"""What a ``Trainer`` adds by default, as Lightning does: the ``max_time`` Timer, the default checkpoint (with
every checkpoint callback moved last) and the CSV logger."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpulayer.trainer.callback import Callback, Checkpoint
from gpulayer.trainer.csv_logger import CSVLogger
from gpulayer.trainer.default_checkpoint import DefaultCheckpoint
from gpulayer.trainer.timer import Timer


def default_callbacks(callbacks: list[Callback], args: Any) -> list[Callback]:
    """User callbacks, then the ``max_time`` Timer, then every checkpoint callback last (Lightning's order);
    the default checkpoint when checkpointing is on and none is given."""
    checkpoints = [c for c in callbacks if isinstance(c, Checkpoint)]
    if checkpoints and not args.enable_checkpointing:
        raise ValueError(
            "enable_checkpointing=False but callbacks holds a checkpoint callback "
            f"({type(checkpoints[0]).__name__}); remove one of them"
        )
    if args.enable_checkpointing and not checkpoints:
        checkpoints = [DefaultCheckpoint()]
    timer = [Timer(args.max_time)] if args.max_time is not None else []
    return [c for c in callbacks if not isinstance(c, Checkpoint)] + timer + checkpoints


def default_loggers(logger: Any, args: Any) -> list[CSVLogger]:
    """``True``/``None``: a ``CSVLogger`` in ``default_root_dir`` (Lightning's default without TensorBoard);
    ``False`` or ``[]``: none; a ``CSVLogger`` or a list of them: those. ``fast_dev_run`` writes no files, as
    Lightning's ``DummyLogger``."""
    if logger is None or logger is True:
        chosen = [CSVLogger(args.default_root_dir)]
    elif logger is False:
        chosen = []
    elif isinstance(logger, CSVLogger):
        chosen = [logger]
    elif isinstance(logger, (list, tuple)) and all(isinstance(one, CSVLogger) for one in logger):
        chosen = list(logger)
    else:
        raise TypeError(
            f"logger={logger!r}: accepted values are True, False, None, a gpulayer.trainer.CSVLogger or a list of "
            "them (GPUlayer writes CSV only; gpulayer plot draws the curves)"
        )
    return [] if args.fast_dev_run else chosen


def callback_list(callbacks: Any) -> list[Callback]:
    if callbacks is None:
        return []
    many = [callbacks] if isinstance(callbacks, Callback) else callbacks
    many = list(many) if isinstance(many, Iterable) else None
    if many is None or not all(isinstance(c, Callback) for c in many):
        raise TypeError(f"callbacks={callbacks!r}: accepted values are None, a Callback, or a list of Callbacks")
    return many
