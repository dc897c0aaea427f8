"""``ThroughputMonitor``: batches, samples, items and FLOPs per second of each stage, logged as Lightning 2.6 logs
them (``lightning/pytorch/callbacks/throughput_monitor.py``).

Every batch of every stage adds its batch size (and length) to the stage's totals and the time since the stage
started, read after ``torch.cuda.synchronize()`` on a GPU as Lightning reads it; the rates over the last
``window_size`` batches go to the loggers at the log steps only. Global rank 0 alone measures and logs.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from gpulayer.callbacks.throughput import Throughput, _check_window, get_available_flops
from gpulayer.trainer import Callback
from gpulayer.trainer.states import RunningStage

_STAGES = {
    "fit": RunningStage.TRAINING,
    "validate": RunningStage.VALIDATING,
    "test": RunningStage.TESTING,
    "predict": RunningStage.PREDICTING,
}
_COMPUTE_DTYPES = {"16": torch.float16, "bf16": torch.bfloat16, "64": torch.float64}


class ThroughputMonitor(Callback):
    """Logs ``<stage><separator><key>`` for each key of ``Throughput.compute()``, the stage being ``train``,
    ``validate``, ``test`` or ``predict``.

    ``batch_size_fn(batch)`` gives a batch's samples, ``length_fn(batch)`` its items (tokens, say); ``kwargs`` go to
    ``Throughput`` (``window_size``, ``separator``). FLOPs are read from the module's ``flops_per_batch`` where it has
    one (see ``measure_flops``), with Lightning's warning where it has none.

    Training rows go out at the log steps (``log_every_n_steps``, the batch that set ``should_stop``) that end an
    accumulation window, at the logger's step, with ``epoch``; evaluation rows every ``log_every_n_steps`` batches
    of a run, at the count of that loop's batches so far. Each row also lands in ``trainer.logged_metrics``.
    Validation time is taken out of the training time, as Lightning takes it out. The sanity check is not measured.
    """

    def __init__(
        self, batch_size_fn: Callable[[Any], int], length_fn: Callable[[Any], int] | None = None, **kwargs: Any
    ) -> None:
        # Lightning finds a bad keyword only when fit or another entry point builds its Throughput: this is earlier.
        unknown = sorted(set(kwargs) - {"window_size", "separator"})
        if unknown:
            raise TypeError(f"ThroughputMonitor: unknown keyword arguments {unknown}; accepted: window_size, separator")
        _check_window(1, kwargs.get("window_size", 100))
        self.kwargs = kwargs
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.available_flops: int | None = None
        self._throughputs: dict[RunningStage, Throughput] = {}
        self._t0s: dict[RunningStage, float] = {}
        self._lengths: dict[RunningStage, int] = {}
        self._samples: dict[RunningStage, int] = {}
        self._batches: dict[RunningStage, int] = {}
        self._module_has_flops: bool | None = None
        # Lightning's evaluation loops count their batches: this run's (which log steps read) and every run's of the
        # loop so far, for one Trainer (the rows' step); fit's validation counts those of the training epoch.
        self._run_batches: dict[RunningStage, int] = {}
        self._loop_batches: dict[tuple[str, RunningStage], int] = {}
        self._trainer: weakref.ref | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        device = trainer.strategy.root_device
        self.available_flops = get_available_flops(device, _compute_dtype(trainer.precision_plugin.name))
        if self._trainer is None or self._trainer() is not trainer:
            self._trainer, self._loop_batches = weakref.ref(trainer), {}
        running = _STAGES[stage]
        if running is RunningStage.TRAINING and trainer.enable_validation:
            self._throughputs[RunningStage.VALIDATING] = self._throughput(trainer)
        self._throughputs[running] = self._throughput(trainer)

    def _throughput(self, trainer: Any) -> Throughput:
        return Throughput(available_flops=self.available_flops, world_size=trainer.world_size, **self.kwargs)

    # ---- training ---------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.TRAINING)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._loop_batches.pop(("fit", RunningStage.VALIDATING), None)  # Lightning counts them per training epoch

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not trainer.is_global_zero:
            return
        self._update(trainer, pl_module, batch, RunningStage.TRAINING)
        # Only a batch that steps is measured whole (its optimizer step included), so only such a batch logs.
        if not trainer.cadence.accumulates() and trainer.cadence.updates_logs(trainer.should_stop):
            self._log(trainer, RunningStage.TRAINING, None)

    # ---- evaluation -------------------------------------------------------------------------------------------
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._start(trainer, RunningStage.VALIDATING)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *args: Any) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._evaluation_batch(trainer, pl_module, batch, RunningStage.VALIDATING)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Within ``fit``: move the training clock's start on by the validation run and the gap before it."""
        if not trainer.is_global_zero or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        train_times = self._throughputs[RunningStage.TRAINING]._time
        val_times = self._throughputs[RunningStage.VALIDATING]._time
        training_finished = self._t0s[RunningStage.TRAINING] + (train_times[-1] if train_times else 0.0)
        gap = self._t0s[RunningStage.VALIDATING] - training_finished
        self._t0s[RunningStage.TRAINING] += gap + (val_times[-1] if val_times else 0.0)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.TESTING)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *args: Any) -> None:
        if trainer.is_global_zero:
            self._evaluation_batch(trainer, pl_module, batch, RunningStage.TESTING)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.PREDICTING)

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *args: Any) -> None:
        if trainer.is_global_zero:
            self._evaluation_batch(trainer, pl_module, batch, RunningStage.PREDICTING)

    # ---- the measurements -------------------------------------------------------------------------------------
    def _start(self, trainer: Any, stage: RunningStage) -> None:
        """A stage's run begins: its clock starts; its totals restart within ``fit``, else only the first time."""
        if trainer.state.fn == "fit" or stage not in self._samples:
            self._throughputs[stage].reset()
            self._lengths[stage] = self._samples[stage] = self._batches[stage] = 0
        self._run_batches[stage] = 0
        self._t0s[stage] = time.perf_counter()

    def _update(self, trainer: Any, pl_module: Any, batch: Any, stage: RunningStage) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # else the clock reads when the kernels were queued, not when they ran
        elapsed = time.perf_counter() - self._t0s[stage]
        if self._module_has_flops is None:
            self._module_has_flops = hasattr(pl_module, "flops_per_batch")
            if not self._module_has_flops:
                warnings.warn(
                    "When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute or property"
                    f" in {type(pl_module).__name__} to compute the FLOPs.",
                    UserWarning,
                    stacklevel=2,
                )
        with torch.inference_mode():  # a size computed from tensors records no graph
            if self.length_fn is not None:
                self._lengths[stage] += self.length_fn(batch)
            self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        self._throughputs[stage].update(
            time=elapsed,
            batches=self._batches[stage],
            samples=self._samples[stage],  # as Lightning: assumes every batch has the same size
            lengths=None if self.length_fn is None else self._lengths[stage],
            flops=pl_module.flops_per_batch if self._module_has_flops else None,
        )

    def _evaluation_batch(self, trainer: Any, pl_module: Any, batch: Any, stage: RunningStage) -> None:
        loop = ("fit" if trainer.state.fn == "fit" else "alone", stage)
        self._run_batches[stage] += 1
        self._loop_batches[loop] = self._loop_batches.get(loop, 0) + 1
        self._update(trainer, pl_module, batch, stage)
        every = trainer.log_every_n_steps
        if every and (self._run_batches[stage] % every == 0 or trainer.should_stop):
            self._log(trainer, stage, self._loop_batches[loop])

    def _log(self, trainer: Any, stage: RunningStage, step: int | None) -> None:
        """Lightning's ``log_metrics``: a training row (``step`` None) gets ``epoch`` and the logger's step."""
        if not trainer.loggers:
            return
        throughput = self._throughputs[stage]
        metrics: dict[str, Any] = {
            f"{stage.value}{throughput.separator}{key}": value for key, value in throughput.compute().items()
        }
        trainer.logged_metrics.update(metrics)
        if step is None:
            metrics.setdefault("epoch", trainer.current_epoch)
            step = trainer.cadence.logger_step
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
            logger.save()


def _compute_dtype(precision: str) -> torch.dtype:
    """The dtype the matmuls of a ``precision=`` run in, as Lightning 2.6 reads it from its precision plugin."""
    return _COMPUTE_DTYPES.get(precision.split("-")[0], torch.float32)
