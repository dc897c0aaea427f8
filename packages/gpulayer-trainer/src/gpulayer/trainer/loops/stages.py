"""What every entry point does around its loop: set up, run, tear down, or report the exception.

Lightning 2.6's are ``Trainer._run`` (``lightning/pytorch/trainer/trainer.py``) and ``_call_and_handle_interrupt``
(``lightning/pytorch/trainer/call.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.checkpoint.checkpoint import (
    CheckpointRequest,
    check_resumable,
    resolve_ckpt_path,
    restore_modules_and_callbacks,
    restore_training_state,
)
from gpulayer.trainer.core.callback import Callback, Checkpoint
from gpulayer.trainer.core.datamodule import DataModule, datamodule_overrides
from gpulayer.trainer.core.hooks import Hooks
from gpulayer.trainer.core.hyperparameters import clean_namespace
from gpulayer.trainer.core.module import Module
from gpulayer.trainer.data.data import shut_down_workers
from gpulayer.trainer.data.seed import reset_seed
from gpulayer.trainer.exceptions import (
    MisconfiguredNotImplementedError,
    MisconfiguredTypeError,
    MisconfiguredValueError,
    PossibleUserWarning,
)
from gpulayer.trainer.loops import process_settings
from gpulayer.trainer.loops.manual_optimization import ManualOptimization
from gpulayer.trainer.loops.optimization import AutomaticOptimization
from gpulayer.trainer.loops.preemption import sigterm_noted
from gpulayer.trainer.profilers import attach as profiling
from gpulayer.trainer.states import FIRST_STAGE, TrainerFn, TrainerStatus

if TYPE_CHECKING:
    from gpulayer.trainer.arguments import TrainerArguments
    from gpulayer.trainer.logging.logger_rows import LoggerRows
    from gpulayer.trainer.logging.metric_hub import MetricHub
    from gpulayer.trainer.loops.evaluation_loop import EvaluationLoop
    from gpulayer.trainer.loops.transfer import BatchTransfer
    from gpulayer.trainer.trainer import Trainer


@dataclass(frozen=True)
class StageParts:
    """The Trainer's parts a stage works with: built once by the Trainer, which hands the same ones to its loops."""

    hooks: Hooks
    hub: MetricHub
    logger_rows: LoggerRows
    transfer: BatchTransfer


def run_stage(
    trainer: Trainer,
    stage: str,
    module: Module,
    datamodule: DataModule | None,
    request: CheckpointRequest,
    parts: StageParts,
) -> Any:
    """Run ``stage`` ("fit", "validate", "test", "predict") on ``module``, loading what ``request`` asks for;
    returns the loop's result."""
    clean_namespace(module.hparams, warn=trainer.is_global_zero)  # Lightning's _run: before the run
    trainer.should_stop = False
    state = trainer.state
    state.fn = TrainerFn(stage)
    state.status, state.stage = TrainerStatus.RUNNING, FIRST_STAGE[state.fn]
    trainer.lightning_module, module.trainer = module, trainer
    trainer.datamodule = datamodule
    if datamodule is not None:
        datamodule.trainer = trainer
    hooks, strategy = parts.hooks, trainer.strategy
    hooks.attach(module, trainer.callbacks)
    strategy.connect(module)
    try:
        trainer.callbacks = _with_module_callbacks(trainer.callbacks, hooks.module("configure_callbacks"))
        hooks.attach(module, trainer.callbacks)
        module._attach_logging(trainer.callbacks)
        parts.transfer.prepare(module, datamodule)
        _verify(trainer, stage, module, hooks)
        checkpoint = _set_up(trainer, stage, module, datamodule, request, parts)
        if stage == "fit":
            trainer.received_sigterm = False
            with sigterm_noted(trainer):
                result = _fit(trainer, module, parts, checkpoint)
        else:
            parts.logger_rows.hyperparameters()
            # Lightning also evaluates FSDP under no_grad: see Strategy.evaluates_in_inference_mode.
            inference = trainer.args.inference_mode and strategy.evaluates_in_inference_mode
            with torch.inference_mode() if inference else torch.no_grad():
                module.zero_grad()  # as Lightning's _run_stage does before every loop
                result = _evaluation_loop(trainer, stage).run()
        _tear_down(trainer, stage, parts, datamodule)  # inside: an error in on_fit_end or teardown is reported too
    except BaseException as error:
        trainer.state.status = TrainerStatus.INTERRUPTED
        trainer.fit_loop.optimization = None
        hooks.on_exception(error)
        if datamodule is not None:
            _call_datamodule_hook(datamodule, "on_exception", error)
        parts.logger_rows.finalize("failed")  # after on_exception, as Lightning's _interrupt
        write_error = strategy.stop_background_writes(every_rank_here=False)
        if write_error is not None and write_error is not error:
            error.add_note(f"A checkpoint write in the background failed too: {write_error}")
        strategy.teardown(trainer.optimizers)
        shut_down_workers(_stage_loaders(trainer, stage))
        trainer.state.stage = None
        if isinstance(error, KeyboardInterrupt):
            raise SystemExit(1) from error  # Lightning's behaviour after its graceful shutdown
        raise
    trainer.state.status, trainer.state.stage = TrainerStatus.FINISHED, None
    return result


