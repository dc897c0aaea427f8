"""What ``self.log`` stores: values accumulated on the device, read only when someone asks for them.

One ``ResultCollection`` per loop (train, validate, test) keyed by ``"<hook>.<name>[.<dataloader_idx>]"``
as Lightning keys them. A logged value is detached and kept on its device; epoch means are weighted by batch
size, ``sum(v_i * bs_i) / sum(bs_i)``; nothing here calls ``.item()``. A logged ``torchmetrics.Metric`` is kept
as the object itself (``LoggedTorchMetric``): its step value is what its last ``metric(...)`` call returned, its
epoch value its ``compute()``, and the loop's end-of-epoch reset resets it (Lightning 2.6's ``_ResultMetric``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from gpulayer.trainer.batch import NO_BATCH_SIZE, batch_size_of
from gpulayer.trainer.exceptions import MisconfiguredValueError
from gpulayer.trainer.logging.rank_zero import rank_zero_only

DATALOADER_SUFFIX = "/dataloader_idx_{}"
_STEP, _EVAL_STEP, _EPOCH_ONLY = ((True, False), True), ((False, True), True), ((False, True), False)
# Lightning's table: (default on_step, on_epoch), and whether both flags are free; absent hooks cannot log.
_LOG_LEVELS = {
    **dict.fromkeys(
        (
            "training_step",
            "on_train_batch_start",
            "on_train_batch_end",
            "on_before_backward",
            "backward",
            "on_after_backward",
            "on_before_optimizer_step",
            "optimizer_step",
            "configure_gradient_clipping",
            "clip_gradients",
            "on_before_zero_grad",
            "optimizer_zero_grad",
        ),
        _STEP,
    ),
    **dict.fromkeys(
        (
            "validation_step",
            "test_step",
            "on_validation_batch_start",
            "on_validation_batch_end",
            "on_test_batch_start",
            "on_test_batch_end",
        ),
        _EVAL_STEP,
    ),
    **dict.fromkeys(
        (
            "on_train_start",
            "on_train_epoch_start",
            "on_train_epoch_end",
            "on_validation_start",
            "on_validation_epoch_start",
            "on_validation_epoch_end",
            "on_test_start",
            "on_test_epoch_start",
            "on_test_epoch_end",
        ),
        _EPOCH_ONLY,
    ),
}
_REDUCTIONS: dict[Any, str] = {
    "mean": "mean",
    "avg": "mean",
    "sum": "sum",
    "max": "max",
    "min": "min",
    torch.mean: "mean",
    torch.sum: "sum",
    sum: "sum",
    torch.max: "max",
    max: "max",
    torch.min: "min",
    min: "min",
}


def log_levels(fx: str | None, on_step: bool | None, on_epoch: bool | None) -> tuple[bool, bool]:
    """Lightning's defaults and permissions for logging from hook ``fx``."""
    levels = _LOG_LEVELS.get(fx) if fx is not None else None
    if levels is None:
        raise RuntimeError(f"self.log cannot be called from {fx or 'outside a Trainer hook'}")
    (default_step, default_epoch), free = levels
    on_step = default_step if on_step is None else on_step
    on_epoch = default_epoch if on_epoch is None else on_epoch
    if not free and (on_step, on_epoch) != (False, True):
        raise MisconfiguredValueError(
            f"self.log in {fx} accepts only on_step=False, on_epoch=True (got {on_step}, {on_epoch})"
        )
    if not on_step and not on_epoch:
        raise MisconfiguredValueError(
            f"self.log in {fx} with on_step=False and on_epoch=False records nothing; set one of them"
        )
    return bool(on_step), bool(on_epoch)


def reduction(reduce_fx: Any) -> str:
    key = reduce_fx.lower() if isinstance(reduce_fx, str) else reduce_fx
    try:
        return _REDUCTIONS[key]
    except (KeyError, TypeError):
        raise MisconfiguredValueError(
            f"reduce_fx={reduce_fx!r}: accepted values are 'mean' (or 'avg'), 'sum', 'max', 'min' and the matching "
            "torch or builtin functions"
        ) from None


# Reduces a tensor across ranks with an op ("sum", "mean", "max", "min"): Runtime.all_reduce.
Sync = Callable[[torch.Tensor, str], torch.Tensor]


