"""The training loop: epochs, batches, when to validate and when to stop (reference §1, §4.1, §4.2).

Nothing here reads a tensor back to the host: losses and logged values stay on the device, and only the log
line (every ``log_every_n_steps`` steps) and epoch ends read them.
"""

from __future__ import annotations

import math
import time
import warnings
from datetime import timedelta
from typing import Any

from gpulayer.trainer.data import as_loader_list, batches, num_batches
from gpulayer.trainer.results import ResultCollection


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
        return trainer.should_stop and self.can_stop_early()

    # ---- data --------------------------------------------------------------------------------------------------
    def setup_data(self) -> None:
        """Request the train loader once; create epoch 0's iterator at once, as Lightning does."""
        trainer = self.trainer
        if self.loader is not None or trainer.args.limit_train_batches == 0:
            return
        (self.loader,) = as_loader_list(trainer._train_source.request(trainer._hooks, trainer.global_rank), "train")
        self.max_batches = num_batches(self.loader, trainer.args.limit_train_batches, "train")
        self.iterator = iter(self.loader)
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
        if self.done() or trainer.args.limit_train_batches == 0:
            return
        trainer._epochs_completed = self.epochs_processed
        self.val_enabled = trainer._val_loop.is_enabled()
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
        hooks.both("on_train_epoch_start")
        if trainer.current_epoch > 0 and self.iterator is None:
            self.iterator = iter(self.loader)
        iterator, self.iterator = self.iterator, None
        self.batch_idx, self.is_last_batch = -1, False
        epoch_batches = batches(trainer._batch_source(iterator), self.max_batches)
        # Lightning checks whether to stop before fetching: a stopped epoch draws no extra batch.
        while not self._epoch_should_end():
            fetched = next(epoch_batches, None)
            if fetched is None:
                break
            batch_idx, batch, self.is_last_batch = fetched
            self.batch_idx = batch_idx
            self.total_batches += 1
            if not self.run_batch(trainer._transfer(batch, 0), batch_idx):
                break
            self.after_batch()
        self.end_epoch()

    def _epoch_should_end(self) -> bool:
        trainer = self.trainer
        if _reached(trainer.global_step, trainer.args.max_steps) or self.epoch_batches_reached():
            return True
        return trainer.should_stop and self.can_stop_early()

    def run_batch(self, batch: Any, batch_idx: int) -> bool:
        """One training batch; False when ``on_train_batch_start`` returned -1 (the epoch ends)."""
        trainer, hooks, hub = self.trainer, self.trainer._hooks, self.trainer._metric_hub
        hub.on_batch_start(batch)
        hooks.callbacks("on_train_batch_start", batch, batch_idx)
        if hooks.module("on_train_batch_start", batch, batch_idx) == -1:
            self.is_last_batch = True
            self.step_schedulers(interval="step")
            self.step_schedulers(interval="epoch")
            return False
        outputs = trainer._optimization.run(batch, batch_idx, self.should_accumulate())
        self.step_schedulers(interval="step")
        if self.epoch_batches_reached():
            self.step_schedulers(interval="epoch")
        hooks.both("on_train_batch_end", outputs, batch, batch_idx)
        hub.on_batch_end()
        trainer._log_line.after_batch(self, batch)
        return True

    def after_batch(self) -> None:
        """Validation when due, step plateau schedulers, and the logger step count (Lightning's ``on_advance_end``)."""
        trainer, hub = self.trainer, self.trainer._metric_hub
        if self.should_validate_now():
            first_loop_iter = hub.first_loop_iter
            if not self.should_accumulate():
                trainer._hooks.module("on_validation_model_zero_grad")
            trainer._run_validation()
            hub.activate(self.results)
            hub.first_loop_iter = first_loop_iter
        self.step_schedulers(interval="step", plateau=True)
        if not self.should_accumulate():
            self.batches_that_stepped += 1

    def end_epoch(self) -> None:
        trainer, hooks, hub = self.trainer, self.trainer._hooks, self.trainer._metric_hub
        hub.epoch_end_reached()
        self.epochs_processed += 1
        hooks.callbacks("on_train_epoch_end", monitoring=False)
        hooks.module("on_train_epoch_end")
        hooks.callbacks("on_train_epoch_end", monitoring=True)
        hub.flush()
        if self.epoch_batches_reached():
            self.step_schedulers(interval="epoch", plateau=True)
        hub.reset_results()
        trainer._epochs_completed = self.epochs_processed

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
        if trainer.should_stop and self.can_stop_early():
            return True
        if self.val_check_batch is None:
            return time.monotonic() - trainer._last_val_time >= trainer.args.val_check_interval.total_seconds()
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
