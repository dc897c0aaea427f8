"""``max_time``: Lightning's ``Timer`` callback with ``interval="step"``, which the Trainer adds for it."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpulayer.trainer.core.callback import Callback, follows_cadence

if TYPE_CHECKING:
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.trainer import Trainer


class Timer(Callback):
    """Stops training once the time spent in it reaches ``duration`` (sanity check excluded).

    Checked at ``on_fit_start`` and after every training batch the clock reaches ``duration`` at (the fit loop reads
    the clock after each batch, ``Cadence.clock``); sets ``trainer.should_stop``, so the usual rules follow:
    validation right after that batch, then the end of the epoch and of ``fit``.
    """

    def __init__(self, duration: timedelta) -> None:
        self.duration = duration.total_seconds()
        self._start: float | None = None
        self._end: float | None = None
        self._offset = 0.0

    def time_elapsed(self) -> float:
        if self._start is None:
            return self._offset
        end = time.monotonic() if self._end is None else self._end
        return end - self._start + self._offset

    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._check(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._start, self._end = time.monotonic(), None
        trainer.cadence.clock(self._due)

    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._end = time.monotonic()

    @follows_cadence
    def on_train_batch_end(self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._check(trainer)

    def _due(self) -> float:
        """The ``time.monotonic()`` at which the time spent in training reaches ``duration``."""
        return self._start + self.duration - self._offset

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {"train": self.time_elapsed()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = state_dict["time_elapsed"].get("train", 0.0)

    def _check(self, trainer: Trainer) -> None:
        # Each rank reads its own clock; on several ranks the fit loop combines should_stop at its sync points.
        trainer.should_stop = trainer.should_stop or self.time_elapsed() >= self.duration
