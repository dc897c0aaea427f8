"""The training loop: epochs, batches, when to validate and when to stop.

Lightning 2.6's are ``_FitLoop`` and ``_TrainingEpochLoop`` (``lightning/pytorch/loops/fit_loop.py`` and
``training_epoch_loop.py``).

Nothing here reads a tensor back to the host: losses and logged values stay on the device, and only the log
line (every ``log_every_n_steps`` steps) and epoch ends read them. On several ranks every decision that ends or
skips work is the same on each: batch counts are agreed at setup, and stop, preemption and a non-finite loss at
sync points (``sync_decisions.py``); between them the loop acts on the last agreed values (``decided``).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.checkpoint.checkpoint import rng_states
from gpulayer.trainer.core.hooks import Hooks, is_overridden
from gpulayer.trainer.core.module import Module, warn_if_modules_in_eval_mode
from gpulayer.trainer.core.optimizers import step_schedulers
from gpulayer.trainer.data.data import (
    DataSource,
    agreed_batches,
    batches,
    data_rng_state,
    epoch_iterator,
    has_length,
    num_batches,
    reload_due,
    stop_together,
    train_loader,
    warn_too_few_batches_to_log,
)
from gpulayer.trainer.data.order_position import order_position, resumed_iterator
from gpulayer.trainer.data.samplers import sampled
from gpulayer.trainer.logging.results import ResultCollection
from gpulayer.trainer.loops.cadence import Cadence, CadenceRules, val_check_batch
from gpulayer.trainer.loops.optimization import ForwardOnly
from gpulayer.trainer.loops.progress import Progress, fit_limits
from gpulayer.trainer.loops.sync_decisions import SyncDecisions

if TYPE_CHECKING:
    from gpulayer.trainer.logging.log_line import LogLine
    from gpulayer.trainer.logging.logger_rows import LoggerRows
    from gpulayer.trainer.logging.metric_hub import MetricHub
    from gpulayer.trainer.loops.evaluation_loop import EvaluationLoop
    from gpulayer.trainer.loops.manual_optimization import ManualOptimization
    from gpulayer.trainer.loops.optimization import AutomaticOptimization
    from gpulayer.trainer.loops.transfer import BatchTransfer
    from gpulayer.trainer.trainer import Trainer


class FitLoop:
    """Trains: epochs and batches, one body per batch (``run_batch``). Holds the run's counters (``progress``), the
    plan of when its per-batch rules act (``cadence``), the train data, and the optimization of one batch
    (``optimization``, built by each ``fit``)."""

    def __init__(
        self,
        trainer: Trainer,
        *,
        hooks: Hooks,
        hub: MetricHub,
        logger_rows: LoggerRows,
        log_line: LogLine,
        val_loop: EvaluationLoop,
        transfer: BatchTransfer,
    ) -> None:
        self.trainer, self.args = trainer, trainer.args
        self.hooks, self.hub, self.logger_rows, self.log_line = hooks, hub, logger_rows, log_line
        self.val_loop, self.transfer = val_loop, transfer
        self.results = ResultCollection(training=True)
        self.source: DataSource | None = None
        self.optimization: AutomaticOptimization | ManualOptimization | ForwardOnly | None = None
        self.progress = Progress()
        self.loader: Any = None
        self.shape: Any = None  # puts each batch in the container the loader came in (``[loader]``: ``[batch]``)
        self.iterator: Any = None
        self.max_batches: int | float = 0
        self.val_check_batch: int | float | None = None
        self.last_val_time = 0.0
        self.loaded_at_epoch = 0  # the epoch the loader was last requested in (reload_dataloaders_every_n_epochs)
        self.min_epochs = 0
        self.max_epochs = -1
        self.step_limit: int | float = math.inf  # max_steps, with -1 as infinity
        self.val_enabled = False
        self.distributed = trainer.world_size > 1
        self.cadence = Cadence(CadenceRules(), self.progress, self.args.accumulate_grad_batches)  # each fit's: run
        self.decisions = SyncDecisions(trainer, self.progress.position)
        self.decided = self.decisions.decided  # should_stop and received_sigterm, as the loop acts on them
        self._combine_batch_start = False
        self._step_schedulers = False  # a scheduler with interval="step": the batch rules step it
        self._warned_none = False  # Lightning warns of a None training batch once per Trainer
        self.resume: dict[str, Any] | None = None

    def attach(self, source: DataSource) -> None:
        """The train data of the next ``fit``."""
        self.source, self.loader = source, None

    @property
    def _skip_backward(self) -> bool:
        """Lightning's flag, which its SWA sets for the batch-norm epoch: training batches run ``training_step``
        alone (``ForwardOnly``). It swaps what runs a batch, so a fit that never sets it pays nothing per step; under
        manual optimization ``training_step`` runs its own backward and steps, as in Lightning."""
        return isinstance(self.optimization, ForwardOnly)

    @_skip_backward.setter
    def _skip_backward(self, skip: bool) -> None:
        if skip and not (self.optimization.manual or self._skip_backward):
            self.optimization = ForwardOnly(self.optimization)
        elif not skip and self._skip_backward:
            self.optimization = self.optimization.optimization

    # ---- limits ------------------------------------------------------------------------------------------------
    def resolve_limits(self) -> None:
        """Lightning resolves ``max_epochs``/``min_epochs`` at the start of ``fit``."""
        self.max_epochs, self.min_epochs, self.step_limit = fit_limits(self.args)

    def can_stop_early(self) -> bool:
        min_steps, progress = self.args.min_steps, self.progress
        met_epochs = progress.epochs_processed >= self.min_epochs if self.min_epochs else True
        met_steps = progress.global_step >= min_steps if min_steps else True
        return met_epochs and met_steps

    def done(self) -> bool:
        progress = self.progress
        if self.max_batches == 0 or progress.global_step >= self.step_limit:
            return True
        if self.max_epochs != -1 and progress.epochs_processed >= self.max_epochs:
            progress.epochs_completed = progress.epochs_processed
            return True
        return self.decided.should_stop and self.can_stop_early()

    # ---- data --------------------------------------------------------------------------------------------------
    def setup_data(self, reload: bool = False) -> None:
        """Request the train loader once (again when ``reload``); create epoch 0's iterator at once, as Lightning
        does."""
        args, trainer = self.args, self.trainer
        if (self.loader is not None and not reload) or args.limit_train_batches == 0:
            return
        loader, self.shape = train_loader(self.source.request(self.hooks, trainer.global_rank))
        self.loader = loader = sampled(loader, "train", trainer, fitting=True)
        self.progress.order = order_position(loader, trainer.world_size)
        count = num_batches(loader, args.limit_train_batches, "train")
        (self.max_batches,) = agreed_batches(trainer.runtime, [loader], [count], "train")
        if self.progress.epochs_processed == 0 and self.resume is None:
            self.iterator = epoch_iterator(self.loader, self.progress)
        if self.max_batches == 0:
            return
        self.loaded_at_epoch = self.progress.epochs_completed
        self.val_check_batch = val_check_batch(args, self.max_batches)
        if self.val_check_batch is None and not reload:  # a time: the clock runs on across a reload
            self.last_val_time = time.monotonic()
        if self.max_batches < args.log_every_n_steps and trainer.loggers and not args.fast_dev_run:
            warn_too_few_batches_to_log(self.max_batches, args.log_every_n_steps, trainer.is_global_zero)

    # ---- the run -----------------------------------------------------------------------------------------------
    def sanity_check(self) -> None:
        """A few validation batches before training; its metrics are discarded (the caller keeps the RNG)."""
        trainer, hub = self.trainer, self.hub
        if not (self.val_loop.is_enabled() and self.args.num_sanity_val_steps > 0):
            return
        stage = trainer.state.stage
        trainer.sanity_checking = True
        try:
            hub.reset_results()
            hub.reset_metrics()
            self.hooks.callbacks("on_sanity_check_start")
            self._run_validation()
            self.hooks.callbacks("on_sanity_check_end")
            hub.activate(self.val_loop.results)
            hub.reset_results()
            hub.reset_metrics()
        finally:
            trainer.state.stage = stage  # Lightning restores the stage the sanity check interrupted

    def validate(self) -> None:
        """Validation between training batches (``trainer.validating`` while it runs, as in Lightning)."""
        self.trainer.validating = True
        self._run_validation()
        self.trainer.training = True

    def _run_validation(self) -> None:
        """Validation during ``fit``: always under ``no_grad`` (Lightning's rule, whatever ``inference_mode`` says)."""
        with torch.no_grad():
            ran = self.val_loop.run()
        if ran:
            self.last_val_time = time.monotonic()

    def run(self) -> None:
        progress = self.progress
        self.setup_data()
        if self.resume is None:  # an epoch-end checkpoint's epoch is complete once training (re)starts
            progress.epochs_completed = progress.epochs_processed
        self.decisions.reset()
        self.decisions.agree()
        self.decisions.preempt_if_asked()
        if self.done() or self.args.limit_train_batches == 0:
            return
        self.val_enabled = self.val_loop.is_enabled()
        overridden = is_overridden("on_train_batch_start", self.trainer.lightning_module, Module)
        self._combine_batch_start = self.distributed and overridden
        configs = self.trainer.lr_scheduler_configs
        self._step_schedulers = any(config.interval == "step" for config in configs)
        rules = CadenceRules.for_fit(
            self.args, self.hooks, self.optimization, configs, validation=self.val_enabled, distributed=self.distributed
        )
        # Callbacks add their triggers to it in on_train_start; it keeps the last fit's accumulation window.
        self.cadence = Cadence(rules, progress, self.cadence.window)
        progress.at_sync_point = False
        if self.cadence.validates_this_epoch():
            self.val_loop.setup_data()
        warn_if_modules_in_eval_mode(self.trainer.lightning_module, self.trainer.is_global_zero)
        self.hub.activate(self.results)
        self.hooks.both("on_train_start")
        self.log_line.start()
        while not self.done():
            self.run_epoch()
        self.hooks.both("on_train_end")

    def run_epoch(self) -> None:
        hooks, transfer, progress = self.hooks, self.transfer, self.progress
        self.hub.activate(self.results)
        resume, self.resume = self.resume, None
        if resume is None:
            if reload_due(self.args, progress.epochs_completed, self.loaded_at_epoch):
                self.setup_data(reload=True)
            hooks.both("on_train_epoch_start")
            iterator = self.iterator if self.iterator is not None else epoch_iterator(self.loader, self.progress)
            self.iterator, count = None, self.max_batches
            progress.batch_idx, progress.is_last_batch = -1, False
            progress.data_snapshots["first"] = data_rng_state(self.loader)
            self.cadence.start_epoch(0, count, self.val_check_batch, self.last_val_time)
        else:
            limit, zero = self.args.limit_train_batches, self.trainer.is_global_zero
            iterator, count = resumed_iterator(self.loader, progress, resume, self.max_batches, limit, zero)
            progress.batch_idx = resume["batch_idx"]
            progress.is_last_batch = progress.batch_idx + 1 == count
            # The rest of the resumed batch's rules read the plan.
            self.cadence.start_epoch(progress.batch_idx, count, self.val_check_batch, self.last_val_time)
            if resume["phase"] not in ("stopped", "step"):  # the batch had finished, or it runs again
                self.after_batch(self.cadence.accumulates(), validate=resume["phase"] == "batch")
            self.cadence.plan(progress.batch_idx + 1, self.last_val_time)
        if self.shape is not None:
            iterator = map(self.shape, iterator)
        if self.distributed and not has_length(self.loader):
            iterator = stop_together(iterator, self.trainer.runtime)
        epoch_batches = batches(transfer.source(iterator), count, start=progress.batch_idx + 1)
        moves = transfer.moves  # else the transfer hands every batch back as it is
        # Lightning checks whether to stop before fetching: a stopped epoch draws no extra batch.
        ended = self._epoch_should_end()
        while not ended:
            fetched = next(epoch_batches, None)
            if fetched is None:
                break
            batch_idx, batch, progress.is_last_batch = fetched
            progress.batch_idx = batch_idx
            progress.total_batches += 1
            if moves:
                batch = transfer(batch, 0)
            ended = self.run_batch(batch, batch_idx)
        if progress.global_step >= self.step_limit and not progress.is_last_batch:
            progress.stop(rng_states())
        self.end_epoch()

    def _epoch_should_end(self) -> bool:
        if self.progress.global_step >= self.step_limit or self.cadence.epoch_ends():
            return True
        return self.decided.should_stop and self.can_stop_early()

    def run_batch(self, batch: Any, batch_idx: int) -> bool:
        """One training batch: the step and its counters, and the per-batch rules at a batch the cadence planned, or
        where a stop, a SIGTERM or a clock rule is due. True when the epoch ends with it."""
        progress, hub, cadence, decided = self.progress, self.hub, self.cadence, self.decided
        progress.phase = "step"  # until the step ends: a checkpoint written before then runs this batch again
        hub.on_batch_start(batch)
        if batch is None:
            return self._skip_step(batch_idx)
        planned = batch_idx >= cadence.next_batch or progress.is_last_batch or decided.should_stop
        if planned and "on_train_batch_start" in self.hooks.active and self._batch_start_ends_epoch(batch, batch_idx):
            return True
        accumulate = cadence.accumulating and cadence.accumulates()
        outputs, loss = self.optimization.run(batch, batch_idx, accumulate)
        progress.phase = "batch"
        clock_due = cadence.clocks and cadence.clock_due <= time.monotonic()
        if planned or decided.should_stop or decided.received_sigterm or clock_due:
            return self._run_rules(outputs, loss, batch, batch_idx, accumulate)
        # The tail of end_batch and after_batch, inline (no call per batch); the phase is the one after_batch leaves.
        hub.on_batch_end()
        progress.phase = "validation"
        if not accumulate:
            progress.batches_that_stepped += 1
        return progress.global_step >= self.step_limit

    def _skip_step(self, batch_idx: int) -> bool:
        """A ``None`` batch (a ``collate_fn`` dropped it), as Lightning 2.6's ``_TrainingEpochLoop.advance``: a
        warning, no ``on_train_batch_start`` and no step (``global_step`` stays), then the batch's rules with
        ``outputs=None``; it counts in ``batch_idx`` and ``batches_that_stepped``. Its rules run as at a planned batch
        (a rule asked early does nothing), and the plan is made again from the counters it leaves."""
        if not self._warned_none and self.trainer.is_global_zero:
            warnings.warn("train_dataloader yielded None. If this was on purpose, ignore this warning...", stacklevel=4)
        self._warned_none = True
        self.progress.phase = "batch"
        return self._run_rules(None, None, None, batch_idx, self.cadence.accumulates())

    def _run_rules(self, outputs: Any, loss: torch.Tensor | None, batch: Any, batch_idx: int, accumulate: bool) -> bool:
        """The per-batch rules after a batch's step, and the plan from the next batch; True when the epoch ends."""
        self.end_batch(outputs, loss, batch, batch_idx, accumulate)
        self.after_batch(accumulate)
        self.cadence.plan(batch_idx + 1, self.last_val_time)
        return self._epoch_should_end()

    def _batch_start_ends_epoch(self, batch: Any, batch_idx: int) -> bool:
        """``on_train_batch_start``; -1 (on any rank) ends the epoch, with the schedulers stepped as Lightning does."""
        skip_rest = self.hooks.both("on_train_batch_start", batch, batch_idx) == -1
        if self._combine_batch_start:  # -1 on any rank ends the epoch on every rank (one collective per batch)
            skip_rest = self.trainer.runtime.any(skip_rest)
        if skip_rest:
            self.progress.is_last_batch = True
            self.step_schedulers(interval="step")
            self.step_schedulers(interval="epoch")
        return skip_rest

    def end_batch(self, outputs: Any, loss: torch.Tensor | None, batch: Any, batch_idx: int, accumulate: bool) -> None:
        """What follows a batch's optimization: schedulers, sync point, ``on_train_batch_end``, the log step."""
        hooks, hub, cadence, progress = self.hooks, self.hub, self.cadence, self.progress
        if self.trainer.lr_scheduler_configs:  # step_schedulers does nothing without schedulers: no calls then
            if self._step_schedulers:
                self.step_schedulers(interval="step")
            if cadence.epoch_ends():
                self.step_schedulers(interval="epoch")
        progress.at_sync_point = self.distributed and cadence.is_sync_point()
        if progress.at_sync_point:
            hub.flush()  # sync_dist values reduced before the callbacks of this batch read them
        if "on_train_batch_end" in hooks.active:
            hooks.both("on_train_batch_end", outputs, batch, batch_idx)
        hub.on_batch_end()
        if progress.at_sync_point:
            self.decisions.agree(loss)
        if not accumulate and self.log_step_due():
            if not self.distributed:
                self.decisions.check_loss_alone(loss)
            rows = hub.flush()  # reduces sync_dist values: every rank flushes here
            self.log_line.print(batch, loss)
            self.logger_rows.push(rows)
        elif not (self.distributed or accumulate) and cadence.epoch_ends():
            self.decisions.check_loss_alone(loss)
        if self.decided.received_sigterm:
            self.decisions.preempt_if_asked()

    def log_step_due(self) -> bool:
        """Lightning's cadence for step metrics, on a stepping batch: a log step by count, the batch that set
        ``should_stop``, and every step under ``fast_dev_run``."""
        args = self.args
        if args.fast_dev_run:
            return True
        return self.cadence.is_log_step() or (bool(args.log_every_n_steps) and self.decided.should_stop)

    def after_batch(self, accumulate: bool, validate: bool = True) -> None:
        """Validation when due, step plateau schedulers, and the logger step count (Lightning's ``on_advance_end``);
        ``accumulate``: the batch only accumulated gradients."""
        hub, progress = self.hub, self.progress
        progress.phase = "validation"
        if validate and self.val_enabled and self.should_validate_now():  # val_enabled: its first test, call-free
            first_loop_iter = hub.first_loop_iter
            if not accumulate:
                self.hooks.module("on_validation_model_zero_grad")
            self.validate()
            hub.activate(self.results)
            hub.first_loop_iter = first_loop_iter
            self.decisions.agree()
            self.decisions.preempt_if_asked()
        if self._step_schedulers:
            self.step_schedulers(interval="step", plateau=True)
        progress.at_sync_point = False
        if not accumulate:
            progress.batches_that_stepped += 1

    def end_epoch(self) -> None:
        hooks, hub, progress = self.hooks, self.hub, self.progress
        hub.epoch_end_reached()
        hub.flush()  # the epoch values, reduced where sync_dist asks, before any callback reads them
        progress.epochs_processed += 1
        progress.phase = "epoch_end"
        hooks.callbacks("on_train_epoch_end", monitoring=False)
        hooks.module("on_train_epoch_end")
        hub.flush()
        hooks.callbacks("on_train_epoch_end", monitoring=True)
        self.decisions.agree()
        hub.flush()
        if self.cadence.epoch_ends():
            self.step_schedulers(interval="epoch", plateau=True)
        # Lightning logs the epoch row at the step of the epoch's last step row.
        self.logger_rows.push(hub.flush(), step_offset=-1)
        hub.reset_results()
        progress.epochs_completed = progress.epochs_processed
        progress.phase = "idle"
        self.decisions.preempt_if_asked()

    # ---- position, for checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self.progress.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` was saved: mid-epoch from the next batch, else with the next epoch."""
        self.iterator = None
        self.resume = self.progress.load_state_dict(state, self.step_limit)

    # ---- decisions ---------------------------------------------------------------------------------------------
    def should_validate_now(self) -> bool:
        if not self.cadence.validates_this_epoch():
            return False
        if self.progress.is_last_batch and self.val_check_batch == math.inf:
            return True
        if self.decided.should_stop and self.can_stop_early():
            return True
        if self.val_check_batch is None:
            due = time.monotonic() - self.last_val_time >= self.cadence.rules.val_check_seconds
            if not self.distributed:
                return due
            return self.progress.at_sync_point and self.trainer.runtime.any(due)  # the clocks of the ranks differ
        return self.cadence.validates()

    def step_schedulers(self, interval: str, plateau: bool = False) -> None:
        """The schedulers of ``interval`` due now: step-interval ones on stepping batches only."""
        configs, progress = self.trainer.lr_scheduler_configs, self.progress
        if not configs or not self.optimization.steps_schedulers or (interval == "step" and self.cadence.accumulates()):
            return
        count = (progress.batch_idx if interval == "step" else progress.epochs_completed) + 1
        step_schedulers(configs, interval, count, self.hooks, lambda: self.trainer.callback_metrics, plateau)
