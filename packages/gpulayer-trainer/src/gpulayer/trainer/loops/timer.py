"""``Timer``: Lightning 2.6's callback (``lightning/pytorch/callbacks/timer.py``) that times the training, validation
and test stages and stops training once the time spent in it reaches ``duration``. The Trainer adds one for
``max_time`` (``interval="step"``); ``gpulayer.callbacks`` exports it."""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpulayer.trainer.core.callback import Callback, follows_cadence
from gpulayer.trainer.exceptions import MisconfiguredValueError
from gpulayer.trainer.states import RunningStage

if TYPE_CHECKING:
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.trainer import Trainer

log = logging.getLogger(__name__)

# Lightning's "DD:HH:MM:SS" (matched on the stripped string); Trainer(max_time=...) follows the same rule.
DURATION = re.compile(r"(\d+):(\d\d):(\d\d):(\d\d)")
INTERVALS = ("step", "epoch")


def duration_of(text: str) -> timedelta | None:
    """A ``"DD:HH:MM:SS"`` string as a timedelta; None when it is not one."""
    match = DURATION.fullmatch(text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = map(int, match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


class Timer(Callback):
    """Times each stage (``time_elapsed``, ``time_remaining``, ``start_time``, ``end_time``, in seconds of
    ``time.monotonic()``) and sets ``trainer.should_stop`` once training has run for ``duration`` (sanity check
    excluded): checked at ``on_fit_start``, then after each training batch (``interval="step"``) or epoch.

    The batch check runs where ``trainer.cadence`` plans it: on one process the fit loop reads the clock after every
    batch (``Cadence.clock``); on several, each rank's clock differs, so the check runs at planned batches and the
    ranks' decisions are combined at the next sync point (Lightning broadcasts rank 0's at every batch instead).
    The time spent training is saved in checkpoints and carried on by a resumed run.
    """

    def __init__(
        self, duration: str | timedelta | dict[str, int] | None = None, interval: str = "step", verbose: bool = True
    ) -> None:
        if isinstance(duration, str):
            parsed = duration_of(duration)
            if parsed is None:  # Lightning's message, word for word
                raise MisconfiguredValueError(
                    f"`Timer(duration={duration!r})` is not a valid duration. "
                    "Expected a string in the format DD:HH:MM:SS."
                )
            duration = parsed
        elif isinstance(duration, dict):
            duration = timedelta(**duration)
        elif duration is not None and not isinstance(duration, timedelta):  # Lightning fails later, on .total_seconds
            raise TypeError(
                f"Timer(duration={duration!r}): accepted values are None, a 'DD:HH:MM:SS' string, a datetime.timedelta "
                "or a dict of its arguments"
            )
        if not isinstance(interval, str) or interval not in INTERVALS:
            raise MisconfiguredValueError(
                f"Unsupported parameter value `Timer(interval={interval})`. Possible choices are: {', '.join(INTERVALS)}"
            )
        self._duration = duration.total_seconds() if duration is not None else None
        self._interval = interval
        self._verbose = verbose
        self._start_time: dict[RunningStage, float | None] = dict.fromkeys(RunningStage)
        self._end_time: dict[RunningStage, float | None] = dict.fromkeys(RunningStage)
        self._offset: float = 0  # the training time of the run a checkpoint resumed

    def start_time(self, stage: str = RunningStage.TRAINING) -> float | None:
        """The ``time.monotonic()`` at which ``stage`` last started."""
        return self._start_time[RunningStage(stage)]

    def end_time(self, stage: str = RunningStage.TRAINING) -> float | None:
        """The ``time.monotonic()`` at which ``stage`` last ended."""
        return self._end_time[RunningStage(stage)]

    def time_elapsed(self, stage: str = RunningStage.TRAINING) -> float:
        """Seconds spent in ``stage``'s last run (training: with a resumed run's earlier time)."""
        start, end = self.start_time(stage), self.end_time(stage)
        offset = self._offset if stage == RunningStage.TRAINING else 0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = RunningStage.TRAINING) -> float | None:
        """Seconds left of ``duration`` (None without one)."""
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    def _started(self, stage: RunningStage) -> None:
        # Lightning keeps the last run's end time here, so a Timer used for a second fit never stops it (its elapsed
        # time is negative); GPUlayer times each run from its start.
        self._start_time[stage], self._end_time[stage] = time.monotonic(), None

    def _ended(self, stage: RunningStage) -> None:
        self._end_time[stage] = time.monotonic()

    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._started(RunningStage.TRAINING)
        if self._interval == "step" and self._duration is not None:
            trainer.cadence.clock(self._due)

    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._ended(RunningStage.TRAINING)

    def on_validation_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._started(RunningStage.VALIDATING)

    def on_validation_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._ended(RunningStage.VALIDATING)

    def on_test_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._started(RunningStage.TESTING)

    def on_test_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._ended(RunningStage.TESTING)

    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        # After the checkpoint's state is loaded, whatever the interval: a resumed run may have no time left.
        if self._duration is not None:
            self._check_time_remaining(trainer)

    @follows_cadence
    def on_train_batch_end(self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._interval == "step" and self._duration is not None:
            self._check_time_remaining(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if self._interval == "epoch" and self._duration is not None:
            self._check_time_remaining(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage.value: self.time_elapsed(stage) for stage in RunningStage}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = state_dict.get("time_elapsed", {}).get(RunningStage.TRAINING.value, 0)

    def _due(self) -> float:
        """The ``time.monotonic()`` at which the time spent in training reaches ``duration``."""
        return self._start_time[RunningStage.TRAINING] + self._duration - self._offset

    def _check_time_remaining(self, trainer: Trainer) -> None:
        # This rank's own clock: on several ranks the fit loop combines should_stop at its next sync point, which
        # every rank reaches (sync_decisions.py).
        stop = self.time_elapsed() >= self._duration
        trainer.should_stop = trainer.should_stop or stop
        if stop and self._verbose and trainer.is_global_zero:
            elapsed = timedelta(seconds=int(self.time_elapsed(RunningStage.TRAINING)))
            log.info(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.")
