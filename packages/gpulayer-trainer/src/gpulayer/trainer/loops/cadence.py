"""``Cadence``: when the fit loop's per-batch rules act, each count-based rule stated once.

After a training batch's step, the loop's rules may act: a log step, a sync point of the ranks, validation, the
epoch's end, a step-interval scheduler, a callback's step trigger. Each follows a count, so the plan states each as
the next count at which it acts, and works out ``next_batch``: the first batch at which any of them can. The loop
runs the batches before it as the step and its counters; at ``next_batch`` it asks every rule, then plans again
(ADR 0022).

Rules that follow no count are read after every batch: ``should_stop`` and a received SIGTERM (as the ranks agreed
on them) and, on one process, the clocks (``max_time``, ``val_check_interval`` as a time,
``ModelCheckpoint(train_time_interval=...)``). On several ranks the clocks are read at sync points only, since each
rank's clock differs. A batch hook a user overrides runs at every batch, as in Lightning: every batch is planned then.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulayer.trainer.loops.fit_loop import FitLoop

# A clock rule is read a little early rather than a batch late: a rule asked too early does nothing.
_CLOCK_MARGIN_S = 1e-6


class Cadence:
    """The fit loop's plan, ``trainer.cadence``. Callbacks read it rather than the loop (``is_log_step``,
    ``at_sync_point``, ``logger_step``, ``steps_due``); GPUlayer's own callbacks add their triggers in
    ``on_train_start`` (``every_n_steps``, ``before_log_steps``, ``clock``), so their batch hooks need not run at
    every batch."""

    def __init__(self, loop: FitLoop) -> None:
        args = loop.args
        self._loop, self._progress = loop, loop.progress
        self._every = args.log_every_n_steps
        self._fast_dev_run = bool(args.fast_dev_run)  # every batch logs and syncs, its limits checked at each
        self._window = args.accumulate_grad_batches
        self.accumulating = self._window > 1  # whether a batch can only accumulate (``accumulates``)
        self._across_epochs = args.check_val_every_n_epoch is None
        self.at_sync_point = False  # the batch being run is one where the ranks combine decisions
        self.next_batch: int | float = 0  # the first batch_idx at which a rule can act
        self.log_at: int | float = math.inf  # batches_that_stepped + 1 at the next log step
        self.validate_at: int | float = math.inf  # the validation index (below) at the next validation by count
        self.clock_due = math.inf  # time.monotonic() at which a clock rule is next due
        self.clocks = False  # whether any clock rule is planned (else the loop reads no clock)
        self._every_batch = True
        self._step_triggers: list[int] = []
        self._clocks: list[Callable[[], float]] = []
        self._before_log_steps = False

    def reset(self) -> None:
        """A new ``fit``: callbacks add their triggers again in ``on_train_start``."""
        self._step_triggers, self._clocks, self._before_log_steps = [], [], False
        self.at_sync_point = False

    # ---- triggers that callbacks add ------------------------------------------------------------------------
    def every_n_steps(self, n: int) -> None:
        """Plan the batches after which ``global_step`` is a multiple of ``n`` (``steps_due(n)``)."""
        self._step_triggers.append(n)

    def before_log_steps(self) -> None:
        """Plan the batches that start with ``is_log_step()`` true (``LearningRateMonitor`` logs there)."""
        self._before_log_steps = True

    def clock(self, due: Callable[[], float]) -> None:
        """A rule that acts once ``time.monotonic()`` reaches ``due()`` (asked again after it acts). On several ranks
        it is not planned: such rules act at sync points, where the ranks agree on one clock."""
        if not self._loop.distributed:
            self._clocks.append(due)

    # ---- the rules, read by the loop and the callbacks ------------------------------------------------------
    @property
    def logger_step(self) -> int:
        """The step of the logger's rows: the batches that stepped (Lightning's ``_batches_that_stepped``)."""
        return self._progress.batches_that_stepped

    def epoch_ends(self) -> bool:
        """The batch being run is the epoch's last."""
        progress = self._progress
        return progress.batch_idx + 1 == self._loop.max_batches or progress.is_last_batch

    def accumulates(self) -> bool:
        """The batch being run only accumulates gradients: it ends neither its accumulation window nor the epoch."""
        window = self._window
        return window > 1 and (self._progress.batch_idx + 1) % window != 0 and not self.epoch_ends()

    def is_log_step(self) -> bool:
        """The next batch that steps (this one, if it steps) is a log step by count: every ``log_every_n_steps``
        batches that stepped, across epochs. Before a batch it is the count in Lightning's ``should_update_logs``,
        which counts the batch about to run, accumulating or not."""
        return self._progress.batches_that_stepped + 1 == self.log_at

    def is_sync_point(self) -> bool:
        """Where the ranks combine decisions: a batch that steps and is a log step, or the epoch's last batch (every
        batch that steps under ``fast_dev_run``)."""
        return not self.accumulates() and (self._fast_dev_run or self.is_log_step() or self.epoch_ends())

    def validates(self) -> bool:
        """Validation by count is due after this batch: every ``val_check_batch`` batches of the epoch, or of the
        run under ``check_val_every_n_epoch=None``."""
        return self._validation_index(self._progress.batch_idx) == self.validate_at

    def steps_due(self, n: int) -> bool:
        """``global_step`` is a multiple of ``n`` (a trigger added with ``every_n_steps(n)``)."""
        return self._progress.global_step % n == 0

    # ---- the plan ---------------------------------------------------------------------------------------------
    def start_epoch(self, start: int) -> None:
        """Plan an epoch from batch ``start`` (0, or the batch a resumed run is in)."""
        loop = self._loop
        manual = not loop.optimization.steps_schedulers
        self._every_batch = self._fast_dev_run or bool(loop.hooks.every_batch) or (manual and bool(self._step_triggers))
        self.plan(start)

    def plan(self, start: int) -> None:
        """The next count of each rule from batch ``start`` on, and ``next_batch``. Called after every batch at
        which the rules ran (``start`` is the next batch) and when an epoch starts."""
        loop, progress = self._loop, self._progress
        stepped = progress.batches_that_stepped  # before start: the batches that stepped up to it
        self.log_at = _multiple_at_least(stepped + 1, self._every) if self._every else math.inf
        self.validate_at = math.inf
        interval = loop.val_check_batch
        validating = loop.should_validate_this_epoch()
        if validating and interval is not None and interval != math.inf:  # inf: at the epoch's end
            self.validate_at = _multiple_at_least(self._validation_index(start), interval)
        clocks = [due() for due in self._clocks]
        if validating and interval is None and not loop.distributed:
            clocks.append(loop.last_val_time + loop.args.val_check_interval.total_seconds())
        self.clocks = bool(clocks)
        self.clock_due = min(clocks, default=math.inf) - _CLOCK_MARGIN_S
        self.next_batch = start if self._every_batch else self._first_acting_batch(start)

    def _validation_index(self, batch_idx: int) -> int:
        """What validation by count counts at ``batch_idx``: the epoch's batches, or the run's."""
        progress = self._progress
        if self._across_epochs:
            return progress.total_batches + batch_idx - progress.batch_idx
        return batch_idx + 1

    def _first_acting_batch(self, start: int) -> int | float:
        loop, progress, window = self._loop, self._progress, self._window
        stepped = progress.batches_that_stepped
        window_end = start + (-(start + 1)) % window  # the first batch from start that can step

        def stepping(n: int) -> int:
            """The batch at which the n-th batch that steps from ``start`` comes (the epoch's last is planned)."""
            return window_end + (n - 1) * window

        batches = [loop.max_batches - 1]
        if self.log_at != math.inf:
            batches.append(stepping(self.log_at - stepped))
            if self._before_log_steps:
                before = self.log_at - 1 - stepped  # batches to step before is_log_step() holds
                batches.append(start if before == 0 else stepping(before) + 1)
        if self.validate_at != math.inf:
            batches.append(start + self.validate_at - self._validation_index(start))
        if loop.optimization.steps_schedulers:
            for config in loop.trainer.lr_scheduler_configs:
                if config.interval == "step":  # at batches that step, every frequency-th batch_idx + 1
                    period = math.lcm(window, config.frequency)
                    batches.append(start + (-(start + 1)) % period)
        for n in self._step_triggers:
            remaining = (-progress.global_step) % n
            # A batch that does not step keeps a multiple of n: the trigger acts at it again.
            batches.append(start if remaining == 0 and window_end > start else stepping(remaining or n))
        return min(batches)


def _multiple_at_least(value: int, every: int | float) -> int | float:
    return value + (-value) % every