class Meta(NamedTuple):
    """How one key was logged; a tuple so that building and comparing it on every step is cheap."""

    fx: str
    name: str
    prog_bar: bool
    logger: bool
    on_step: bool
    on_epoch: bool
    reduce: str
    enable_graph: bool
    add_dataloader_idx: bool
    dataloader_idx: int | None
    sync_dist: bool
    metric_attribute: str | None = None

    def names(self, on_step: bool) -> tuple[str, str]:
        """(plain name, forked name): ``x`` and ``x_step``/``x_epoch`` when both levels are on."""
        forked = f"{self.name}_{'step' if on_step else 'epoch'}" if self.on_step and self.on_epoch else self.name
        if self.add_dataloader_idx and self.dataloader_idx is not None:
            suffix = DATALOADER_SUFFIX.format(self.dataloader_idx)
            return self.name + suffix, forked + suffix
        return self.name, forked


class Metric:
    """One logged key: its latest step value and its epoch accumulator, both tensors on the device."""

    __slots__ = ("computed", "has_reset", "meta", "step_reduced", "step_value", "total", "weight")

    def __init__(self, meta: Meta) -> None:
        self.meta = meta
        self.reset()

    def update(self, value: torch.Tensor, batch_size: int) -> None:
        self.computed = None
        self.step_reduced = None
        self.has_reset = False
        if self.meta.on_step:
            self.step_value = value
            if not self.meta.on_epoch:
                return
        if self.total is None:
            self.total = value * batch_size if self.meta.reduce == "mean" else value
        elif self.meta.reduce == "mean":
            self.total = self.total + value * batch_size
        elif self.meta.reduce == "sum":
            self.total = self.total + value
        else:
            self.total = (torch.maximum if self.meta.reduce == "max" else torch.minimum)(self.total, value)
        self.weight += batch_size

    def step(self, sync: Sync | None) -> torch.Tensor | None:
        """The latest step value; with ``sync_dist`` reduced across ranks once ``sync`` is given (then kept)."""
        if sync is None or not self.meta.sync_dist or self.step_value is None:
            return self.step_reduced if self.step_reduced is not None else self.step_value
        if self.step_reduced is None:
            self.step_reduced = sync(self.step_value.clone(), self.meta.reduce)
        return self.step_reduced

    def compute(self, sync: Sync | None, distributed: bool) -> torch.Tensor | None:
        """The epoch value. A ``sync_dist`` value on several ranks is reduced once ``sync`` is given; before that
        this rank's own value is returned and not kept."""
        if self.computed is None and self.total is not None:
            total, weight = self.total, self.weight
            if distributed and self.meta.sync_dist:
                if sync is None:
                    return total / weight if self.meta.reduce == "mean" else total
                total = sync(total.clone(), "sum" if self.meta.reduce == "mean" else self.meta.reduce)
                weight = sync(torch.tensor(float(weight), device=total.device), "sum")
            self.computed = total / weight if self.meta.reduce == "mean" else total
        return self.computed

    def reset(self) -> None:
        self.step_value: torch.Tensor | None = None
        self.step_reduced: torch.Tensor | None = None
        self.total: torch.Tensor | None = None
        self.weight = 0
        self.computed: torch.Tensor | None = None
        self.has_reset = True


class LoggedTorchMetric:
    """One key logged with a ``torchmetrics.Metric``: the Metric syncs across ranks in its own ``compute()``, so
    ``sync_dist`` does not apply, and a read that some ranks may not make (``sync=None``) computes nothing."""

    __slots__ = ("computed", "has_reset", "meta", "metric", "step_value")

    def __init__(self, meta: Meta) -> None:
        self.meta = meta
        self.metric: Any = None
        self.step_value: torch.Tensor | None = None
        self.computed: torch.Tensor | None = None
        self.has_reset = True

    def update(self, metric: Any, batch_size: int) -> None:
        self.metric, self.step_value, self.computed, self.has_reset = metric, metric._forward_cache, None, False

    def step(self, sync: Sync | None) -> torch.Tensor | None:
        return self._checked(self.step_value)

    def compute(self, sync: Sync | None, distributed: bool) -> torch.Tensor | None:
        if self.computed is None and self.metric is not None and not (distributed and sync is None):
            self.computed = self._checked(self.metric.compute())
        return self.computed

    def _checked(self, value: Any) -> torch.Tensor | None:
        if value is None:
            return None
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"self.log({self.meta.name!r}, <torchmetrics.Metric>): its value must be a tensor, got "
                f"{type(value).__name__}; log the metric's entries one by one"
            )
        return value if self.meta.enable_graph else value.detach()

    def reset(self) -> None:
        """The end-of-epoch reset: the user's Metric is reset too, as Lightning does."""
        if self.metric is not None:
            self.metric.reset()
        self.step_value = self.computed = None
        self.has_reset = True


