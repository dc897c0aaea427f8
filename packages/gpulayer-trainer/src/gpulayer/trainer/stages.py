"""What every entry point does around its loop: set up, run, tear down, or report the exception.

Lightning 2.6's are ``Trainer._run`` (``lightning/pytorch/trainer/trainer.py``) and ``_call_and_handle_interrupt``
(``lightning/pytorch/trainer/call.py``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from gpulayer.trainer import checkpoint_io, process_settings
from gpulayer.trainer.batch import map_tensors
from gpulayer.trainer.callback import Callback, Checkpoint
from gpulayer.trainer.checkpoint import resolve_ckpt_path, restore_modules_and_callbacks, restore_training_state
from gpulayer.trainer.datamodule import DataModule
from gpulayer.trainer.ddp import DataParallel
from gpulayer.trainer.hooks import Hooks, is_overridden
from gpulayer.trainer.module import Module
from gpulayer.trainer.optimization import AutomaticOptimization
from gpulayer.trainer.optimizers import parse_optimizers
from gpulayer.trainer.preemption import sigterm_noted


def run_stage(trainer: Any, stage: str, module: Module, datamodule: DataModule | None) -> Any:
    """Run ``stage`` ("fit", "validate", "test", "predict") on ``module``; returns the loop's result."""
    trainer.should_stop = False
    trainer.state_fn = stage
    trainer.lightning_module, module.trainer = module, trainer
    trainer.datamodule = datamodule
    if datamodule is not None:
        datamodule.trainer = trainer
    trainer._hooks = Hooks(trainer, module, trainer.callbacks)
    trainer._batch_moves = None
    try:
        trainer.callbacks = _with_module_callbacks(trainer.callbacks, trainer._hooks.module("configure_callbacks"))
        trainer._hooks = hooks = Hooks(trainer, module, trainer.callbacks)
        _verify(trainer, stage, module)
        checkpoint = _set_up(trainer, stage, module, datamodule, hooks)
        if stage == "fit":
            trainer.received_sigterm = False
            with sigterm_noted(trainer):
                result = _fit(trainer, module, hooks, checkpoint)
        else:
            loop = {"validate": trainer._val_loop, "test": trainer._test_loop, "predict": trainer._predict_loop}[stage]
            trainer._logger_rows.hyperparameters()
            # A sharded module gathers its parameters in each step: tensors made under inference_mode could not
            # serve a later training step (Lightning also evaluates FSDP under no_grad).
            inference = trainer.args.inference_mode and trainer._sharded is None
            with torch.inference_mode() if inference else torch.no_grad():
                result = loop.run()
    except BaseException as error:
        _release_data_parallel(trainer)
        trainer._logger_rows.finalize("failed")
        trainer._hooks.on_exception(error)
        if datamodule is not None:
            datamodule.on_exception(error)
        _to_cpu(trainer, module)
        if isinstance(error, KeyboardInterrupt):
            raise SystemExit(1) from error  # Lightning's behaviour after its graceful shutdown
        raise
    _release_data_parallel(trainer)
    _to_cpu(trainer, module)
    trainer._logger_rows.finalize("success")
    if stage == "fit":
        hooks.both("on_fit_end")
    if datamodule is not None:
        datamodule.teardown(stage)
    hooks.callbacks("teardown", stage)
    hooks.module("teardown", stage)
    return result


def _release_data_parallel(trainer: Any) -> None:
    """Drop DDP and the step that runs inside it, so their gradient buckets are freed once the stage ends."""
    trainer._data_parallel = trainer._optimization = None


_REMOVED_HOOKS = {
    "training_epoch_end": "on_train_epoch_end",
    "validation_epoch_end": "on_validation_epoch_end",
    "test_epoch_end": "on_test_epoch_end",
}


def _verify(trainer: Any, stage: str, module: Module) -> None:
    """Lightning's ``_verify_loop_configurations``: inside the run, so ``on_exception`` hears about it."""
    name = type(module).__name__
    for removed, new in _REMOVED_HOOKS.items():
        if hasattr(module, removed):
            raise NotImplementedError(f"{name}.{removed} was removed in Lightning 2.0; use {new}")
    if stage == "fit":
        if not is_overridden("training_step", module, Module):
            raise NotImplementedError(f"{name} must define training_step() to fit")
        if not module.automatic_optimization:
            raise NotImplementedError(f"{name}.automatic_optimization=False: manual optimization is not supported yet")
        if not trainer._train_source.is_defined():
            raise ValueError(
                "fit: no training data; pass train_dataloaders, a datamodule, or define train_dataloader()"
            )
    step = {"validate": "validation_step", "test": "test_step"}.get(stage)
    if step is not None and not is_overridden(step, module, Module):
        raise NotImplementedError(f"{stage}: {name} does not define {step}()")
    if stage != "fit":
        loop = {"validate": trainer._val_loop, "test": trainer._test_loop, "predict": trainer._predict_loop}[stage]
        if not loop.source.is_defined():
            raise ValueError(f"{stage}: no data; pass dataloaders, a datamodule, or define {loop.prefix}_dataloader()")


