"""Lightning's read-only ``Trainer`` properties that look through to the Trainer's parts: the ranks and devices
(runtime, strategy), the loops' limits, batch counts and loaders, and the running stage; and
``accumulate_grad_batches``, which can also be set, as in Lightning. ``Trainer`` inherits
them; the properties that only return an argument come from its declaration (``arguments.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpulayer.trainer.argument_checks import at_least
from gpulayer.trainer.states import RunningStage, TrainerFn, TrainerStatus
from gpulayer.trainer.strategies.accelerators import accelerator_for
from gpulayer.trainer.strategies.world import devices_per_node

if TYPE_CHECKING:
    import torch

    from gpulayer.runtime import Runtime
    from gpulayer.trainer.arguments import TrainerArguments
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.loops.evaluation_loop import EvaluationLoop
    from gpulayer.trainer.loops.fit_loop import FitLoop
    from gpulayer.trainer.profilers.profiler import Profiler
    from gpulayer.trainer.started_call import ProcessStarter
    from gpulayer.trainer.states import TrainerState
    from gpulayer.trainer.strategies.precision import Precision
    from gpulayer.trainer.strategies.strategy import Strategy


class TrainerProperties:
    """The views; the attributes they read are set by ``Trainer.__init__``."""

    args: TrainerArguments
    runtime: Runtime
    strategy: Strategy
    _starter: ProcessStarter | None
    state: TrainerState
    lightning_module: Module | None
    fit_loop: FitLoop
    validate_loop: EvaluationLoop
    test_loop: EvaluationLoop
    predict_loop: EvaluationLoop

    # ---- limits and counts -----------------------------------------------------------------------------------------
    @property
    def max_epochs(self) -> int | None:
        """The epoch limit: while fitting, as the fit loop resolved it (Lightning's 1000 for None); else as given."""
        return self.fit_loop.max_epochs if self.state.fn == TrainerFn.FITTING else self.args.max_epochs

    @property
    def fast_dev_run(self) -> int | bool:
        """Lightning's: True for ``fast_dev_run=True`` or 1, else the number given (False for none)."""
        return {0: False, 1: True}.get(self.args.fast_dev_run, self.args.fast_dev_run)

    @property
    def val_check_batch(self) -> int | float | None:
        """Training batches between validations, as the fit loop resolved them."""
        return self.fit_loop.val_check_batch

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step: the Trainer argument, or the value set since, as in Lightning (where
        ``GradientAccumulationScheduler`` sets it as each epoch starts); it carries over to the next ``fit``."""
        return self.fit_loop.cadence.window

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        self.fit_loop.cadence.set_window(at_least(1)("accumulate_grad_batches", value, {}))

    @property
    def num_training_batches(self) -> int | float:
        """Training batches per epoch (after ``limit_train_batches``)."""
        return self.fit_loop.max_batches

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches, one count per loader."""
        return list(self.validate_loop.max_batches)

    @property
    def num_test_batches(self) -> list[int | float]:
        """Test batches, one count per loader."""
        return list(self.test_loop.max_batches)

    @property
    def num_predict_batches(self) -> list[int | float]:
        """Predict batches, one count per loader."""
        return list(self.predict_loop.max_batches)

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """Sanity-check batches, one count per validation loader."""
        return [min(self.args.num_sanity_val_steps, count) for count in self.validate_loop.max_batches]

    @property
    def enable_validation(self) -> bool:
        """Whether validation runs: a module with validation data and steps, and batches to run."""
        return self.lightning_module is not None and self.validate_loop.is_enabled()

    @property
    def is_last_batch(self) -> bool:
        """Whether the training batch being run is the epoch's last."""
        return self.fit_loop.progress.is_last_batch

    # ---- loaders ------------------------------------------------------------------------------------------------
    @property
    def train_dataloader(self) -> Any:
        """The training loader of the running ``fit``, or None; in its list, tuple or dict when it came in one
        (Lightning's ``CombinedLoader.iterables``)."""
        loop = self.fit_loop
        return loop.shape(loop.loader) if loop.shape is not None and loop.loader is not None else loop.loader

    @property
    def val_dataloaders(self) -> Any:
        """The validation loader, a list of several, or None."""
        return _one_or_all(self.validate_loop.loaders)

    @property
    def test_dataloaders(self) -> Any:
        """The test loader, a list of several, or None."""
        return _one_or_all(self.test_loop.loaders)

    @property
    def predict_dataloaders(self) -> Any:
        """The predict loader, a list of several, or None."""
        return _one_or_all(self.predict_loop.loaders)

    # ---- ranks and devices --------------------------------------------------------------------------------------
    @property
    def global_rank(self) -> int:
        """This process's rank among all processes."""
        return self.runtime.global_rank

    @property
    def local_rank(self) -> int:
        """This process's rank on its node."""
        return self.runtime.local_rank

    @property
    def node_rank(self) -> int:
        """This node's rank."""
        return self.runtime.node_rank

    @property
    def world_size(self) -> int:
        """The number of processes (in the caller of ``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``: its ranks')."""
        return self.runtime.world_size if self._starter is None else self._starter.nprocs

    @property
    def is_global_zero(self) -> bool:
        """Whether this is global rank 0, the one that writes."""
        return self.runtime.global_rank == 0

    @property
    def num_devices(self) -> int:
        """Devices (one process each) per node."""
        return devices_per_node(self.args, self.runtime.placement)

    @property
    def device_ids(self) -> list[int]:
        """This node's device indices: the GPUs of devices=[...], else 0 to num_devices - 1 (on CPU too)."""
        return list(self.args.devices) if self.args.devices else list(range(self.num_devices))

    @property
    def accelerator(self) -> Any:
        """Lightning's accelerator object for this process's device."""
        return accelerator_for(self.strategy.root_device)

    @property
    def precision_plugin(self) -> Precision:
        """The strategy's precision: autocast, the module's dtype, the scaler."""
        return self.strategy.precision_plugin

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """fp16's GradScaler, else None."""
        return self.strategy.precision_plugin.scaler

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """What a DistributedSampler of your own needs (Lightning's; None without a distributed strategy)."""
        return {"num_replicas": self.world_size, "rank": self.global_rank} if self.strategy.is_distributed else None

    @property
    def profiler(self) -> Profiler:
        """The ``profiler=`` given (``"simple"``, ``"advanced"`` and ``"pytorch"`` made into one), else a
        ``PassThroughProfiler``, which records nothing."""
        return self._profiler

    @property
    def progress_bar_callback(self) -> None:
        """None: GPUlayer's log line is not a callback."""
        return None

    # ---- the running stage (Lightning's setters: True enters the stage, False leaves it if it is the current one) --
    @property
    def training(self) -> bool:
        """Whether the training stage runs."""
        return self.state.stage == RunningStage.TRAINING

    @training.setter
    def training(self, on: bool) -> None:
        self._stage(on, RunningStage.TRAINING)

    @property
    def validating(self) -> bool:
        """Whether a validation stage runs (in fit or validate)."""
        return self.state.stage == RunningStage.VALIDATING

    @validating.setter
    def validating(self, on: bool) -> None:
        self._stage(on, RunningStage.VALIDATING)

    @property
    def testing(self) -> bool:
        """Whether the test stage runs."""
        return self.state.stage == RunningStage.TESTING

    @testing.setter
    def testing(self, on: bool) -> None:
        self._stage(on, RunningStage.TESTING)

    @property
    def predicting(self) -> bool:
        """Whether the predict stage runs."""
        return self.state.stage == RunningStage.PREDICTING

    @predicting.setter
    def predicting(self, on: bool) -> None:
        self._stage(on, RunningStage.PREDICTING)

    @property
    def sanity_checking(self) -> bool:
        """Whether the sanity check runs."""
        return self.state.stage == RunningStage.SANITY_CHECKING

    @sanity_checking.setter
    def sanity_checking(self, on: bool) -> None:
        self._stage(on, RunningStage.SANITY_CHECKING)

    @property
    def evaluating(self) -> bool:
        """Whether a validation, test or sanity-check stage runs."""
        return self.state.stage is not None and self.state.stage.evaluating

    @property
    def interrupted(self) -> bool:
        """Whether an exception (KeyboardInterrupt too) ended the last entry point."""
        return self.state.status == TrainerStatus.INTERRUPTED

    def _stage(self, on: bool, stage: RunningStage) -> None:
        if on:
            self.state.stage = stage
        elif self.state.stage == stage:
            self.state.stage = None


def _one_or_all(loaders: list[Any] | None) -> Any:
    """A stage's loaders as Lightning's ``*_dataloaders`` give them: the loader, a list of several, or None."""
    if not loaders:
        return None
    return loaders[0] if len(loaders) == 1 else loaders