class ResultCollection(dict):
    """The metrics one loop logged. ``batch`` and ``dataloader_idx`` are the batch being processed."""

    def __init__(self, training: bool) -> None:
        super().__init__()
        self.training = training
        self.batch: Any = None
        self.batch_size: int | None = None
        self.dataloader_idx: int | None = None
        self.by_call: dict[tuple, Metric | LoggedTorchMetric] = {}  # by a self.log call's arguments (Module.log)

    def metric(self, meta: Meta, torchmetric: bool = False) -> Metric | LoggedTorchMetric:
        """The Metric that ``meta`` logs to, made at its first use; another ``meta`` for the same key is an error.
        ``torchmetric``: the value logged is a ``torchmetrics.Metric``."""
        key = f"{meta.fx}.{meta.name}"
        if meta.add_dataloader_idx and meta.dataloader_idx is not None:
            key += f".{meta.dataloader_idx}"
        metric = self.get(key)
        if metric is None:
            metric = self[key] = LoggedTorchMetric(meta) if torchmetric else Metric(meta)
        elif metric.meta != meta or isinstance(metric, LoggedTorchMetric) != torchmetric:
            raise MisconfiguredValueError(
                f"self.log({meta.name!r}, ...) was called twice in {meta.fx} with different arguments"
            )
        return metric

    def log(self, metric: Metric | LoggedTorchMetric, value: Any, batch_size: int | None) -> None:
        meta = metric.meta
        metric.update(value, self._batch_size(meta, batch_size) if meta.on_epoch else 1)  # step values: unused

    def _batch_size(self, meta: Meta, batch_size: int | None) -> int:
        if batch_size is not None:
            return batch_size
        if self.batch_size is None:
            if self.batch is None or not (meta.on_epoch and meta.reduce == "mean"):
                return 1
            self.batch_size = batch_size_of(self.batch, warn=rank_zero_only.rank == 0)  # Lightning's rank_zero_warn
            if self.batch_size is None:
                raise MisconfiguredValueError(NO_BATCH_SIZE)
        return self.batch_size

    def metrics(self, on_step: bool, sync: Sync | None = None, distributed: bool = False) -> tuple[dict, dict, dict]:
        """(callback, logged, progress-bar) tensors for the step or the epoch, as Lightning names them.

        ``sync`` reduces ``sync_dist`` values across ranks: pass it only where every rank calls this.
        """
        callback: dict[str, torch.Tensor] = {}
        logged: dict[str, torch.Tensor] = {}
        bar: dict[str, torch.Tensor] = {}
        for metric in self.values():
            meta = metric.meta
            if metric.has_reset or meta.dataloader_idx != self.dataloader_idx:
                continue
            if on_step:
                value = metric.step(sync) if meta.on_step else None
            else:
                value = metric.compute(sync, distributed) if meta.on_epoch else None
            if value is None:
                continue
            name, forked = meta.names(on_step)
            if meta.logger:
                logged[forked] = value
            if self.training or (meta.on_epoch and not on_step):
                callback[name] = value
                callback[forked] = value
            if meta.prog_bar:
                bar[forked] = value
        return callback, logged, bar

    def reset(self, fx: str | None = None) -> None:
        """Everything (the end of an epoch or evaluation), or the tensors one hook logged (a new epoch's first log;
        Lightning leaves logged torchmetrics alone there)."""
        for metric in self.values():
            if fx is None or (metric.meta.fx == fx and isinstance(metric, Metric)):
                metric.reset()
