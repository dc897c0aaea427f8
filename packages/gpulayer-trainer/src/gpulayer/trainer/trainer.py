"""``Trainer``: Lightning's entry points (``fit``, ``validate``, ``test``, ``predict``) and state, on one process or
as DDP on several."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import torch

from gpulayer.runtime import Runtime
from gpulayer.trainer.arguments import argument_properties, defaults_from_environment, parse_arguments
from gpulayer.trainer.checkpoint.checkpoint import CheckpointRequest, dump_checkpoint
from gpulayer.trainer.compiled import uncompiled
from gpulayer.trainer.core.callback import Callback, Checkpoint
from gpulayer.trainer.core.datamodule import DataModule, datamodule_base
from gpulayer.trainer.core.hooks import Hooks
from gpulayer.trainer.core.lightning_module import as_module
from gpulayer.trainer.core.lightning_private import lightning_private
from gpulayer.trainer.core.module import Module
from gpulayer.trainer.core.profiled_hooks import ProfiledHooks
from gpulayer.trainer.data.data import DataSource
from gpulayer.trainer.defaults import default_callbacks, default_loggers
from gpulayer.trainer.exceptions import MisconfiguredValueError
from gpulayer.trainer.logging.log_line import LogLine
from gpulayer.trainer.logging.logger import Logger
from gpulayer.trainer.logging.logger_rows import LoggerRows
from gpulayer.trainer.logging.metric_hub import MetricHub
from gpulayer.trainer.loops import process_settings
from gpulayer.trainer.loops.cadence import Cadence
from gpulayer.trainer.loops.evaluation_loop import EvaluationLoop
from gpulayer.trainer.loops.fit_loop import FitLoop
from gpulayer.trainer.loops.stages import StageParts, run_stage
from gpulayer.trainer.loops.transfer import BatchTransfer
from gpulayer.trainer.profilers import attach as profiling
from gpulayer.trainer.profilers.profiler import PassThroughProfiler, Profiler
from gpulayer.trainer.started_call import ProcessStarter
from gpulayer.trainer.states import TrainerFn, TrainerState
from gpulayer.trainer.strategies.precision import Precision
from gpulayer.trainer.strategies.strategy import Strategy
from gpulayer.trainer.strategies.world import device_of, devices_per_node, find_placement
from gpulayer.trainer.trainer_properties import TrainerProperties


@argument_properties
class Trainer(TrainerProperties):
    """Trains a ``Module`` with Lightning 2.6's semantics; every argument is checked here, before any work.

    What each argument means, its check and its default: ``TrainerArguments`` (``arguments.py``), whose
    declarations also give the read-only argument properties (``max_steps``, ``limit_val_batches``, ...)."""

    @defaults_from_environment
    def __init__(
        self,
        *,
        accelerator: str = "auto",
        strategy: str | Strategy = "auto",
        devices: Any = "auto",
        num_nodes: int = 1,
        precision: Any = None,
        callbacks: Callback | list[Callback] | None = None,
        fast_dev_run: int | bool = False,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: str | timedelta | dict[str, int] | None = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        val_check_interval: int | float | str | timedelta | dict[str, int] | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
        deterministic: bool | str | None = None,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        default_root_dir: str | None = None,
        logger: bool | Logger | Iterable[Logger] | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        barebones: bool = False,
        detect_anomaly: bool = False,
        overfit_batches: int | float = 0.0,
        reload_dataloaders_every_n_epochs: int = 0,
        sync_batchnorm: bool = False,
        enable_autolog_hparams: bool = True,
        profiler: Profiler | str | None = None,
        plugins: None = None,
        model_registry: None = None,
        prefetch: bool = False,
        check_finite_loss: bool = True,
    ) -> None:
        self.args = parse_arguments(locals())  # every argument above, by name
        self._build_from_args()

    def _build_from_args(self, loggers: list[Logger] | None = None, callbacks: list[Callback] | None = None) -> None:
        """What the Trainer builds from its arguments: loggers, placement, strategy, callbacks, state and parts. A
        started rank (``started_call.py``) passes the caller's loggers and callbacks."""
        self.loggers: list[Logger] = default_loggers(self.args.logger, self.args) if loggers is None else loggers
        # Joins the job a launcher placed; a plain `python train.py` asking for several processes becomes
        # `gpulayer launch` here and never returns (see world.py). Under ddp_spawn, ddp_fork and ddp_notebook this
        # process stays alone and its entry points run in the ranks the starter starts.
        placement, self.strategy = find_placement(self.args)
        self._starter = ProcessStarter.for_caller(placement, self.strategy, devices_per_node(self.args, placement))
        # The process group, and the collectives that make decisions that end or skip work the same on every rank.
        self.runtime = Runtime(placement, timeout=self.strategy.timeout)
        device = device_of(self.args, placement)
        self.strategy.attach(self.runtime, device, Precision(self.args.precision, device), self.args.sync_batchnorm)
        process_settings.apply(self.args)
        self.callbacks: list[Callback] = (
            default_callbacks(self.args.callbacks, self.args) if callbacks is None else callbacks
        )
        self.should_stop = False
        self.received_sigterm = False  # set by the SIGTERM handler while fit runs (see preemption.py)
        self.state = TrainerState()
        self.lightning_module: Module | None = None
        self.datamodule: DataModule | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[Any] = []
        self.ckpt_path: str | None = None
        # The Trainer's parts, each built once and handed to the loops and stages that use it. With a profiler, the
        # hooks and the loops' methods are the timed ones (profilers/attach.py); without, nothing is added.
        self._profiler: Profiler = self.args.profiler or PassThroughProfiler()
        profiled = not isinstance(self._profiler, PassThroughProfiler)
        self._hooks = ProfiledHooks(self, self._profiler) if profiled else Hooks(self)
        self._metric_hub = MetricHub(self.runtime.all_reduce if self.world_size > 1 else None)
        self._parts = StageParts(
            hooks=self._hooks,
            hub=self._metric_hub,
            logger_rows=LoggerRows(self),
            transfer=BatchTransfer(device, self.strategy.precision_plugin, self._hooks, self.args.prefetch),
        )
        parts = vars(self._parts)  # each part by its name, as the loops take them
        self.validate_loop = EvaluationLoop(self, "validate", **parts)
        self.test_loop = EvaluationLoop(self, "test", **parts)
        self.predict_loop = EvaluationLoop(self, "predict", **parts)
        self.fit_loop = FitLoop(self, log_line=LogLine(self), val_loop=self.validate_loop, **parts)
        if profiled:
            profiling.attach(self)

    def __getattr__(self, name: str) -> Any:
        """Only for names the Trainer lacks: a Lightning-private one a known integration reads is answered
        (``core/lightning_private.py``); any other is an ``AttributeError`` saying whose it is."""
        if name.startswith("_") and not name.startswith("__"):
            return lightning_private(self, name)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")

    # ---- entry points ----------------------------------------------------------------------------------------------
    def fit(
        self,
        model: Module,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train ``model``; loaders come from the arguments, else ``datamodule``, else the model's hooks.

        ``ckpt_path`` resumes a run: a path, ``"last"`` or ``"best"``. Checkpoints load with
        ``weights_only=True`` unless you pass ``weights_only=False`` for a file you trust.
        """
        if self._starter is not None:  # ddp_spawn, ddp_fork, ddp_notebook: the call runs on the ranks it starts
            return self._starter.run(self, "fit", locals())
        if datamodule_base(train_dataloaders) is not None:
            datamodule, train_dataloaders = train_dataloaders, None
        _check_sources(datamodule, train_dataloaders, val_dataloaders)
        with _as_module(model, "fit") as module:
            source = DataSource(train_dataloaders, datamodule, module, "train_dataloader")
            if source.is_defined() is False:
                raise MisconfiguredValueError(
                    "fit: no training data; pass train_dataloaders, a datamodule, or define train_dataloader()"
                )
            self._release_loaders()
            self.fit_loop.attach(source)
            self.validate_loop.attach(DataSource(val_dataloaders, datamodule, module, "val_dataloader"))
            run_stage(self, "fit", module, datamodule, CheckpointRequest(ckpt_path, weights_only), self._parts)

    def validate(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        ckpt_path: str | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """One validation run; one dict of epoch metrics per loader, as Python floats."""
        if self._starter is not None:
            return self._starter.run(self, "validate", locals())
        request = CheckpointRequest(ckpt_path, weights_only, model is not None)
        return self._evaluate("validate", self.validate_loop, model, dataloaders, verbose, datamodule, request)

    def test(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        ckpt_path: str | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """One test run; one dict of epoch metrics per loader, as Python floats."""
        if self._starter is not None:
            return self._starter.run(self, "test", locals())
        request = CheckpointRequest(ckpt_path, weights_only, model is not None)
        return self._evaluate("test", self.test_loop, model, dataloaders, verbose, datamodule, request)

    def predict(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        return_predictions: bool | None = None,
        ckpt_path: str | None = None,
        weights_only: bool | None = None,
    ) -> list[Any] | None:
        """``predict_step`` outputs (on the CPU): a list per batch, or a list of lists for several loaders."""
        if self._starter is not None:
            return self._starter.run(self, "predict", locals())
        request = CheckpointRequest(ckpt_path, weights_only, model is not None)
        model, dataloaders, datamodule = self._eval_inputs("predict", model, dataloaders, datamodule)
        with _as_module(model, "predict") as module:
            self._release_loaders()
            self.predict_loop.attach(DataSource(dataloaders, datamodule, module, "predict_dataloader"))
            self.predict_loop.return_predictions = return_predictions is not False
            return run_stage(self, "predict", module, datamodule, request, self._parts)

    def _evaluate(
        self,
        stage: str,
        loop: EvaluationLoop,
        model: Module | None,
        dataloaders: Any,
        verbose: bool,
        datamodule: DataModule | None,
        request: CheckpointRequest,
    ) -> list[dict[str, float]]:
        model, dataloaders, datamodule = self._eval_inputs(stage, model, dataloaders, datamodule)
        with _as_module(model, stage) as module:
            self._release_loaders()
            loop.attach(DataSource(dataloaders, datamodule, module, f"{loop.prefix}_dataloader"))
            results = run_stage(self, stage, module, datamodule, request, self._parts)
        floats = [{name: value.item() for name, value in logged.items()} for logged in results]
        if verbose and self.is_global_zero:
            _print_results(stage, floats)
        return floats

    def _release_loaders(self) -> None:
        """Every entry point starts with no loaders (Lightning's ``attach_dataloaders``): each requests its own."""
        self.fit_loop.loader = None
        for loop in (self.validate_loop, self.test_loop, self.predict_loop):
            loop.loaders = None

    def _eval_inputs(
        self, stage: str, model: Module | None, dataloaders: Any, datamodule: DataModule | None
    ) -> tuple[Any, Any, DataModule | None]:
        """The model, loaders and DataModule of an evaluation entry point: a DataModule passed as ``dataloaders``
        (positionally too) is the DataModule, as in Lightning; without a model, the one the Trainer was given."""
        if datamodule_base(dataloaders) is not None:
            datamodule, dataloaders = dataloaders, None
        _check_sources(datamodule, dataloaders)
        if model is None:
            if self.lightning_module is None:
                raise TypeError(f"{stage}: pass a model; this Trainer has not been given one before")
            model = self.lightning_module
        return model, dataloaders, datamodule

    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False) -> None:
        """Write the run's state to ``filepath`` (atomically; global rank 0 writes, the others return at once, so
        calling it on rank 0 alone is safe, except under a sharding strategy: there every rank gathers its shards)."""
        if self.lightning_module is None:
            raise AttributeError(
                "save_checkpoint: the Trainer has no model yet; call fit, validate, test or predict first"
            )
        checkpoint = dump_checkpoint(self, weights_only=bool(weights_only))
        if self.is_global_zero or self.strategy.saves_on_every_rank:
            self.strategy.save_checkpoint(checkpoint, filepath)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Make the module inside this block on this process's device, in the true precision's dtype (Lightning's;
        ``empty_init`` is accepted and the weights are initialized either way)."""
        with torch.device(self.strategy.root_device), self.strategy.precision_plugin.module_init_context():
            yield

    @property
    def early_stopping_callbacks(self) -> list[Callback]:
        """The ``gpulayer.callbacks.EarlyStopping`` callbacks, in order (none can exist before that is imported)."""
        callbacks = sys.modules.get("gpulayer.callbacks")
        if callbacks is None:
            return []
        return [callback for callback in self.callbacks if isinstance(callback, callbacks.EarlyStopping)]

    @property
    def early_stopping_callback(self) -> Callback | None:
        """The first ``EarlyStopping`` callback, or None."""
        found = self.early_stopping_callbacks
        return found[0] if found else None

    @property
    def checkpoint_callbacks(self) -> list[Checkpoint]:
        """The checkpoint callbacks, in order."""
        return [callback for callback in self.callbacks if isinstance(callback, Checkpoint)]

    @property
    def checkpoint_callback(self) -> Checkpoint | None:
        """The first checkpoint callback, or None."""
        callbacks = self.checkpoint_callbacks
        return callbacks[0] if callbacks else None

    # ---- state -------------------------------------------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        """Optimizer steps taken."""
        return self.fit_loop.progress.global_step

    @property
    def current_epoch(self) -> int:
        """Epochs completed."""
        return self.fit_loop.progress.epochs_completed

    @property
    def cadence(self) -> Cadence:
        """When the fit loop's per-batch rules act (``cadence.py``): callbacks read the log steps, sync points and
        the logger's step from it, and add their own step and clock triggers to it."""
        return self.fit_loop.cadence

    @property
    def strategy_name(self) -> str:
        """The strategy's name: ``"single_device"``, ``"ddp"``, ..."""
        return self.strategy.strategy_name

    @property
    def model(self) -> torch.nn.Module | None:
        """Lightning's: what the steps run through (DDP's wrapper while ``fit`` trains), else the module."""
        return self.strategy.model

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """The latest value of each metric ``self.log`` recorded, as callbacks see them."""
        return self._metric_hub.callback_metrics()

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """The latest value of each metric logged with ``logger=True``."""
        return self._metric_hub.logged_metrics()

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The metrics logged with ``prog_bar=True``, as Python floats."""
        return self._metric_hub.progress_bar_metrics()

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps this ``fit`` plans (Lightning's formula, including its ``max(max_epochs, 1)``)."""
        loop, args = self.fit_loop, self.args
        if self.state.fn != TrainerFn.FITTING:
            loop.resolve_limits()
        if loop.max_epochs == -1:
            return math.inf if args.max_steps == -1 else args.max_steps
        loop.setup_data()
        if loop.max_batches == math.inf:
            return args.max_steps
        steps = math.ceil(loop.max_batches / self.accumulate_grad_batches) * max(loop.max_epochs, 1)
        return min(steps, args.max_steps) if args.max_steps != -1 else steps

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each node's local rank 0 only (Lightning's)."""
        if self.local_rank == 0:
            print(*args, **kwargs)

    @property
    def logger(self) -> Logger | None:
        """The first of ``loggers``, or None (Lightning's)."""
        return self.loggers[0] if self.loggers else None

    @logger.setter
    def logger(self, logger: Logger | None) -> None:
        self.loggers = [] if logger is None else [logger]

    @property
    def log_dir(self) -> str | None:
        """Where the first logger writes (see ``LoggerRows.log_dir``); ``default_root_dir`` without a logger."""
        return self._parts.logger_rows.log_dir()


@contextlib.contextmanager
def _as_module(model: Any, stage: str) -> Iterator[Module]:
    """``model`` as the ``Module`` an entry point runs: uncompiled, and a library's LightningModule with GPUlayer's
    class for the block (``core/lightning_module.py``)."""
    with as_module(uncompiled(model)) as module:
        if not isinstance(module, Module):
            raise TypeError(
                f"{stage}: model must be a gpulayer.trainer.Module (or another library's LightningModule), got "
                f"{type(model).__name__}"
            )
        yield module


def _check_sources(datamodule: DataModule | None, *loaders: Any) -> None:
    if datamodule is not None and any(loader is not None for loader in loaders):
        raise MisconfiguredValueError("pass either dataloaders or a datamodule, not both")
    if datamodule is not None and datamodule_base(datamodule) is None:
        raise TypeError(
            "datamodule must be a gpulayer.trainer.DataModule (or another library's LightningDataModule), got "
            f"{type(datamodule).__name__}"
        )


def _print_results(stage: str, results: list[dict[str, float]]) -> None:
    for index, metrics in enumerate(results):
        title = f"{stage} results" + (f" (dataloader {index})" if len(results) > 1 else "")
        print(title)
        for name, value in sorted(metrics.items()):
            print(f"  {name:<30} {value:.6g}")
