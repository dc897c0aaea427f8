"""``EarlyStopping``: stop ``fit`` when a monitored metric stops improving, with Lightning 2.6's rules and state."""

from __future__ import annotations

import logging
import numbers
import warnings
from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar

import torch

from gpulayer.trainer import Callback
from gpulayer.trainer.exceptions import MisconfiguredValueError

log = logging.getLogger(__name__)


class EarlyStoppingReason(Enum):
    """Why ``EarlyStopping`` stopped training (Lightning's values, saved as ints in checkpoints)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Monitor ``trainer.callback_metrics[monitor]`` and set ``trainer.should_stop`` when it stops improving.

    It checks at the end of each training epoch when validation runs once per epoch at its end (or when
    ``check_on_train_epoch_end=True``), else after every validation run. ``patience`` counts checks, not epochs.
    Every rank stops together: the decision is combined with ``trainer.runtime.any``.
    """

    mode_dict: ClassVar[dict[str, Callable[..., torch.Tensor]]] = {"min": torch.lt, "max": torch.gt}
    order_dict: ClassVar[dict[str, str]] = {"min": "<", "max": ">"}
    # Lightning's rule: early stopping sees the metrics the module logs in its own on_train_epoch_end.
    _runs_after_module_on_train_epoch_end = True

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        if mode not in self.mode_dict:  # Lightning's message, word for word
            raise MisconfiguredValueError(f"`mode` can be {', '.join(self.mode_dict.keys())}, got {mode}")
        _check_arguments(monitor, min_delta, patience, stopping_threshold, divergence_threshold)
        self.monitor = monitor
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.log_rank_zero_only = log_rank_zero_only
        self.wait_count = 0
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self._check_on_train_epoch_end = check_on_train_epoch_end
        # Stored with the sign that makes `monitor_op(current - min_delta, best)` the improvement test, as
        # Lightning does: a negative min_delta therefore accepts values slightly worse than the best.
        self.min_delta = min_delta if mode == "max" else -min_delta
        self.best_score = torch.tensor(torch.inf if mode == "min" else -torch.inf)

    @property
    def state_key(self) -> str:
        # Lightning's key: the class name and repr({'monitor': ..., 'mode': ...}), so checkpoints cross over.
        return type(self).__qualname__ + repr({"monitor": self.monitor, "mode": self.mode})

    @property
    def monitor_op(self) -> Callable[..., torch.Tensor]:
        return self.mode_dict[self.mode]

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._check_on_train_epoch_end is None:
            # Validation several times per epoch, or not every epoch: check after each validation instead. A
            # time-based val_check_interval (a timedelta) lands here too; Lightning 2.6 crashes on it.
            self._check_on_train_epoch_end = trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "stopped_epoch": self.stopped_epoch,
            "best_score": self.best_score,
            "patience": self.patience,
            "stopping_reason": self.stopping_reason.value,
            "stopping_reason_message": self.stopping_reason_message,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        self.best_score = state_dict["best_score"]
        self.patience = state_dict["patience"]
        self.stopping_reason = EarlyStoppingReason(
            state_dict.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value)
        )
        self.stopping_reason_message = state_dict.get("stopping_reason_message")

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._check_on_train_epoch_end and not _skips_check(trainer):
            self._run_early_stopping_check(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._check_on_train_epoch_end and not _skips_check(trainer):
            self._run_early_stopping_check(trainer)

    def _run_early_stopping_check(self, trainer: Any) -> None:
        metrics = trainer.callback_metrics
        if trainer.fast_dev_run or not self._monitor_is_available(metrics, trainer.is_global_zero):
            return
        current = metrics[self.monitor].squeeze()
        stops_here, reason = self._evaluate_stopping_criteria(current)
        should_stop = trainer.runtime.any(stops_here)
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            # Lightning stores `reason` here even on a rank stopped by another one, where it is an improvement
            # message or None; such a rank keeps None, so the message always explains a stop.
            self.stopping_reason_message = reason if stops_here else None
        if reason and self.verbose:
            self._log_info(trainer, reason)

    def _monitor_is_available(self, metrics: dict[str, torch.Tensor], is_global_zero: bool) -> bool:
        if self.monitor in metrics:
            return True
        message = (
            f"Early stopping conditioned on metric `{self.monitor}` which is not available."
            " Pass in or modify your `EarlyStopping` callback to use any of the following:"
            f" `{'`, `'.join(metrics)}`"
        )
        if self.strict:
            raise RuntimeError(message)
        if self.verbose and is_global_zero:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return False

    def _evaluate_stopping_criteria(self, current: torch.Tensor) -> tuple[bool, str | None]:
        """The first rule that applies, in Lightning's order: non-finite, stopping threshold, divergence,
        improvement, patience."""
        order = self.order_dict[self.mode]
        if self.check_finite and not torch.isfinite(current):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (
                f"Monitored metric {self.monitor} = {current} is not finite."
                f" Previous best value was {self.best_score:.3f}. Signaling Trainer to stop."
            )
        if self.stopping_threshold is not None and self.monitor_op(current, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (
                f"Stopping threshold reached: {self.monitor} = {current} {order} {self.stopping_threshold}."
                " Signaling Trainer to stop."
            )
        if self.divergence_threshold is not None and self.monitor_op(-current, -self.divergence_threshold):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (
                f"Divergence threshold reached: {self.monitor} = {current} {order} {self.divergence_threshold}."
                " Signaling Trainer to stop."
            )
        if self.monitor_op(current - self.min_delta, self.best_score.to(current.device)):
            reason = self._improvement_message(current)
            self.best_score = current
            self.wait_count = 0
            return False, reason
        self.wait_count += 1
        if self.wait_count < self.patience:
            return False, None
        self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
        return True, (
            f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} records."
            f" Best score: {self.best_score:.3f}. Signaling Trainer to stop."
        )

    def _improvement_message(self, current: torch.Tensor) -> str:
        if torch.isfinite(self.best_score):
            return (
                f"Metric {self.monitor} improved by {abs(self.best_score - current):.3f} >="
                f" min_delta = {abs(self.min_delta)}. New best score: {current:.3f}"
            )
        return f"Metric {self.monitor} improved. New best score: {current:.3f}"

    def _log_info(self, trainer: Any, message: str) -> None:
        rank = trainer.global_rank if trainer.world_size > 1 else None
        if rank is None:
            log.info(message)
        elif not self.log_rank_zero_only or rank == 0:
            log.info(f"[rank: {rank}] {message}")


def _check_arguments(monitor: Any, min_delta: Any, patience: Any, stopping: Any, divergence: Any) -> None:
    """Values Lightning takes here but fails on at the first check, with an error that names none of them."""
    if not isinstance(monitor, str):
        raise TypeError(f"monitor={monitor!r}: accepted values are the name of a logged metric (a str)")
    for name, value in (("min_delta", min_delta), ("patience", patience)):
        if not isinstance(value, (numbers.Real, torch.Tensor)):
            raise TypeError(f"{name}={value!r}: accepted values are numbers")
    for name, value in (("stopping_threshold", stopping), ("divergence_threshold", divergence)):
        if value is not None and not isinstance(value, (numbers.Real, torch.Tensor)):
            raise TypeError(f"{name}={value!r}: accepted values are None or a number")


def _skips_check(trainer: Any) -> bool:
    return trainer.state.fn != "fit" or trainer.sanity_checking
