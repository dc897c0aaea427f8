"""What a checkpoint holds (Lightning 2.6's top-level layout) and how a run is restored from one.

Lightning's are ``_CheckpointConnector.dump_checkpoint`` and its ``restore_*`` methods, in
``lightning/pytorch/trainer/connectors/checkpoint_connector.py``.

Beyond Lightning, GPUlayer stores the RNG states and where in the epoch the run was, so a resumed run ends
with the weights of an uninterrupted one.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from dataclasses import dataclass
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.hpc import hpc_resume_path, is_restart
from gpulayer.trainer.exceptions import MisconfiguredValueError

if TYPE_CHECKING:
    from gpulayer.trainer.trainer import Trainer

LIGHTNING_FORMAT = "2.6.6"  # the Lightning release whose layout these files follow


@dataclass(frozen=True)
class CheckpointRequest:
    """What an entry point asked to load: ``ckpt_path``, ``weights_only``, and whether a model was passed."""

    path: str | os.PathLike | None = None
    weights_only: bool | None = None
    model_given: bool = True


def dump_checkpoint(trainer: Trainer, weights_only: bool = False) -> dict[str, Any]:
    module, datamodule, strategy = trainer.lightning_module, trainer.datamodule, trainer.strategy
    checkpoint: dict[str, Any] = {
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "pytorch-lightning_version": LIGHTNING_FORMAT,
        "gpulayer_version": version("gpulayer-trainer"),
        "state_dict": strategy.lightning_module_state_dict(),
        "loops": {"fit_loop": trainer.fit_loop.state_dict()},
    }
    if not weights_only:
        checkpoint["callbacks"] = _callback_states(trainer.callbacks)
        checkpoint["optimizer_states"] = [strategy.optimizer_state(optimizer) for optimizer in trainer.optimizers]
        checkpoint["lr_schedulers"] = [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs]
        scaler = strategy.precision_plugin.scaler
        if scaler is not None and scaler.state_dict():
            checkpoint["MixedPrecision"] = scaler.state_dict()
        checkpoint["rng_states"] = rng_states()
    for owner in (module, datamodule):
        hparams = getattr(owner, "hparams", None) if owner is not None else None
        if hparams:
            if getattr(owner, "_hparams_name", None) is not None:
                checkpoint[owner.CHECKPOINT_HYPER_PARAMS_NAME] = owner._hparams_name
            if _is_omegaconf_container(hparams):  # kept as it is, with its type, so loading gives it back
                checkpoint[owner.CHECKPOINT_HYPER_PARAMS_KEY] = hparams
                checkpoint[owner.CHECKPOINT_HYPER_PARAMS_TYPE] = type(hparams)
            else:
                checkpoint[owner.CHECKPOINT_HYPER_PARAMS_KEY] = dict(hparams)
    if datamodule is not None and (state := datamodule.state_dict()):
        checkpoint[type(datamodule).__qualname__] = state
    if not weights_only:
        for callback in trainer.callbacks:
            callback.on_save_checkpoint(trainer, module, checkpoint)
    trainer._hooks.module("on_save_checkpoint", checkpoint)
    return checkpoint


def save_behind_training(trainer: Trainer, filepath: str | os.PathLike, weights_only: bool = False) -> None:
    """A checkpoint callback's save: ``trainer.save_checkpoint``, except that while ``fit`` runs with
    ``async_save`` global rank 0 stages the checkpoint and returns, its file written behind training."""
    writes = trainer.strategy.background_writes
    if writes is None or trainer.strategy.saves_on_every_rank:
        trainer.save_checkpoint(filepath, weights_only)
    else:
        writes.save(dump_checkpoint(trainer, weights_only=bool(weights_only)), filepath, trainer.global_step)


def _callback_states(callbacks: list[Any]) -> dict[str, Any]:
    """``{state_key: state_dict()}`` of the callbacks with state; two with one key would lose one (Lightning's error)."""
    states: dict[str, Any] = {}
    for callback in callbacks:
        if state := callback.state_dict():
            if callback.state_key in states:
                raise RuntimeError(
                    f"two callbacks have the state key {callback.state_key!r}; give one of them different arguments "
                    "or a state_key of its own, or their checkpoint states would overwrite each other"
                )
            states[callback.state_key] = state
    return states


def restore_modules_and_callbacks(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """After ``configure_model``: the module's hook, its weights, the DataModule's and callbacks' states."""
    module, datamodule = trainer.lightning_module, trainer.datamodule
    trainer._hooks.module("on_load_checkpoint", checkpoint)
    # A sharded checkpoint has no state_dict: its weights were read into the shards by strategy.load_checkpoint.
    if "state_dict" in checkpoint:
        trainer.strategy.load_model_state_dict(checkpoint["state_dict"], strict=module.strict_loading)
    if datamodule is not None and type(datamodule).__qualname__ in checkpoint:
        datamodule.load_state_dict(checkpoint[type(datamodule).__qualname__])
    states = checkpoint.get("callbacks", {})
    missing = states.keys() - {callback.state_key for callback in trainer.callbacks}
    if missing and trainer.is_global_zero:  # Lightning's warning (_call_callbacks_on_load_checkpoint)
        warnings.warn(
            "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided "
            f"during `Trainer` instantiation. Please add the following callbacks: {sorted(missing)}.",
            UserWarning,
            stacklevel=4,
        )
    for callback in trainer.callbacks:
        callback.on_load_checkpoint(trainer, module, checkpoint)
    for callback in trainer.callbacks:
        if callback.state_key in states:
            callback.load_state_dict(states[callback.state_key])


def check_resumable(checkpoint: dict[str, Any], path: str) -> None:
    """Refuse, before ``fit`` restores anything, a checkpoint whose loop position another trainer wrote: Lightning's
    ``loops`` entry holds its own loop objects' state, not GPUlayer's."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    if isinstance(fit_loop, dict) and "epochs_processed" not in fit_loop:
        raise ValueError(
            f"fit(ckpt_path={path!r}): its loop position was written by another trainer (Lightning's loops entry: "
            f"{', '.join(sorted(fit_loop)[:3])}, ...), and GPUlayer resumes training only from checkpoints it "
            "saved. Its weights load with Module.load_from_checkpoint, to start a new fit from them"
        )


def restore_training_state(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """After ``on_fit_start``: scaler, loop position, optimizers, schedulers and the RNG states."""
    for key in ("optimizer_states", "lr_schedulers"):
        if key not in checkpoint:
            raise KeyError(f"the checkpoint has no {key!r}: it was saved with weights_only=True and cannot resume fit")
    strategy = trainer.strategy
    scaler = strategy.precision_plugin.scaler
    if scaler is not None and "MixedPrecision" in checkpoint:
        scaler.load_state_dict(checkpoint["MixedPrecision"])
    loop = trainer.fit_loop
    loop.load_state_dict(checkpoint["loops"]["fit_loop"])
    if (
        loop.max_epochs != -1 and loop.progress.epochs_completed > loop.max_epochs
    ):  # Lightning's check, and its strict ">"
        raise MisconfiguredValueError(
            f"fit(ckpt_path={trainer.ckpt_path!r}): the checkpoint is at current_epoch={loop.progress.epochs_completed}, past "
            f"max_epochs={loop.max_epochs}; raise max_epochs to train on from it"
        )
    for optimizer, state in zip(trainer.optimizers, checkpoint["optimizer_states"], strict=True):
        strategy.load_optimizer_state_dict(optimizer, state)
    # No configs: a callback cleared them in on_fit_start to rebuild its own from its state (Lightning's SWA).
    schedulers = checkpoint["lr_schedulers"] if trainer.lr_scheduler_configs else []
    for config, state in zip(trainer.lr_scheduler_configs, schedulers, strict=True):
        config.scheduler.load_state_dict(state)
    # A run max_steps stopped mid-epoch goes on with the RNG states at the stop, not those at the save.
    states = (loop.resume or {}).get("rng_states", checkpoint.get("rng_states"))
    if states is not None:
        set_rng_states(states)


def rng_states() -> dict[str, Any]:
    """torch's, CUDA's, Python's and NumPy's global RNG states, as tensors and plain values only."""
    version_, internal, gauss = random.getstate()
    # Python's 625 words as one tensor: as a list they were 625 objects to pickle at every save.
    python = [version_, torch.tensor(internal, dtype=torch.int64), gauss]
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": python}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return states
    kind, keys, position, has_gauss, cached = numpy.random.get_state()
    states["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(position), int(has_gauss), float(cached)]
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version_, internal, gauss = states["python"]
    internal = internal.tolist() if isinstance(internal, torch.Tensor) else internal  # a list before 2026-12-04
    random.setstate((version_, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():  # the GPUs present, when resumed on fewer than it saved
        torch.cuda.set_rng_state_all(states["cuda"][: torch.cuda.device_count()])
    if "numpy" in states:
        import numpy

        kind, keys, position, has_gauss, cached = states["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), position, has_gauss, cached))


def resolve_ckpt_path(
    trainer: Trainer, ckpt_path: str | os.PathLike | None, stage: str, model_given: bool
) -> str | None:
    """Lightning's ``ckpt_path`` rules: a path, ``"last"`` (newest ``last*.ckpt`` of the checkpoint callbacks, or
    file of an ``OnExceptionCheckpoint``), ``"best"`` (the first checkpoint callback's ``best_model_path``),
    ``"hpc"`` (the highest ``hpc_ckpt_N.ckpt`` in ``default_root_dir``); an evaluation without a model uses "best".
    ``fit`` without one resumes by itself where a job is continued: under Slurm from an hpc checkpoint (Lightning's
    rule), in workers the elastic agent restarted from the newest checkpoint there is (GPUlayer's), and with an
    ``OnExceptionCheckpoint`` from "last" (Lightning's rule)."""
    if ckpt_path is None and stage == "fit":
        ckpt_path = _automatic_resume(trainer)
    if ckpt_path == "hpc":
        path = hpc_resume_path(trainer.default_root_dir)
        if path is None:
            raise ValueError(
                f'{stage}(ckpt_path="hpc"): no hpc_ckpt_N.ckpt in {trainer.default_root_dir}; pass a checkpoint path'
            )
        return path
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback is not None else ""
    if ckpt_path is None and stage != "fit" and not model_given and best:
        warnings.warn(
            f"{stage}: no model and no ckpt_path given; using ckpt_path='best' ({best})", UserWarning, stacklevel=4
        )
        ckpt_path = "best"
    if ckpt_path == "best":
        if len(trainer.checkpoint_callbacks) > 1 and trainer.is_global_zero:
            warnings.warn(
                f'{stage}(ckpt_path="best") with {len(trainer.checkpoint_callbacks)} ModelCheckpoint callbacks: the '
                "best checkpoint of the first one is used",
                UserWarning,
                stacklevel=4,
            )
        callback = trainer.checkpoint_callback
        if callback is None:
            raise ValueError(f'{stage}(ckpt_path="best"): there is no checkpoint callback to know the best checkpoint')
        if not callback.best_model_path:
            raise ValueError(f'{stage}(ckpt_path="best"): no checkpoint has been saved yet')
        return callback.best_model_path
    if ckpt_path == "last":
        candidates = [
            os.path.join(cb.dirpath, name)
            for cb in trainer.checkpoint_callbacks
            if cb.dirpath and os.path.isdir(cb.dirpath)
            for name in os.listdir(cb.dirpath)
            if name.startswith("last") and name.endswith(".ckpt")
        ] + [cb.ckpt_path for cb in _on_exception_checkpoints(trainer) if os.path.exists(cb.ckpt_path)]
        if not candidates:
            warnings.warn(
                f'{stage}(ckpt_path="last"): no last*.ckpt found, nor an OnExceptionCheckpoint file; starting from '
                "scratch",
                UserWarning,
                stacklevel=4,
            )
            return None
        return max(candidates, key=os.path.getmtime)
    return None if ckpt_path is None else os.fspath(ckpt_path)


def _on_exception_checkpoints(trainer: Trainer) -> list[Any]:
    """The ``gpulayer.callbacks.OnExceptionCheckpoint`` callbacks (none before that package is imported)."""
    callbacks = sys.modules.get("gpulayer.callbacks")
    if callbacks is None:
        return []
    return [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, callbacks.OnExceptionCheckpoint)]


def _automatic_resume(trainer: Trainer) -> str | None:
    hpc = hpc_resume_path(trainer.default_root_dir)
    if is_restart():
        newest = _newest_checkpoint(trainer, hpc)
        if newest is not None:
            print(f"restarted by the elastic agent: resuming from {newest}", flush=True)
        return newest
    if hpc is not None and trainer.runtime.placement.source == "slurm":
        return hpc
    if hpc is not None:
        warnings.warn(
            f"{hpc} is the checkpoint of a fit that a SIGTERM stopped; fit(ckpt_path='hpc') resumes it",
            UserWarning,
            stacklevel=5,
        )
    if _on_exception_checkpoints(trainer):
        warnings.warn(
            "fit: no ckpt_path given with an OnExceptionCheckpoint among the callbacks: ckpt_path='last' is used "
            "(the newest of its file and the last*.ckpt files), as in Lightning; pass a ckpt_path to choose",
            UserWarning,
            stacklevel=5,
        )
        return "last"
    return None


def _newest_checkpoint(trainer: Trainer, hpc: str | None) -> str | None:
    """The newest hpc checkpoint or checkpoint-callback file: where a crashed run last saved."""
    candidates = [hpc] if hpc is not None else []
    for callback in trainer.checkpoint_callbacks:
        folder = getattr(callback, "dirpath", None)
        if folder and os.path.isdir(folder):
            candidates += [
                os.path.join(folder, n)
                for n in os.listdir(folder)
                if n.endswith(".ckpt") and not checkpoint_io.is_temporary(n)
            ]
    return max(candidates, key=os.path.getmtime, default=None)


def _is_omegaconf_container(value: Any) -> bool:
    """A ``DictConfig`` or ``ListConfig``; without importing omegaconf, which cannot have made one unless imported."""
    omegaconf = sys.modules.get("omegaconf")
    return omegaconf is not None and isinstance(value, omegaconf.Container)