def _tear_down(trainer: Trainer, stage: str, parts: StageParts, datamodule: DataModule | None) -> None:
    """A finished stage: release DDP and the optimization, then ``on_fit_end`` and the ``teardown`` hooks."""
    hooks = parts.hooks
    trainer.fit_loop.optimization = None  # with DDP's wrapper (below), its gradient buckets are freed
    trainer.strategy.stop_background_writes(every_rank_here=True)  # fit returns with its files in place
    trainer.strategy.teardown(trainer.optimizers)
    shut_down_workers(_stage_loaders(trainer, stage))
    parts.logger_rows.finalize("success")
    if stage == "fit":
        hooks.both("on_fit_end")
    if datamodule is not None:
        _call_datamodule_hook(datamodule, "teardown", stage=trainer.state.fn)
    hooks.callbacks("teardown", stage=trainer.state.fn)  # a TrainerFn, by keyword, as Lightning passes it
    hooks.module("teardown", stage=trainer.state.fn)
    trainer.lightning_module._forget_metric_attributes()
    trainer.profiler.describe()  # the stage's report, last, as Lightning's _call_teardown_hook


def _call_datamodule_hook(datamodule: DataModule, name: str, *args: Any, **kwargs: Any) -> None:
    """``datamodule.<name>``, unless set to None (Lightning's ``_call_lightning_datamodule_hook`` skips it)."""
    hook = getattr(datamodule, name)
    if callable(hook):
        hook(*args, **kwargs)


_REMOVED_HOOKS = {
    "training_epoch_end": "on_train_epoch_end",
    "validation_epoch_end": "on_validation_epoch_end",
    "test_epoch_end": "on_test_epoch_end",
}


def _stage_loaders(trainer: Trainer, stage: str) -> list[Any]:
    """The loaders ``stage`` iterated (fit: the train loader and the validation loaders)."""
    loops = [trainer.validate_loop] if stage == "fit" else [_evaluation_loop(trainer, stage)]
    loaders = [trainer.fit_loop.loader] if stage == "fit" else []
    return loaders + [loader for loop in loops for loader in loop.loaders or []]


def _evaluation_loop(trainer: Trainer, stage: str) -> EvaluationLoop:
    return {"validate": trainer.validate_loop, "test": trainer.test_loop, "predict": trainer.predict_loop}[stage]


def _verify(trainer: Trainer, stage: str, module: Module, hooks: Hooks) -> None:
    """Lightning's ``_verify_loop_configurations``: inside the run, so ``on_exception`` hears about it."""
    overridden = hooks.overridden
    name = type(module).__name__
    for removed, new in _REMOVED_HOOKS.items():
        if hasattr(module, removed):
            raise NotImplementedError(f"{name}.{removed} was removed in Lightning 2.0; use {new}")
    if stage == "fit":
        if "training_step" not in overridden:
            raise MisconfiguredNotImplementedError(f"{name} must define training_step() to fit")
        if "configure_optimizers" not in overridden:
            raise MisconfiguredNotImplementedError(
                f"{name} must define configure_optimizers() to fit (it may return None to train without an optimizer)"
            )
        if not module.automatic_optimization:
            _verify_manual_optimization(trainer.args, trainer.accumulate_grad_batches)
        if not trainer.fit_loop.source.is_defined():
            raise MisconfiguredValueError(
                "fit: no training data; pass train_dataloaders, a datamodule, or define train_dataloader()"
            )
        if trainer.is_global_zero:
            _warn_unpaired_validation(trainer, overridden)
    step = {"validate": "validation_step", "test": "test_step"}.get(stage)
    if step is not None and step not in overridden:
        raise MisconfiguredNotImplementedError(f"{stage}: {name} does not define {step}()")
    if stage == "predict":
        if module.predict_step is None:
            raise MisconfiguredTypeError(
                f"predict: {name}.predict_step is None; define it or leave Module's, which calls forward()"
            )
        if not {"predict_step", "forward"} & overridden:
            raise MisconfiguredNotImplementedError(f"predict: {name} defines neither predict_step() nor forward()")
    if stage != "fit":
        loop = _evaluation_loop(trainer, stage)
        if not loop.source.is_defined():
            raise MisconfiguredValueError(
                f"{stage}: no data; pass dataloaders, a datamodule, or define {loop.prefix}_dataloader()"
            )


