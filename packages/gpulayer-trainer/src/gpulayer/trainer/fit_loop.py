"""The training loop: epochs, batches, when to validate and when to stop.

Lightning 2.6's are ``_FitLoop`` and ``_TrainingEpochLoop`` (``lightning/pytorch/loops/fit_loop.py`` and
``training_epoch_loop.py``).

Nothing here reads a tensor back to the host: losses and logged values stay on the device, and only the log
line (every ``log_every_n_steps`` steps) and epoch ends read them.

On several ranks every decision that ends or skips work must be the same on each. Batch counts are agreed at
setup; ``should_stop`` (however it was set, on however many ranks) and time-based validation are combined with
``Runtime.any`` at sync points that every rank reaches: every ``log_every_n_steps`` optimizer steps, the last
batch of an epoch, after validation and at the epoch end. Between them the loop acts on the last agreed value.
A SIGTERM is combined in the same collective: once agreed, every rank saves and ends ``fit`` (preemption.py).
"""

from __future__ import annotations

import math
import time
import warnings
from datetime import timedelta
from typing import Any

import torch

from gpulayer.trainer.data import (
    agreed_batches,
    as_loader_list,
    batches,
    data_rng_state,
    has_length,
    num_batches,
    set_data_rng_state,
    stop_together,
)
from gpulayer.trainer.hooks import is_overridden
from gpulayer.trainer.module import Module
from gpulayer.trainer.preemption import SIGTERMException, hpc_save_path
from gpulayer.trainer.results import ResultCollection
from gpulayer.trainer.samplers import set_sampler_epoch, with_distributed_sampler

_NONFINITE_LOSS = 3  # above a SIGTERM (2) and should_stop (1) in the level the ranks agree on


class NonFiniteLossError(ValueError):
    """The training loss became NaN or inf (``Trainer(check_finite_loss=False)`` trains on)."""


