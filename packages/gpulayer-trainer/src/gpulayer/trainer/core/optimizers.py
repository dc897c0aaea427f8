"""What ``configure_optimizers`` may return, in every form Lightning accepts, and when the schedulers it returned
step."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler, OneCycleLR, ReduceLROnPlateau

from gpulayer.trainer.core.hooks import is_overridden
from gpulayer.trainer.core.module import Module
from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError

if TYPE_CHECKING:
    from gpulayer.trainer.core.hooks import Hooks

_FORMS = (
    "an optimizer; a list or tuple of optimizers; a pair ([optimizers], [schedulers or scheduler dicts]); "
    'a dict {"optimizer": ..., "lr_scheduler": scheduler or scheduler dict, "monitor": ...}; '
    "a list or tuple of such dicts; or None"
)


@dataclass
class LRSchedulerConfig:
    """Lightning's scheduler config: when and how often a scheduler steps, and what a plateau one monitors."""

    scheduler: Any
    name: str | None = None
    interval: str = "epoch"
    frequency: int = 1
    reduce_on_plateau: bool = False
    monitor: str | None = None
    strict: bool = True


class _NoOptimizer(torch.optim.Optimizer):
    """Stands in when ``configure_optimizers`` returns None: training runs, nothing is updated."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {})

    def step(self, closure: Any = None) -> Any:
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def parse_optimizers(returned: Any, module: Module) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
    """Parse what ``module.configure_optimizers()`` returned; errors name the method and the accepted forms. Under
    manual optimization the schedulers are taken as returned (the module steps them), as Lightning does."""
    if returned is None:
        warnings.warn(
            "configure_optimizers returned None: training runs without an optimizer",
            UserWarning,
            stacklevel=3,
        )
        return [_NoOptimizer()], []
    optimizers, schedulers, monitor = _split(returned)
    automatic = module.automatic_optimization
    configs = [_scheduler_config(s, monitor) if automatic else _manual_config(s) for s in schedulers]
    for config in configs:
        if getattr(config.scheduler, "optimizer", None) not in optimizers:
            raise MisconfiguredValueError(
                f"configure_optimizers returned the scheduler {type(config.scheduler).__name__} for an optimizer it "
                "did not return"
            )
        if automatic:
            _require_step_api(config.scheduler, module)
    return optimizers, configs


def _require_step_api(scheduler: Any, module: Module) -> None:
    """Lightning's ``_validate_scheduler_api``: the Trainer steps only PyTorch's schedulers itself."""
    if not isinstance(scheduler, (LRScheduler, ReduceLROnPlateau)) and not is_overridden(
        "lr_scheduler_step", module, Module
    ):
        raise MisconfiguredTypeError(
            f"configure_optimizers returned the lr scheduler {type(scheduler).__name__}, which is not a PyTorch "
            "LRScheduler or ReduceLROnPlateau; override the module's lr_scheduler_step to step it"
        )


def _manual_config(scheduler: Any) -> LRSchedulerConfig:
    """Lightning's ``_configure_schedulers_manual_opt``: the module steps its schedulers, so what says when the
    Trainer would step them (a plateau's monitor, strict) is ignored with a warning."""
    if not isinstance(scheduler, dict):
        return LRSchedulerConfig(scheduler)
    ignored = [key for key in scheduler if key in ("reduce_on_plateau", "monitor", "strict")]
    if ignored:
        warnings.warn(
            f"The lr scheduler dict contains the key(s) {ignored}, but the keys will be ignored. You need to call "
            "`lr_scheduler.step()` manually in manual optimization.",
            RuntimeWarning,
            stacklevel=4,
        )
    return LRSchedulerConfig(**{key: value for key, value in scheduler.items() if key not in ignored})


def _split(returned: Any) -> tuple[list, list, str | None]:
    if isinstance(returned, torch.optim.Optimizer):
        return [returned], [], None
    if (
        isinstance(returned, (list, tuple))
        and len(returned) == 2
        and isinstance(returned[0], list)
        and all(isinstance(o, torch.optim.Optimizer) for o in returned[0])
    ):
        optimizers, schedulers = returned
        return list(optimizers), schedulers if isinstance(schedulers, list) else [schedulers], None
    if isinstance(returned, dict):
        _check_keys(returned)
        _require_optimizer(returned)
        scheduler = [returned["lr_scheduler"]] if "lr_scheduler" in returned else []
        return [returned["optimizer"]], scheduler, returned.get("monitor")
    if isinstance(returned, (list, tuple)) and returned and all(isinstance(d, dict) for d in returned):
        for entry in returned:
            _check_keys(entry)
            _require_optimizer(entry)
        schedulers = [
            dict(d["lr_scheduler"]) if isinstance(d["lr_scheduler"], dict) else {"scheduler": d["lr_scheduler"]}
            for d in returned
            if "lr_scheduler" in d
        ]
        return [d["optimizer"] for d in returned], schedulers, None
    if isinstance(returned, (list, tuple)) and all(isinstance(o, torch.optim.Optimizer) for o in returned):
        return list(returned), [], None
    raise MisconfiguredTypeError(
        f"configure_optimizers returned {type(returned).__name__}; accepted return values are {_FORMS}"
    )


def _check_keys(entry: dict) -> None:
    extra = set(entry) - {"optimizer", "lr_scheduler", "monitor"}
    if extra:
        warnings.warn(
            f"configure_optimizers returned a dict with unknown keys {sorted(extra)}; they are ignored",
            RuntimeWarning,
            stacklevel=5,
        )


def _require_optimizer(entry: dict) -> None:
    if not isinstance(entry.get("optimizer"), torch.optim.Optimizer):
        raise MisconfiguredTypeError(
            f'configure_optimizers returned a dict without an optimizer under "optimizer"; accepted: {_FORMS}'
        )


def _scheduler_config(scheduler: Any, monitor: str | None) -> LRSchedulerConfig:
    if isinstance(scheduler, dict):
        known = {f.name for f in fields(LRSchedulerConfig)}
        extra = set(scheduler) - known
        if extra:
            warnings.warn(
                f"the lr scheduler dict has unknown keys {sorted(extra)}; they are ignored",
                RuntimeWarning,
                stacklevel=4,
            )
        entry = {k: v for k, v in scheduler.items() if k in known}
        if "scheduler" not in entry:
            raise MisconfiguredValueError('configure_optimizers: the lr scheduler dict needs the key "scheduler"')
        if entry.get("interval", "epoch") not in ("step", "epoch"):
            raise MisconfiguredValueError(
                f'configure_optimizers: the lr scheduler dict\'s "interval" is {entry["interval"]!r}; '
                'accepted values are "step" and "epoch"'
            )
        entry.setdefault("reduce_on_plateau", isinstance(entry["scheduler"], ReduceLROnPlateau))
        if entry["reduce_on_plateau"] and entry.get("monitor") is None:
            raise MisconfiguredValueError(
                'configure_optimizers: a ReduceLROnPlateau scheduler dict needs a "monitor" key inside the '
                'scheduler dict, e.g. {"scheduler": plateau, "monitor": "val_loss"}'
            )
        if isinstance(entry["scheduler"], OneCycleLR) and entry.get("interval", "epoch") == "epoch":
            warnings.warn(
                "a OneCycleLR scheduler is stepping once per epoch; you probably want 'interval': 'step'",
                RuntimeWarning,
                stacklevel=4,
            )
        config = LRSchedulerConfig(**entry)
    elif isinstance(scheduler, ReduceLROnPlateau):
        if monitor is None:
            raise MisconfiguredValueError(
                'configure_optimizers: a ReduceLROnPlateau scheduler needs a "monitor", e.g. return '
                '{"optimizer": opt, "lr_scheduler": plateau, "monitor": "val_loss"}'
            )
        config = LRSchedulerConfig(scheduler, reduce_on_plateau=True, monitor=monitor)
    else:
        config = LRSchedulerConfig(scheduler)
    if not isinstance(config.frequency, int) or isinstance(config.frequency, bool) or config.frequency < 1:
        raise MisconfiguredValueError(
            f'configure_optimizers: the lr scheduler "frequency" is {config.frequency!r}; use an int >= 1'
        )
    return config


def step_schedulers(
    configs: list[LRSchedulerConfig],
    interval: str,
    count: int,
    hooks: Hooks,
    metrics: Callable[[], dict[str, torch.Tensor]],
    plateau: bool = False,
) -> None:
    """Lightning's ``update_lr_schedulers``: each scheduler of ``interval`` ("step" or "epoch") and of the plateau
    kind or not, when due at ``count`` (the epoch's stepping batch, or the epoch, numbered from 1; ``next_due_count``),
    through the module's ``lr_scheduler_step``; a plateau scheduler reads its ``monitor`` from ``metrics()``."""
    for config in configs:
        of_kind = plateau == config.reduce_on_plateau and config.interval == interval
        if not of_kind or next_due_count(config.frequency, count) != count:
            continue
        metric = None
        if config.reduce_on_plateau:
            logged = metrics()
            metric = logged.get(config.monitor)
            if metric is None:
                if config.strict:
                    raise MisconfiguredValueError(
                        f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; "
                        f"logged metrics: {sorted(logged)}. Set the scheduler dict's 'monitor' to one of them."
                    )
                warnings.warn(
                    f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged, and strict=False: "
                    "the learning rate is not updated",
                    RuntimeWarning,
                    stacklevel=3,
                )
                continue
        hooks.module("lr_scheduler_step", config.scheduler, metric)


def next_due_count(frequency: int, count: int, every: int = 1) -> int:
    """Lightning's ``frequency``: a scheduler steps at every ``frequency``-th count of its interval (numbered from 1).
    The first count from ``count`` at which it does, among the multiples of ``every`` (the batch counts that end an
    accumulation window of ``every``, for the cadence's plan)."""
    return count + (-count) % math.lcm(frequency, every)
