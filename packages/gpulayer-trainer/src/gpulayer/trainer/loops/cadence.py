"""``Cadence``: when the fit loop's per-batch rules act, each count-based rule stated once.

After a training batch's step, the loop's rules may act: a log step, a sync point of the ranks, validation, the
epoch's end, a step-interval scheduler, a callback's step trigger. Each follows a count, so the plan states each as
the next count at which it acts, and works out ``next_batch``: the first batch at which any of them can. The loop
runs the batches before it as the step and its counters; at ``next_batch`` it asks every rule, then plans again
(ADR 0022). Each ``fit`` makes its plan from rules fixed for the fit (``CadenceRules``) and the run's counters
(``Progress``); what changes during a fit (the epoch's batches, the time of the last validation) is passed in where
the plan is made.

Rules that follow no count are read after every batch: ``should_stop`` and a received SIGTERM (as the ranks agreed
on them) and, on one process, the clocks (``max_time``, ``val_check_interval`` as a time,
``ModelCheckpoint(train_time_interval=...)``). On several ranks the clocks are read at sync points only, since each
rank's clock differs. A batch hook a user overrides runs at every batch, as in Lightning: every batch is planned then.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from gpulayer.trainer.core.optimizers import next_due_count
from gpulayer.trainer.exceptions import MisconfiguredValueError

if TYPE_CHECKING:
    from gpulayer.trainer.arguments import TrainerArguments
    from gpulayer.trainer.core.hooks import Hooks
    from gpulayer.trainer.core.optimizers import LRSchedulerConfig
    from gpulayer.trainer.loops.manual_optimization import ManualOptimization
    from gpulayer.trainer.loops.optimization import AutomaticOptimization
    from gpulayer.trainer.loops.progress import Progress

# A clock rule is read a little early rather than a batch late: a rule asked too early does nothing.
_CLOCK_MARGIN_S = 1e-6


def val_check_batch(args: TrainerArguments, max_batches: int | float) -> int | float | None:
    """Validation every how many training batches, by ``val_check_interval``: None for a time (validation by the
    clock), ``inf`` at the end of an epoch of unknown length; Lightning's refusals."""
    interval = args.val_check_interval
    if isinstance(interval, timedelta):
        return None
    if isinstance(interval, int):
        if interval > max_batches and args.check_val_every_n_epoch is not None and args.limit_val_batches != 0:
            raise ValueError(
                f"val_check_interval={interval} is more than the {max_batches} training batches of an epoch; "
                "set check_val_every_n_epoch=None to count batches across epochs, or limit_val_batches=0"
            )
        return interval
    if max_batches == math.inf:
        if interval != 1.0:
            raise MisconfiguredValueError(
                f"val_check_interval={interval!r}: a loader without a length needs 1.0 or an int"
            )
        return math.inf
    return max(1, int(max_batches * interval))


@dataclass(frozen=True)
class CadenceRules:
    """What one ``fit``'s plan follows, fixed once its validation and optimizers are known (``FitLoop.run`` builds
    it, ``for_fit``). The defaults plan nothing: the rules before a first ``fit``."""

    log_every_n_steps: int = 0
    fast_dev_run: bool = False  # every batch logs and syncs, its limits checked at each
    check_val_every_n_epoch: int | None = 1  # None: validation by count counts the run's batches, across epochs
    validation: bool = False  # the fit validates: a loop with data and a step, and batches to run
    val_check_seconds: float | None = None  # val_check_interval as a time
    steps_schedulers: bool = True  # the loop steps the schedulers (under manual optimization the user does)
    step_frequencies: tuple[int, ...] = ()  # the frequency of each scheduler with interval="step" the loop steps
    hooks_every_batch: bool = False  # a train batch hook must run at every batch (a user's)
    distributed: bool = False  # several ranks: their clocks differ, so clock rules act at sync points only

    @classmethod
    def for_fit(
        cls,
        args: TrainerArguments,
        hooks: Hooks,
        optimization: AutomaticOptimization | ManualOptimization,
        schedulers: Sequence[LRSchedulerConfig],
        *,
        validation: bool,
        distributed: bool,
    ) -> CadenceRules:
        """The rules of a ``fit`` with these arguments, hooks, optimization and schedulers."""
        interval, steps_schedulers = args.val_check_interval, optimization.steps_schedulers
        return cls(
            log_every_n_steps=args.log_every_n_steps,
            fast_dev_run=bool(args.fast_dev_run),
            check_val_every_n_epoch=args.check_val_every_n_epoch,
            validation=validation,
            val_check_seconds=interval.total_seconds() if isinstance(interval, timedelta) else None,
            steps_schedulers=steps_schedulers,
            step_frequencies=tuple(c.frequency for c in schedulers if c.interval == "step") if steps_schedulers else (),
            hooks_every_batch=bool(hooks.every_batch),
            distributed=distributed,
        )