def _set_up(
    trainer: Any, stage: str, module: Module, datamodule: DataModule | None, hooks: Hooks
) -> dict[str, Any] | None:
    """prepare_data, setup(stage) (DataModule, callbacks, module), configure_model, the checkpoint's weights and
    callback states, then onto the device. Returns the checkpoint, if one was asked for."""
    _prepare_data(trainer, module, datamodule, hooks)
    if trainer.logger is not None:
        trainer.logger.settle_version(trainer.runtime)  # every rank names rank 0's version folder
        if trainer.is_global_zero:
            trainer.logger.save()  # makes the version folder now, as Lightning's setup does through logger.experiment
    if datamodule is not None:
        datamodule.setup(stage)
    hooks.callbacks("setup", stage)
    hooks.module("setup", stage)
    if is_overridden("configure_model", module, Module):
        hooks.module("configure_model")
    checkpoint = _requested_checkpoint(trainer, stage)
    # A module an earlier stage sharded stays sharded (its weights load shard by shard); another is sharded below.
    trainer._sharded = trainer._sharding.sharded(module) if trainer._sharding is not None else None
    if checkpoint is not None:
        restore_modules_and_callbacks(trainer, checkpoint)
    trainer._metric_hub.activate(None)
    trainer._metric_hub.reset_metrics()
    trainer._metric_hub.first_loop_iter = None
    if trainer._sharded is None:
        module.to(trainer._device)
        trainer._precision.convert_module(module)
    if trainer._sharding is not None and trainer._sharded is None:  # after the checkpoint's full weights
        trainer._sharded = trainer._sharding.connect(module, trainer)
    return checkpoint


def _prepare_data(trainer: Any, module: Module, datamodule: DataModule | None, hooks: Hooks) -> None:
    """Lightning's rule: on each node's local rank 0 (``prepare_data_per_node=True``) or on global rank 0 only,
    while the other ranks wait (within the process group's timeout)."""
    prepared = False
    for owner, base in ((datamodule, DataModule), (module, Module)):
        if owner is None or not is_overridden("prepare_data", owner, base):
            continue
        prepared = True
        if (trainer.local_rank if owner.prepare_data_per_node else trainer.global_rank) != 0:
            continue
        if owner is module:
            hooks.module("prepare_data")
        else:
            owner.prepare_data()
    if prepared:
        trainer.runtime.barrier()


def _requested_checkpoint(trainer: Any, stage: str) -> dict[str, Any] | None:
    ckpt_path, weights_only, model_given = trainer._checkpoint_request
    trainer._checkpoint_request = (None, None, True)
    # Rank 0's answer, or its error, on every rank: "last", "best" and "hpc" name files, which other nodes may not
    # see the same way.
    answer: tuple[str | None, ValueError | None] = (None, None)
    if trainer.is_global_zero:
        try:
            answer = (resolve_ckpt_path(trainer, ckpt_path, stage, model_given), None)
        except ValueError as error:
            answer = (None, error)
    trainer.ckpt_path, error = trainer.runtime.broadcast(answer)
    if error is not None:
        raise error
    if trainer.ckpt_path is None:
        return None
    return checkpoint_io.load(trainer.ckpt_path, weights_only=weights_only is not False)


def _fit(trainer: Any, module: Module, hooks: Hooks, checkpoint: dict[str, Any] | None) -> None:
    trainer.fit_loop.resolve_limits()
    if trainer._ddp is not None and trainer.world_size > 1:  # before configure_optimizers, as Lightning wraps
        trainer._data_parallel = DataParallel(module, trainer._ddp, trainer._device)
    trainer._data_parallel = trainer._sharded or trainer._data_parallel  # the optimizer holds the shards
    trainer.optimizers, trainer.lr_scheduler_configs = parse_optimizers(hooks.module("configure_optimizers"))
    trainer._optimization = AutomaticOptimization(trainer)
    hooks.both("on_fit_start")
    trainer._logger_rows.hyperparameters()
    if checkpoint is not None:
        restore_training_state(trainer, checkpoint)
    if trainer.fit_loop.resume is None:  # Lightning skips the sanity check when resuming mid-epoch
        with _isolated_rng():
            _sanity_check(trainer, hooks)
    if trainer._device.type == "cuda" and trainer.args.benchmark is None:
        # Counting the planned steps requests the train loader, which Lightning does here, after the sanity check.
        process_settings.apply_autotune(trainer.args, trainer.estimated_stepping_batches, trainer._device)
    trainer.fit_loop.run()


def _sanity_check(trainer: Any, hooks: Hooks) -> None:
    """A few validation batches before training; its metrics are discarded and the RNG is left as it was."""
    if not (trainer._val_loop.is_enabled() and trainer.args.num_sanity_val_steps > 0):
        return
    hub = trainer._metric_hub
    trainer.sanity_checking = True
    try:
        hub.reset_results()
        hub.reset_metrics()
        hooks.callbacks("on_sanity_check_start")
        trainer._run_validation()
        hooks.callbacks("on_sanity_check_end")
        hub.activate(trainer._val_loop.results)
        hub.reset_results()
        hub.reset_metrics()
    finally:
        trainer.sanity_checking = False


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


def _to_cpu(trainer: Any, module: Module) -> None:
    """Lightning's strategy teardown: the model and the optimizer state go back to the CPU after every run (a
    sharded module stays sharded where it is, for the next stage)."""
    if trainer._device.type == "cpu" or trainer._sharded is not None:
        return
    module.cpu()
    for optimizer in trainer.optimizers:
        for state in optimizer.state.values():
            for key, value in state.items():
                state[key] = map_tensors(value, lambda t: t.cpu())


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
