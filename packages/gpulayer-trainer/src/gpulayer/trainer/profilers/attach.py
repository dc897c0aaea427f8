"""The profiled path of a Trainer given a profiler, chosen once as it is built: its loops' per-epoch and per-batch
methods, the batch fetches and moves, and ``save_checkpoint`` are wrapped on their instances, each timed under
Lightning 2.6's action name (``lightning/pytorch/loops/``, ``trainer/trainer.py``). Without a profiler none of this
runs, and the loops are today's objects: nothing is added to a step.

``profiled_hooks`` (``core/profiled_hooks.py``) times the hooks; ``set_up`` and ``describe`` run around each stage.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gpulayer.trainer.profilers.profiler import Profiler

if TYPE_CHECKING:
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.loops.transfer import BatchTransfer
    from gpulayer.trainer.trainer import Trainer


class Timed:
    """``function(*args)`` timed as ``name``: what replaces a method on the profiled path."""

    __slots__ = ("function", "name", "profiler")

    def __init__(self, profiler: Profiler, name: str, function: Callable[..., Any]) -> None:
        self.profiler, self.name, self.function = profiler, name, function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.profiler.profile(self.name):
            return self.function(*args, **kwargs)


class TimedFetches:
    """An iterator whose every ``next`` is timed as ``name`` (Lightning's ``*_next`` actions)."""

    def __init__(self, profiler: Profiler, name: str, iterator: Iterator[Any]) -> None:
        self.profiler, self.name, self.iterator = profiler, name, iterator

    def __iter__(self) -> TimedFetches:
        return self

    def __next__(self) -> Any:
        self.profiler.start(self.name)
        try:
            return next(self.iterator)
        finally:
            self.profiler.stop(self.name)


class _FetchesTimed:
    """``source(iterable)``'s iterator with each fetch timed as ``name``."""

    def __init__(self, profiler: Profiler, name: str, source: Callable[[Any], Iterator[Any]]) -> None:
        self.profiler, self.name, self.source = profiler, name, source

    def __call__(self, iterable: Any) -> TimedFetches:
        return TimedFetches(self.profiler, self.name, self.source(iterable))


class _TransferTimed:
    """The loops' ``BatchTransfer`` with each move timed as the strategy's ``batch_to_device`` (where batches move:
    another device, a precision that converts inputs, or a transfer hook), and the train fetches timed as
    ``[_TrainingEpochLoop].train_dataloader_next``; anything else is the transfer's own."""

    def __init__(self, profiler: Profiler, strategy: str, transfer: BatchTransfer) -> None:
        self._transfer, self._move = transfer, Timed(profiler, f"[Strategy]{strategy}.batch_to_device", transfer)
        self.source = _FetchesTimed(profiler, "[_TrainingEpochLoop].train_dataloader_next", transfer.source)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transfer, name)

    def __call__(self, batch: Any, dataloader_idx: int) -> Any:
        return self._move(batch, dataloader_idx) if self._transfer.moves else batch


class _OptimizationTimed:
    """The fit loop's ``run``, which first times the optimization ``fit`` built for it: each batch's as
    ``run_training_batch`` and, under automatic optimization, its backward as the strategy's ``backward``."""

    def __init__(self, trainer: Trainer, run: Callable[[], None]) -> None:
        self.trainer, self.run = trainer, run

    def __call__(self) -> None:
        trainer = self.trainer
        optimization, profiler = trainer.fit_loop.optimization, trainer.profiler
        optimization.run = Timed(profiler, "run_training_batch", optimization.run)
        if not optimization.manual:  # Lightning times the backward of automatic optimization alone
            strategy = type(trainer.strategy).__name__
            optimization._backward = Timed(profiler, f"[Strategy]{strategy}.backward", optimization._backward)
        self.run()


def attach(trainer: Trainer) -> None:
    """Wrap the loops' methods of a Trainer given a profiler (the Trainer calls this only then)."""
    profiler = trainer.profiler
    fit_loop = trainer.fit_loop
    fit_loop.run_epoch = Timed(profiler, "run_training_epoch", fit_loop.run_epoch)
    fit_loop.run = _OptimizationTimed(trainer, fit_loop.run)
    transfer = _TransferTimed(profiler, type(trainer.strategy).__name__, fit_loop.transfer)
    fit_loop.transfer = transfer
    for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
        name = "[_PredictionLoop]" if loop.stage == "predict" else "[_EvaluationLoop]"
        loop.iterate = _FetchesTimed(profiler, f"{name}.{loop.prefix}_next", loop.iterate)
        loop.transfer = transfer
    trainer.save_checkpoint = Timed(profiler, "save_checkpoint", trainer.save_checkpoint)


def set_up(trainer: Trainer, module: Module) -> None:
    """As a stage starts (Lightning's ``Trainer.__setup_profiler``): the stage, the local rank on several processes,
    the log folder for a report without ``dirpath``, and the module (the PyTorch profiler names its layers)."""
    profiler = trainer.profiler
    profiler._lightning_module = weakref.proxy(module)
    local_rank = trainer.local_rank if trainer.world_size > 1 else None
    profiler.setup(stage=trainer.state.fn, local_rank=local_rank, log_dir=trainer.log_dir)