def validates_in_epoch(check_val_every_n_epoch: int | None, epoch: int) -> bool:
    """``check_val_every_n_epoch``: whether the epoch numbered ``epoch`` (from 0) validates."""
    return check_val_every_n_epoch is None or (epoch + 1) % check_val_every_n_epoch == 0


class Cadence:
    """The fit loop's plan, ``trainer.cadence``, made by each ``fit`` from its rules; it reads the run's counters
    (``Progress``), never the loop. Callbacks read it rather than the loop (``is_log_step``, ``at_sync_point``,
    ``logger_step``, ``steps_due``); GPUlayer's own callbacks add their triggers in ``on_train_start``
    (``every_n_steps``, ``before_log_steps``, ``clock``), so their batch hooks need not run at every batch."""

    def __init__(self, rules: CadenceRules, progress: Progress, window: int) -> None:
        self.rules, self._progress = rules, progress
        self.window = window  # the accumulation window: trainer.accumulate_grad_batches (``set_window``)
        self.accumulating = self.window > 1  # whether a batch can only accumulate (``accumulates``)
        self._across_epochs = rules.check_val_every_n_epoch is None
        self.next_batch: int | float = 0  # the first batch_idx at which a rule can act
        self.log_at: int | float = math.inf  # batches_that_stepped + 1 at the next log step
        self.validate_at: int | float = math.inf  # the validation index (below) at the next validation by count
        self.clock_due = math.inf  # time.monotonic() at which a clock rule is next due
        self.clocks = False  # whether any clock rule is planned (else the loop reads no clock)
        self._max_batches: int | float = 0  # the epoch's batches
        self._val_check_batch: int | float | None = None  # the epoch's validation interval in batches (None: a time)
        self._every_batch = True
        self._step_triggers: list[int] = []
        self._clocks: list[Callable[[], float]] = []
        self._before_log_steps = False

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
        if not self.rules.distributed:
            self._clocks.append(due)

    def set_window(self, window: int) -> None:
        """``trainer.accumulate_grad_batches = window``: the batches from the next one accumulate over ``window``
        (read at each batch, as Lightning reads it), and the next batch plans again."""
        self.window, self.accumulating = window, window > 1
        self.next_batch = 0

    # ---- the rules, read by the loop and the callbacks ------------------------------------------------------
    @property
    def logger_step(self) -> int:
        """The step of the logger's rows: the batches that stepped (Lightning's ``_batches_that_stepped``)."""
        return self._progress.batches_that_stepped

    @property
    def at_sync_point(self) -> bool:
        """The batch being run is one where the ranks combine decisions (``Progress.at_sync_point``)."""
        return self._progress.at_sync_point

    def epoch_ends(self) -> bool:
        """The batch being run is the epoch's last."""
        progress = self._progress
        return progress.batch_idx + 1 == self._max_batches or progress.is_last_batch

    def accumulates(self) -> bool:
        """The batch being run only accumulates gradients: it ends neither its accumulation window nor the epoch."""
        window = self.window
        return window > 1 and (self._progress.batch_idx + 1) % window != 0 and not self.epoch_ends()

    def starts_window(self, batch_idx: int) -> bool:
        """``batch_idx`` opens an accumulation window: its gradients are zeroed before its backward."""
        return batch_idx % self.window == 0

    def is_log_step(self) -> bool:
        """The next batch that steps (this one, if it steps) is a log step by count: every ``log_every_n_steps``
        batches that stepped, across epochs. Before a batch it is the count in Lightning's ``should_update_logs``,
        which counts the batch about to run, accumulating or not."""
        return self._progress.batches_that_stepped + 1 == self.log_at

    def updates_logs(self, should_stop: bool) -> bool:
        """Lightning's ``should_update_logs`` around a training batch: a log step by count, or a stop is set; never
        with ``log_every_n_steps=0``. The callbacks that log at log steps ask this."""
        return bool(self.rules.log_every_n_steps) and (self.is_log_step() or should_stop)

    def is_sync_point(self) -> bool:
        """Where the ranks combine decisions: a batch that steps and is a log step, or the epoch's last batch (every
        batch that steps under ``fast_dev_run``)."""
        return not self.accumulates() and (self.rules.fast_dev_run or self.is_log_step() or self.epoch_ends())

    def validates(self) -> bool:
        """Validation by count is due after this batch: every ``val_check_batch`` batches of the epoch, or of the
        run under ``check_val_every_n_epoch=None``."""
        return self._validation_index(self._progress.batch_idx) == self.validate_at

    def steps_due(self, n: int) -> bool:
        """``global_step`` is a multiple of ``n`` (a trigger added with ``every_n_steps(n)``)."""
        return self._progress.global_step % n == 0

    def validates_in_epoch(self, epoch: int) -> bool:
        """``check_val_every_n_epoch``: whether the epoch numbered ``epoch`` (from 0) validates."""
        return validates_in_epoch(self.rules.check_val_every_n_epoch, epoch)

    def validates_this_epoch(self) -> bool:
        """The fit validates, and in the epoch being run."""
        return self.rules.validation and self.validates_in_epoch(self._progress.epochs_completed)

    # ---- the plan ---------------------------------------------------------------------------------------------
    def start_epoch(
        self, start: int, max_batches: int | float, val_check_batch: int | float | None, last_val_time: float
    ) -> None:
        """Plan an epoch of ``max_batches`` from batch ``start`` (0, or the batch a resumed run is in), validating
        every ``val_check_batch`` batches (both can change when the loader is reloaded)."""
        rules = self.rules
        self._max_batches, self._val_check_batch = max_batches, val_check_batch
        manual = not rules.steps_schedulers
        self._every_batch = rules.fast_dev_run or rules.hooks_every_batch or (manual and bool(self._step_triggers))
        self.plan(start, last_val_time)

    def plan(self, start: int, last_val_time: float) -> None:
        """The next count of each rule from batch ``start`` on, and ``next_batch``. Called after every batch at
        which the rules ran (``start`` is the next batch) and when an epoch starts; ``last_val_time``: the
        ``time.monotonic()`` of the last validation."""
        rules, progress = self.rules, self._progress
        every = rules.log_every_n_steps
        stepped = progress.batches_that_stepped  # before start: the batches that stepped up to it
        self.log_at = _multiple_at_least(stepped + 1, every) if every else math.inf
        self.validate_at = math.inf
        interval = self._val_check_batch
        validating = self.validates_this_epoch()
        if validating and interval is not None and interval != math.inf:  # inf: at the epoch's end
            self.validate_at = _multiple_at_least(self._validation_index(start), interval)
        clocks = [due() for due in self._clocks]
        if validating and interval is None and not rules.distributed:
            clocks.append(last_val_time + rules.val_check_seconds)
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
        progress, window = self._progress, self.window
        stepped = progress.batches_that_stepped
        window_end = start + (-(start + 1)) % window  # the first batch from start that can step

        def stepping(n: int) -> int:
            """The batch at which the n-th batch that steps from ``start`` comes (the epoch's last is planned)."""
            return window_end + (n - 1) * window

        batches = [self._max_batches - 1]
        if self.log_at != math.inf:
            batches.append(stepping(self.log_at - stepped))
            if self._before_log_steps:
                before = self.log_at - 1 - stepped  # batches to step before is_log_step() holds
                batches.append(start if before == 0 else stepping(before) + 1)
        if self.validate_at != math.inf:
            batches.append(start + self.validate_at - self._validation_index(start))
        for frequency in self.rules.step_frequencies:  # batch_idx + 1 counts, at the batches that step
            batches.append(next_due_count(frequency, start + 1, every=window) - 1)
        for n in self._step_triggers:
            remaining = (-progress.global_step) % n
            # A batch that does not step keeps a multiple of n: the trigger acts at it again.
            batches.append(start if remaining == 0 and window_end > start else stepping(remaining or n))
        return min(batches)


def _multiple_at_least(value: int, every: int | float) -> int | float:
    return value + (-value) % every
