"""``DeviceStatsMonitor``: the device's statistics at the batch hooks of training, validation and testing, logged as
Lightning 2.6 logs them (``lightning/pytorch/callbacks/device_stats_monitor.py``).

On the CPU: ``cpu_percent``, ``cpu_vm_percent`` and ``cpu_swap_percent`` from psutil. On a GPU: every key of
``torch.cuda.memory_stats``, host-side counters of the caching allocator that read nothing back from the device.
Rows go out only where Lightning's logger connector would log (``should_update_logs``): in training at the
``log_every_n_steps`` cadence, which GPUlayer's fit loop plans, so the batches between log steps call nothing here.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from gpulayer.trainer import Callback
from gpulayer.trainer.core.callback import follows_cadence
from gpulayer.trainer.exceptions import MisconfigurationException
from gpulayer.trainer.strategies.accelerators import CPUAccelerator


class DeviceStatsMonitor(Callback):
    """Logs ``DeviceStatsMonitor.<hook><separator><stat>`` (the logger's ``group_separator``) at
    ``on_train_batch_start``/``_end``, ``on_validation_batch_start``/``_end`` and ``on_test_batch_start``/``_end``,
    at the logger's step (the batches that stepped), on every rank as Lightning calls the loggers.

    ``cpu_stats``: None logs the device's own statistics (the CPU's on the CPU, the GPU's memory on a GPU), True
    adds the CPU's to a GPU's, False logs nothing on the CPU (a GPU's still). ``fit`` without a logger raises
    ``MisconfigurationException``; ``fit`` on the CPU without psutil, with ``cpu_stats=None``, ``ModuleNotFoundError``.
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats
        self._eval_batches = 0  # the running evaluation's batches so far, which its log steps count

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise MisconfigurationException("Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`.")
        on_cpu = trainer.strategy.root_device.type == "cpu"
        if self._cpu_stats is None and on_cpu and importlib.util.find_spec("psutil") is None:
            raise ModuleNotFoundError(
                "`DeviceStatsMonitor` cannot log CPU stats as `psutil` is not installed: pip install psutil"
            )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not (self._cpu_stats is False and trainer.strategy.root_device.type == "cpu"):  # else nothing to log
            trainer.cadence.before_log_steps()

    @follows_cadence
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.cadence.updates_logs(trainer.should_stop):
            self._log(trainer, "on_train_batch_start")

    @follows_cadence
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.cadence.updates_logs(trainer.should_stop):
            self._log(trainer, "on_train_batch_end")

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_batches = 0

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self._eval_batches += 1
        if self._evaluation_logs(trainer):
            self._log(trainer, "on_validation_batch_start")

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *args: Any) -> None:
        if self._evaluation_logs(trainer):
            self._log(trainer, "on_validation_batch_end")

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_batches = 0

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self._eval_batches += 1
        if self._evaluation_logs(trainer):
            self._log(trainer, "on_test_batch_start")

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *args: Any) -> None:
        if self._evaluation_logs(trainer):
            self._log(trainer, "on_test_batch_end")

    def _evaluation_logs(self, trainer: Any) -> bool:
        """Lightning's ``should_update_logs`` in an evaluation: every ``log_every_n_steps`` batches of the run."""
        every = trainer.log_every_n_steps
        return bool(every) and (self._eval_batches % every == 0 or trainer.should_stop)

    def _log(self, trainer: Any, hook: str) -> None:
        device = trainer.strategy.root_device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = trainer.accelerator.get_device_stats(device)
        if self._cpu_stats and device.type != "cpu":
            stats.update(CPUAccelerator().get_device_stats(device))
        prefix = f"{type(self).__qualname__}.{hook}"
        for logger in trainer.loggers:
            separator = logger.group_separator
            logger.log_metrics(
                {f"{prefix}{separator}{k}": v for k, v in stats.items()}, step=trainer.cadence.logger_step
            )