def _warn_unpaired_validation(trainer: Trainer, overridden: frozenset[str]) -> None:
    """Lightning's warnings (global rank 0) for a fit whose validation has a loader or a step but not both."""
    source = trainer.fit_loop.val_loop.source
    has_loader = source is not None and source.is_defined()
    has_step = "validation_step" in overridden
    if has_loader and not has_step:
        warnings.warn(
            "You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop.", stacklevel=5
        )
    if has_step and not has_loader:
        warnings.warn(
            "You defined a `validation_step` but have no `val_dataloader`. Skipping val loop.",
            PossibleUserWarning,
            stacklevel=5,
        )


def _verify_manual_optimization(args: TrainerArguments, accumulate_grad_batches: int) -> None:
    """What Lightning refuses under manual optimization: the Trainer's clipping and accumulation (the argument, or
    the value ``trainer.accumulate_grad_batches`` was set to since)."""
    if args.gradient_clip_val is not None:
        raise MisconfiguredValueError(
            f"gradient_clip_val={args.gradient_clip_val!r} under manual optimization: the Trainer does not clip when "
            "training_step steps the optimizers; remove it and call self.clip_gradients(optimizer, ...) yourself"
        )
    if accumulate_grad_batches != 1:
        raise MisconfiguredValueError(
            f"accumulate_grad_batches={accumulate_grad_batches!r} under manual optimization: the Trainer does "
            "not accumulate when training_step steps the optimizers; remove it and step every k batches yourself"
        )


def _set_up(
    trainer: Trainer,
    stage: str,
    module: Module,
    datamodule: DataModule | None,
    request: CheckpointRequest,
    parts: StageParts,
) -> dict[str, Any] | None:
    """prepare_data, setup(stage) (DataModule, callbacks, module), configure_model, the checkpoint's weights and
    callback states, then onto the device. Returns the checkpoint, if one was asked for."""
    if trainer.strategy.is_distributed:  # Lightning's DDP and FSDP strategies seed again as they set up
        reset_seed()
    hooks, hub = parts.hooks, parts.hub
    _prepare_data(trainer, module, datamodule, hooks)
    parts.logger_rows.set_up()
    profiling.set_up(trainer, module)  # once the log folder is settled: a report may go there
    if datamodule is not None:
        _call_datamodule_hook(datamodule, "setup", stage=trainer.state.fn)
    hooks.callbacks("setup", stage=trainer.state.fn)  # a TrainerFn, by keyword, as Lightning passes it
    hooks.module("setup", stage=trainer.state.fn)
    if "configure_model" in hooks.overridden:
        hooks.module("configure_model")
    checkpoint = _requested_checkpoint(trainer, stage, request)
    if checkpoint is not None:  # a module an earlier stage sharded loads its weights shard by shard
        restore_modules_and_callbacks(trainer, checkpoint)
    hub.activate(None)
    hub.reset_metrics()
    hub.first_loop_iter = None
    trainer.strategy.setup_module()  # after the checkpoint's full weights: onto the device, or sharded
    return checkpoint


def _prepare_data(trainer: Trainer, module: Module, datamodule: DataModule | None, hooks: Hooks) -> None:
    """Lightning's rule: on each node's local rank 0 (``prepare_data_per_node=True``) or on global rank 0 only,
    while the other ranks wait (within the process group's timeout)."""
    preparing = [module] if "prepare_data" in hooks.overridden else []
    if datamodule_overrides(datamodule, "prepare_data"):
        preparing.insert(0, datamodule)
    for owner in preparing:
        if (trainer.local_rank if owner.prepare_data_per_node else trainer.global_rank) != 0:
            continue
        if owner is module:
            hooks.module("prepare_data")
        else:
            owner.prepare_data()
    if preparing:
        trainer.runtime.barrier()


