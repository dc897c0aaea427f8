"""``LearningRateMonitor``: logs each optimizer's learning rate (and momentum, weight decay) as Lightning does.

Lightning 2.6's is in ``lightning/pytorch/callbacks/lr_monitor.py``. Values are the Python floats of the
optimizer's ``param_groups``, so logging reads nothing back from the device, and a batch outside the
``log_every_n_steps`` cadence costs one comparison: no row, no write.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch

from gpulayer.trainer import Callback
from gpulayer.trainer.core.callback import follows_cadence
from gpulayer.trainer.exceptions import MisconfiguredValueError


class LearningRateMonitor(Callback):
    """Logs ``lr-<Optimizer>`` (or the scheduler config's ``name``) to the logger and ``trainer.callback_metrics``.

    ``logging_interval="step"`` logs every optimizer before a batch on the ``log_every_n_steps`` cadence,
    ``"epoch"`` at each train epoch start, ``None`` each scheduler at its own ``interval`` (an optimizer without
    a scheduler at both). Several param groups get ``/pg1``, ``/pg2``… (or ``/<group name>``); a second
    optimizer of the same class ``-1``. ``log_momentum`` adds ``<name>-momentum`` (``betas[0]`` where the
    optimizer has betas), ``log_weight_decay`` ``<name>-weight_decay``.
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False):
        if logging_interval not in (None, "step", "epoch"):
            raise MisconfiguredValueError(
                f"logging_interval={logging_interval!r}: accepted values are 'step', 'epoch' or None"
            )
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        # Lightning's public history: every value logged, and the last momentum and weight decay per name.
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.loggers:  # under fast_dev_run, the DummyLogger in place of the user's (as in Lightning)
            raise MisconfiguredValueError(
                "Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger. "
                "Pass logger=True (the default) or a CSVLogger to the Trainer."
            )
        if self.log_momentum and _momentum_missing(trainer) and trainer.is_global_zero:
            warnings.warn(
                "You have set log_momentum=True, but some optimizers do not have momentum. "
                "This will log a value 0 for the momentum.",
                RuntimeWarning,
                stacklevel=2,
            )
        names = [name for group_names, _, _ in _named_optimizers(trainer) for name in group_names]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}
        if self.logging_interval != "epoch":
            trainer.cadence.before_log_steps()

    @follows_cadence
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.logging_interval == "epoch":
            return
        if trainer.cadence.updates_logs(trainer.should_stop):
            self._log(trainer, pl_module, "step" if self.logging_interval is None else "any")

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.logging_interval != "step":
            self._log(trainer, pl_module, "epoch" if self.logging_interval is None else "any")

    def _log(self, trainer: Any, pl_module: Any, interval: str) -> None:
        """Values of the optimizers due at ``interval`` ("any": all of them), to the logger's buffer (written at
        the trainer's next log point) and to ``callback_metrics``."""
        stats: dict[str, float] = {}
        for names, optimizer, scheduler_interval in _named_optimizers(trainer):
            self._keep_history_across_new_param_groups(names)
            if scheduler_interval in (None, interval) or interval == "any":
                stats.update(self._optimizer_stats(optimizer, names))
        # torch.full launches a fill: unlike torch.tensor(value, device=...), it does not wait for the device.
        trainer.callback_metrics.update(
            {name: torch.full((), value, device=pl_module.device) for name, value in stats.items()}
        )
        if stats and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(stats, step=trainer.cadence.logger_step)

    def _optimizer_stats(self, optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, float]:
        stats = {}
        use_betas = "betas" in optimizer.defaults
        for group, name in zip(optimizer.param_groups, names, strict=True):
            stats[name] = group["lr"]
            self.lrs[name].append(group["lr"])
            if self.log_momentum:
                momentum = group["betas"][0] if use_betas else group.get("momentum", 0)
                stats[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = momentum
            if self.log_weight_decay:
                decay = group["weight_decay"]
                stats[f"{name}-weight_decay"] = self.last_weight_decay_values[f"{name}-weight_decay"] = decay
        return stats

    def _keep_history_across_new_param_groups(self, names: list[str]) -> None:
        """An optimizer that gains param groups renames ``lr-X`` to ``lr-X/pg1``: its history moves along."""
        for name in names:
            single = name.replace("/pg1", "")
            if "/pg1" in name and single in self.lrs:
                self.lrs[name] = self.lrs.pop(single)
            elif name not in self.lrs:
                self.lrs[name] = []


def _momentum_missing(trainer: Any) -> bool:
    """Lightning's test: some optimizer lacks ``momentum`` and some (maybe another) lacks ``betas``."""
    optimizers = [config.scheduler.optimizer for config in trainer.lr_scheduler_configs] or trainer.optimizers
    return all(any(key not in optimizer.defaults for optimizer in optimizers) for key in ("momentum", "betas"))


def _named_optimizers(trainer: Any) -> list[tuple[list[str], torch.optim.Optimizer, str | None]]:
    """(names of its param groups, optimizer, its scheduler's interval) for each scheduler, then each optimizer
    without one (interval None); named exactly as Lightning's ``LearningRateMonitor`` names them."""
    entries: list[tuple[list[str], torch.optim.Optimizer, str | None]] = []
    seen: list[torch.optim.Optimizer] = []
    unnamed_per_class: Counter[type] = Counter()
    for config in trainer.lr_scheduler_configs:
        optimizer = config.scheduler.optimizer
        base = config.name if config.name is not None else f"lr-{type(optimizer).__name__}"
        if config.name is None:
            unnamed_per_class[type(optimizer)] += 1
        entries.append((_group_names(base, optimizer, unnamed_per_class), optimizer, config.interval))
        seen.append(optimizer)
    for optimizer in trainer.optimizers:
        if optimizer in seen:
            continue
        unnamed_per_class[type(optimizer)] += 1
        entries.append((_group_names(f"lr-{type(optimizer).__name__}", optimizer, unnamed_per_class), optimizer, None))
        seen.append(optimizer)
    return entries


def _group_names(base: str, optimizer: torch.optim.Optimizer, unnamed_per_class: Counter[type]) -> list[str]:
    groups = optimizer.param_groups
    group_names = [group.get("name", f"pg{index}") for index, group in enumerate(groups, start=1)]
    duplicates = {name for name in group_names if group_names.count(name) > 1}
    if duplicates:
        raise MisconfiguredValueError(
            "A single `Optimizer` cannot have multiple parameter groups with identical "
            f"`name` values. {base} has duplicated parameter group names {duplicates}"
        )
    # As Lightning: the n-th optimizer of a class without a scheduler name gets "-<n-1>", and so does a named
    # scheduler's optimizer when n such optimizers came before it.
    count = unnamed_per_class[type(optimizer)]
    name = f"{base}-{count - 1}" if count > 1 else base
    if len(groups) > 1:
        return [f"{name}/{group_name}" for group_name in group_names]
    return [f"{name}/{groups[0]['name']}" if groups[0].get("name") else name]