class FitLoop:
    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.results = ResultCollection(training=True)
        self.loader: Any = None
        self.iterator: Any = None
        self.max_batches: int | float = 0
        self.val_check_batch: int | float | None = None
        self.epochs_processed = 0
        self.batches_that_stepped = 0
        self.total_batches = 0
        self.batch_idx = -1
        self.is_last_batch = False
        self.min_epochs = 0
        self.max_epochs = -1
        self.val_enabled = False
        self.agreed_stop = False  # should_stop as every rank last agreed on it (several ranks only)
        self.preempting = False  # a SIGTERM reached some rank, as the ranks last agreed (several ranks only)
        self.at_sync_point = False  # whether the batch being run is one where the ranks combine decisions
        self.distributed = trainer.world_size > 1
        self._combine_batch_start = False
        # Where the run is, for checkpoints: "idle", "batch" (up to on_train_batch_end), "validation" (after a
        # batch), "epoch_end"; and the RNG states at which this epoch's iterator was made and first read.
        self.phase = "idle"
        self.data_snapshots: dict[str, Any] = {}
        self.resume: dict[str, Any] | None = None

    # ---- limits ------------------------------------------------------------------------------------------------
    def resolve_limits(self) -> None:
        """Lightning resolves ``max_epochs``/``min_epochs`` at the start of ``fit``."""
        args = self.trainer.args
        if args.max_epochs is None:
            if args.max_steps == -1 and args.max_time is None:
                warnings.warn(
                    "max_epochs was not set: training stops after 1000 epochs. Set max_epochs=-1 to train without "
                    "an epoch limit.",
                    UserWarning,
                    stacklevel=4,
                )
                self.max_epochs = 1000
            else:
                self.max_epochs = -1
        else:
            self.max_epochs = args.max_epochs
        self.min_epochs = args.min_epochs if args.min_epochs is not None else (1 if args.min_steps is not None else 0)

    def can_stop_early(self) -> bool:
        min_steps = self.trainer.args.min_steps
        met_epochs = self.epochs_processed >= self.min_epochs if self.min_epochs else True
        met_steps = self.trainer.global_step >= min_steps if min_steps else True
        return met_epochs and met_steps

    def done(self) -> bool:
        trainer = self.trainer
        if self.max_batches == 0:
            return True
        if _reached(trainer.global_step, trainer.args.max_steps):
            return True
        if _reached(self.epochs_processed, self.max_epochs):
            trainer._epochs_completed = self.epochs_processed
            return True
        return self.stop_requested() and self.can_stop_early()

    def stop_requested(self) -> bool:
        """``should_stop`` on one process; on several, the value the ranks last agreed on."""
        return self.agreed_stop if self.distributed else self.trainer.should_stop

    def agree_on_stop(self, loss: torch.Tensor | None = None) -> None:
        """At a point every rank reaches: stop everywhere if ``should_stop`` is set anywhere, preempt everywhere
        if a SIGTERM reached any rank, and fail everywhere if this batch's ``loss`` is not finite on any rank (one
        collective for the three)."""
        trainer = self.trainer
        if self.distributed:
            level = 2 if trainer.received_sigterm else int(trainer.should_stop)
            own_loss_nonfinite = self._loss_is_nonfinite(loss)
            if own_loss_nonfinite:
                level = _NONFINITE_LOSS
            flags = torch.tensor([level], dtype=torch.int32, device=trainer.runtime.device)
            agreed = int(trainer.runtime.all_reduce(flags, "max").item())
            if agreed == _NONFINITE_LOSS:
                raise self._nonfinite_loss_error(loss if own_loss_nonfinite else None)
            self.preempting = agreed == 2
            self.agreed_stop = trainer.should_stop = agreed >= 1  # a preemption stops too: the same on every rank

    def check_loss_alone(self, loss: torch.Tensor | None) -> None:
        """On one process: fail if ``loss`` (of a log step or the epoch's last batch) is not finite."""
        if self._loss_is_nonfinite(loss):
            raise self._nonfinite_loss_error(loss)

    def _loss_is_nonfinite(self, loss: torch.Tensor | None) -> bool:
        if loss is None or not self.trainer.args.check_finite_loss:
            return False
        return not bool(torch.isfinite(loss.detach()).all())  # a host sync, at sync points only

    def _nonfinite_loss_error(self, loss: torch.Tensor | None) -> NonFiniteLossError:
        """``loss``: this rank's non-finite loss, or None when another rank's was the non-finite one."""
        trainer = self.trainer
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch}, batch_idx {self.batch_idx})"
        if loss is not None:
            what = f"the loss training_step returned is {loss.detach().flatten()[0].item()} at {where}"
        else:
            what = f"another rank's training_step loss is not finite at {where}"
        return NonFiniteLossError(
            f"{what}; the loss is checked at log steps (log_every_n_steps={trainer.args.log_every_n_steps}) and at "
            "each epoch's last batch, so it may have become non-finite a few steps earlier. "
            "Trainer(check_finite_loss=False) trains on regardless"
        )

    def preempt(self) -> None:
        """After a SIGTERM: save where every rank stands to ``hpc_ckpt_N.ckpt`` and end ``fit`` (exit status 143)."""
        trainer = self.trainer
        path = trainer.runtime.broadcast(hpc_save_path(trainer.default_root_dir) if trainer.is_global_zero else None)
        trainer.save_checkpoint(path)
        trainer.runtime.barrier()  # the file is complete before any rank exits
        if trainer.is_global_zero:
            print(f"SIGTERM: saved {path} at step {trainer.global_step}; fit(ckpt_path='hpc') resumes it", flush=True)
        raise SIGTERMException()

    def _preempted(self) -> bool:
        """On one process as soon as the SIGTERM arrived; on several once the ranks agreed on it."""
        return self.preempting or (self.trainer.received_sigterm and not self.distributed)

    # ---- data --------------------------------------------------------------------------------------------------
    def setup_data(self) -> None:
        """Request the train loader once; create epoch 0's iterator at once, as Lightning does."""
        trainer = self.trainer
        if self.loader is not None or trainer.args.limit_train_batches == 0:
            return
        (loader,) = as_loader_list(trainer._train_source.request(trainer._hooks, trainer.global_rank), "train")
        if trainer.args.use_distributed_sampler:
            loader = with_distributed_sampler(loader, "train", trainer.world_size, trainer.global_rank)
        self.loader = loader
        count = num_batches(loader, trainer.args.limit_train_batches, "train")
        (self.max_batches,) = agreed_batches(trainer.runtime, [count], "train")
        if self.epochs_processed == 0 and self.resume is None:
            self.iterator = self._new_iterator()
        if self.max_batches == 0:
            return
        interval = trainer.args.val_check_interval
        if isinstance(interval, timedelta):
            self.val_check_batch = None
            trainer._last_val_time = time.monotonic()
        elif isinstance(interval, int):
            self.val_check_batch = interval
            if (
                interval > self.max_batches
                and trainer.args.check_val_every_n_epoch is not None
                and trainer.args.limit_val_batches != 0
            ):
                raise ValueError(
                    f"val_check_interval={interval} is more than the {self.max_batches} training batches of an epoch; "
                    "set check_val_every_n_epoch=None to count batches across epochs, or limit_val_batches=0"
                )
        elif self.max_batches == math.inf:
            if interval != 1.0:
                raise ValueError(f"val_check_interval={interval!r}: a loader without a length needs 1.0 or an int")
            self.val_check_batch = math.inf
        else:
            self.val_check_batch = max(1, int(self.max_batches * interval))

    # ---- the run -----------------------------------------------------------------------------------------------
    def run(self) -> None:
        trainer = self.trainer
        self.setup_data()
        if self.resume is None:  # an epoch-end checkpoint's epoch is complete once training (re)starts
            trainer._epochs_completed = self.epochs_processed
        self.agreed_stop = self.preempting = False
        self.agree_on_stop()
        if self._preempted():
            self.preempt()
        if self.done() or trainer.args.limit_train_batches == 0:
            return
        self.val_enabled = trainer._val_loop.is_enabled()
        overridden = is_overridden("on_train_batch_start", trainer.lightning_module, Module)
        self._combine_batch_start = self.distributed and overridden
        if self.should_validate_this_epoch():
            trainer._val_loop.setup_data()
        trainer._metric_hub.activate(self.results)
        trainer._hooks.both("on_train_start")
        while not self.done():
            self.run_epoch()
        trainer._hooks.both("on_train_end")

    def run_epoch(self) -> None:
        trainer, hooks, hub = self.trainer, self.trainer._hooks, self.trainer._metric_hub
        hub.activate(self.results)
        resume, self.resume = self.resume, None
        if resume is None:
            hooks.both("on_train_epoch_start")
            iterator = self.iterator if self.iterator is not None else self._new_iterator()
            self.iterator = None
            self.batch_idx, self.is_last_batch = -1, False
            self.data_snapshots["first"] = data_rng_state(self.loader)
        else:
            iterator = self._replayed_iterator(resume["batch_idx"] + 1)
            self.batch_idx = resume["batch_idx"]
            self.is_last_batch = self.batch_idx + 1 == self.max_batches
            self.after_batch(validate=resume["phase"] == "batch")
        if self.distributed and not has_length(self.loader):
            iterator = stop_together(iterator, trainer.runtime)
        epoch_batches = batches(trainer._batch_source(iterator), self.max_batches, start=self.batch_idx + 1)
        transfers = trainer._transfers_batches()  # else _transfer hands every batch back as it is
        # Lightning checks whether to stop before fetching: a stopped epoch draws no extra batch.
        while not self._epoch_should_end():
            fetched = next(epoch_batches, None)
            if fetched is None:
                break
            batch_idx, batch, self.is_last_batch = fetched
            self.batch_idx = batch_idx
            self.total_batches += 1
            if not self.run_batch(trainer._transfer(batch, 0) if transfers else batch, batch_idx):
                break
            self.after_batch()
        self.end_epoch()

    def _new_iterator(self) -> Any:
        set_sampler_epoch(self.loader, self.epochs_processed)
        self.data_snapshots = {"iter": data_rng_state(self.loader)}
        return iter(self.loader)

    def _replayed_iterator(self, consumed: int) -> Any:
        """This epoch's iterator, remade from the RNG states it was made and first read with, past ``consumed``."""
        if self.max_batches == math.inf:
            warnings.warn(
                f"resuming in the middle of an epoch of a loader without a length: its first {consumed} batches are "
                "read again and skipped, which resumes exactly only if it yields the same batches in the same order",
                UserWarning,
                stacklevel=3,
            )
        now = torch.get_rng_state()
        set_sampler_epoch(self.loader, self.epochs_processed)
        set_data_rng_state(self.loader, self.data_snapshots["iter"])
        iterator = iter(self.loader)
        set_data_rng_state(self.loader, self.data_snapshots["first"])
        for _ in range(consumed):
            next(iterator)
        torch.set_rng_state(now)
        return iterator

    def _epoch_should_end(self) -> bool:
        trainer = self.trainer
        # _reached(global_step, max_steps), epoch_batches_reached() and stop_requested(), inlined: per batch.
        max_steps = trainer.args.max_steps
        if max_steps != -1 and trainer._global_step >= max_steps:
            return True
        if self.batch_idx + 1 == self.max_batches or self.is_last_batch:
            return True
        stop = self.agreed_stop if self.distributed else trainer.should_stop
        return stop and self.can_stop_early()

    def run_batch(self, batch: Any, batch_idx: int) -> bool:
        """One training batch; False when ``on_train_batch_start`` returned -1 (the epoch ends)."""
        trainer, hooks, hub = self.trainer, self.trainer._hooks, self.trainer._metric_hub
        self.phase = "batch"
        hub.on_batch_start(batch)
        skip_rest = (
            "on_train_batch_start" in hooks.active and hooks.both("on_train_batch_start", batch, batch_idx) == -1
        )
        if self._combine_batch_start:  # -1 on any rank ends the epoch on every rank (one collective per batch)
            skip_rest = trainer.runtime.any(skip_rest)
        if skip_rest:
            self.is_last_batch = True
            self.step_schedulers(interval="step")
            self.step_schedulers(interval="epoch")
            return False
        accumulate = self.should_accumulate()
        outputs, loss = trainer._optimization.run(batch, batch_idx, accumulate)
        if trainer.lr_scheduler_configs:  # step_schedulers does nothing without schedulers: no calls then
            self.step_schedulers(interval="step")
            if self.epoch_batches_reached():
                self.step_schedulers(interval="epoch")
        self.at_sync_point = self.distributed and self._is_sync_point()
        if self.at_sync_point:
            hub.flush()  # sync_dist values reduced before the callbacks of this batch read them
        if "on_train_batch_end" in hooks.active:
            hooks.both("on_train_batch_end", outputs, batch, batch_idx)
        hub.on_batch_end()
        if self.at_sync_point:
            self.agree_on_stop(loss)
        if not accumulate and self.log_step_due():
            if not self.distributed:
                self.check_loss_alone(loss)
            rows = hub.flush()  # reduces sync_dist values: every rank flushes here
            trainer._log_line.print(batch, loss)
            trainer._logger_rows.push(rows)
        else:
            if not (self.distributed or accumulate) and self.epoch_batches_reached():
                self.check_loss_alone(loss)
            trainer._log_line.count()
        if self.preempting or (trainer.received_sigterm and not self.distributed):  # _preempted(), inlined: per batch
            self.preempt()
        return True

    def log_step_due(self) -> bool:
        """Lightning's cadence for step metrics, on a stepping batch: every ``log_every_n_steps`` batches that
        stepped (counted across epochs), the batch that set ``should_stop``, and every step under ``fast_dev_run``."""
        args = self.trainer.args
        if args.fast_dev_run:
            return True
        every = args.log_every_n_steps
        stop = self.agreed_stop if self.distributed else self.trainer.should_stop  # stop_requested(), inlined
        return bool(every) and ((self.batches_that_stepped + 1) % every == 0 or stop)

    def _is_sync_point(self) -> bool:
        """Where the ranks combine decisions: the log steps (``should_stop`` aside) and the epoch's last batch."""
        if self.should_accumulate():
            return False
        every = self.trainer.args.log_every_n_steps
        log_step = bool(every) and (self.batches_that_stepped + 1) % every == 0
        return log_step or self.epoch_batches_reached() or bool(self.trainer.args.fast_dev_run)

    def after_batch(self, validate: bool = True) -> None:
        """Validation when due, step plateau schedulers, and the logger step count (Lightning's ``on_advance_end``)."""
        trainer, hub = self.trainer, self.trainer._metric_hub
        self.phase = "validation"
        if validate and self.val_enabled and self.should_validate_now():  # val_enabled: its first test, call-free
            first_loop_iter = hub.first_loop_iter
            if not self.should_accumulate():
                trainer._hooks.module("on_validation_model_zero_grad")
            trainer._run_validation()
            hub.activate(self.results)
            hub.first_loop_iter = first_loop_iter
            self.agree_on_stop()
            if self._preempted():
                self.preempt()
        if trainer.lr_scheduler_configs:
            self.step_schedulers(interval="step", plateau=True)
        if not self.should_accumulate():
            self.batches_that_stepped += 1

    def end_epoch(self) -> None:
        trainer, hooks, hub = self.trainer, self.trainer._hooks, self.trainer._metric_hub
        hub.epoch_end_reached()
        hub.flush()  # the epoch values, reduced where sync_dist asks, before any callback reads them
        self.epochs_processed += 1
        self.phase = "epoch_end"
        hooks.callbacks("on_train_epoch_end", monitoring=False)
        hooks.module("on_train_epoch_end")
        hub.flush()
        hooks.callbacks("on_train_epoch_end", monitoring=True)
        self.agree_on_stop()
        hub.flush()
        if self.epoch_batches_reached():
            self.step_schedulers(interval="epoch", plateau=True)
        # Lightning logs the epoch row at the step of the epoch's last step row.
        trainer._logger_rows.push(hub.flush(), step_offset=-1)
        hub.reset_results()
        trainer._epochs_completed = self.epochs_processed
        self.phase = "idle"
        if self._preempted():
            self.preempt()

    # ---- position, for checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "epochs_processed": self.epochs_processed,
            "epochs_completed": self.trainer._epochs_completed,
            "global_step": self.trainer.global_step,
            "batches_that_stepped": self.batches_that_stepped,
            "total_batches": self.total_batches,
            "batch_idx": self.batch_idx,
            "phase": self.phase,
            "data_snapshots": dict(self.data_snapshots),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` was saved: mid-epoch from the next batch, else with the next epoch."""
        self.epochs_processed = state["epochs_processed"]
        self.trainer._global_step = state["global_step"]
        # Saved in on_train_epoch_end, an epoch is processed but not yet completed: current_epoch catches up when
        # training starts, after the sanity check (which reports the saved epoch, as in Lightning).
        self.trainer._epochs_completed = state["epochs_completed"]
        self.batches_that_stepped = state["batches_that_stepped"]
        self.total_batches = state["total_batches"]
        self.data_snapshots = dict(state["data_snapshots"])
        self.iterator = None
        self.resume = state if state["phase"] in ("batch", "validation") else None

    # ---- decisions ---------------------------------------------------------------------------------------------
    def epoch_batches_reached(self) -> bool:
        return self.batch_idx + 1 == self.max_batches or self.is_last_batch

    def should_accumulate(self) -> bool:
        accumulation_done = (self.batch_idx + 1) % self.trainer.args.accumulate_grad_batches == 0
        return not accumulation_done and not self.epoch_batches_reached()

    def should_validate_this_epoch(self) -> bool:
        every = self.trainer.args.check_val_every_n_epoch
        return self.val_enabled and (every is None or (self.trainer.current_epoch + 1) % every == 0)

    def should_validate_now(self) -> bool:
        trainer = self.trainer
        if not self.should_validate_this_epoch():
            return False
        if self.is_last_batch and self.val_check_batch == math.inf:
            return True
        if self.stop_requested() and self.can_stop_early():
            return True
        if self.val_check_batch is None:
            due = time.monotonic() - trainer._last_val_time >= trainer.args.val_check_interval.total_seconds()
            if not self.distributed:
                return due
            return self.at_sync_point and trainer.runtime.any(due)  # the clocks of the ranks differ
        if self.val_check_batch == math.inf:
            return self.is_last_batch
        index = self.total_batches - 1 if trainer.args.check_val_every_n_epoch is None else self.batch_idx
        return (index + 1) % self.val_check_batch == 0

    def step_schedulers(self, interval: str, plateau: bool = False) -> None:
        """Lightning's ``update_lr_schedulers``: step-interval ones on stepping batches, by per-epoch batch index."""
        trainer = self.trainer
        if not trainer.lr_scheduler_configs or (interval == "step" and self.should_accumulate()):
            return
        for config in trainer.lr_scheduler_configs:
            if plateau != config.reduce_on_plateau or config.interval != interval:
                continue
            index = (self.batch_idx if interval == "step" else trainer.current_epoch) + 1
            if index % config.frequency:
                continue
            metric = None
            if config.reduce_on_plateau:
                metric = trainer.callback_metrics.get(config.monitor)
                if metric is None:
                    available = sorted(trainer.callback_metrics)
                    if config.strict:
                        raise RuntimeError(
                            f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; "
                            f"logged metrics: {available}. Set the scheduler dict's 'monitor' to one of them."
                        )
                    warnings.warn(
                        f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged, and strict=False: "
                        "the learning rate is not updated",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    continue
            trainer._hooks.module("lr_scheduler_step", config.scheduler, metric)


def _reached(current: int, maximum: int) -> bool:
    return maximum != -1 and current >= maximum