def _requested_checkpoint(trainer: Trainer, stage: str, request: CheckpointRequest) -> dict[str, Any] | None:
    # Rank 0's answer, or its error, on every rank: "last", "best" and "hpc" name files, which other nodes may not
    # see the same way.
    answer: tuple[str | None, ValueError | None] = (None, None)
    if trainer.is_global_zero:
        try:
            answer = (resolve_ckpt_path(trainer, request.path, stage, request.model_given), None)
        except ValueError as error:
            answer = (None, error)
    trainer.ckpt_path, error = trainer.runtime.broadcast(answer)
    if error is not None:
        raise error
    if trainer.ckpt_path is None:
        return None
    checkpoint = trainer.strategy.load_checkpoint(trainer.ckpt_path, weights_only=request.weights_only is not False)
    if stage == "fit":
        check_resumable(checkpoint, trainer.ckpt_path)
    return checkpoint


def _fit(trainer: Trainer, module: Module, parts: StageParts, checkpoint: dict[str, Any] | None) -> None:
    loop, strategy, hooks = trainer.fit_loop, trainer.strategy, parts.hooks
    loop.resolve_limits()
    strategy.setup_training()  # before configure_optimizers, as Lightning wraps (and the optimizer holds the shards)
    strategy.start_background_writes()
    trainer.optimizers, trainer.lr_scheduler_configs = strategy.setup_optimizers(hooks.module("configure_optimizers"))
    if module.automatic_optimization:
        _verify_one_optimizer(module, trainer.optimizers)
        loop.optimization = AutomaticOptimization(loop, module, hooks, strategy, trainer.optimizers, trainer.args)
    else:
        loop.optimization = ManualOptimization(loop, module, hooks, strategy, trainer.optimizers)
    hooks.both("on_fit_start")
    parts.logger_rows.hyperparameters()
    if checkpoint is not None:
        restore_training_state(trainer, checkpoint)
    module.zero_grad()  # as Lightning's _run_stage does before every loop: gradients left from before are dropped
    if loop.resume is None:  # Lightning skips the sanity check when resuming mid-epoch
        with _isolated_rng():
            loop.sanity_check()
    if strategy.root_device.type == "cuda" and trainer.args.benchmark is None:
        # Counting the planned steps requests the train loader, which Lightning does here, after the sanity check.
        process_settings.apply_autotune(trainer.args, trainer.estimated_stepping_batches, strategy.root_device)
    with torch.autograd.set_detect_anomaly(trainer.args.detect_anomaly):  # Lightning sets it either way
        loop.run()


def _verify_one_optimizer(module: Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Lightning's rule: several optimizers (or a training_step taking ``optimizer_idx``) need manual optimization."""
    takes_index = "optimizer_idx" in inspect.signature(module.training_step).parameters
    if len(optimizers) > 1 or takes_index:
        found = f"{len(optimizers)} optimizers" if len(optimizers) > 1 else "training_step(..., optimizer_idx)"
        raise RuntimeError(
            f"{found}: training with several optimizers needs manual optimization. Set "
            "self.automatic_optimization = False and step them in training_step with opt1, opt2 = self.optimizers()"
        )


def _with_module_callbacks(callbacks: list[Callback], extra: Any) -> list[Callback]:
    """Lightning's ``configure_callbacks`` merge: the module's callbacks replace the Trainer's of the same type."""
    if not extra:
        return callbacks
    extra = list(extra) if isinstance(extra, Sequence) else [extra]
    replaced = {
        existing
        for new_type in {type(c) for c in extra}
        for existing in {type(c) for c in callbacks} - {Callback}
        if issubclass(new_type, existing)
    }
    merged = [c for c in callbacks if type(c) not in replaced] + extra
    return [c for c in merged if not isinstance(c, Checkpoint)] + [c for c in merged if isinstance(c, Checkpoint)]


@contextlib.contextmanager
def _isolated_rng() -> Iterator[None]:
    """Restore torch's, CUDA's, NumPy's and Python's RNG states afterwards (Lightning's ``isolate_rng``)."""
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    python_state = random.getstate()
    try:
        import numpy
    except ImportError:
        numpy = None
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
