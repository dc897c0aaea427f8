"""``load_from_checkpoint`` of ``Module`` and ``DataModule``: the class rebuilt from a checkpoint's saved
hyperparameters, then its state loaded, as Lightning's ``lightning/pytorch/core/saving.py`` does."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import warnings
from typing import Any

import torch

from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.core.hooks import is_overridden
from gpulayer.trainer.core.hyperparameters import AttributeDict, init_argument_names
from gpulayer.trainer.core.module import Module

# Where Lightning releases before 1.0 kept a module's hyperparameters (Lightning's ``CHECKPOINT_PAST_HPARAMS_KEYS``).
_LEGACY_HPARAMS_KEYS = ("hparams", "module_arguments")
# The instantiators a checkpoint may name (saved by a LightningCLI-built module), each with GPUlayer's function:
# a checkpoint names code to run, so only these are trusted (Lightning's ``_ALLOWED_INSTANTIATORS``).
_INSTANTIATORS = {
    "gpulayer.cli.instantiate_module": "gpulayer.cli",
    "lightning.pytorch.cli.instantiate_module": "gpulayer.cli",
    "pytorch_lightning.cli.instantiate_module": "gpulayer.cli",
}


def load_module(
    cls: type,
    checkpoint_path: str | os.PathLike,
    map_location: Any = None,
    strict: bool | None = None,
    weights_only: bool | None = None,
    **overrides: Any,
) -> Any:
    """Lightning's ``load_from_checkpoint`` (``lightning/pytorch/core/saving.py``): rebuild ``cls`` from the saved
    hyperparameters (``overrides`` win), then ``configure_model``, ``on_load_checkpoint`` and the weights; the model
    is returned in train mode on the device of its first saved tensor."""
    if map_location is None and not torch.cuda.is_available():
        map_location = "cpu"
    checkpoint = checkpoint_io.load(checkpoint_path, weights_only=weights_only is not False, map_location=map_location)
    model = _rebuilt(cls, checkpoint, overrides)
    if model._strict_loading is not None and strict is not None and strict != model.strict_loading:
        raise ValueError(
            f"You set `.load_from_checkpoint(..., strict={strict!r})` which is in conflict with"
            f" `{cls.__name__}.strict_loading={model.strict_loading!r}. Please set the same value for both of them."
        )
    strict = model.strict_loading if strict is None else strict
    if is_overridden("configure_model", model, Module):
        model.configure_model()
    model.on_load_checkpoint(checkpoint)
    keys = model.load_state_dict(checkpoint["state_dict"], strict=strict)
    if not strict:  # Lightning's warnings, word for word
        if keys.missing_keys:
            warnings.warn(
                f"Found keys that are in the model state dict but not in the checkpoint: {keys.missing_keys}",
                stacklevel=3,
            )
        if keys.unexpected_keys:
            warnings.warn(
                f"Found keys that are not in the model state dict but in the checkpoint: {keys.unexpected_keys}",
                stacklevel=3,
            )
    if not checkpoint["state_dict"]:  # Lightning's warning, word for word
        warnings.warn(f"The state dict in {os.fspath(checkpoint_path)!r} contains no parameters.", stacklevel=3)
        return model
    first = next((t for t in checkpoint["state_dict"].values() if isinstance(t, torch.Tensor)), None)
    return model.to(first.device) if first is not None else model


def load_datamodule(
    cls: type, checkpoint_path: str | os.PathLike, weights_only: bool | None = None, **overrides: Any
) -> Any:
    """Lightning's ``LightningDataModule.load_from_checkpoint``: ``cls`` rebuilt from the DataModule's saved
    hyperparameters (``overrides`` win), with its ``state_dict`` loaded when the checkpoint holds one."""
    checkpoint = checkpoint_io.load(checkpoint_path, weights_only=weights_only is not False, map_location="cpu")
    datamodule = _rebuilt(cls, checkpoint, overrides)
    if cls.__qualname__ in checkpoint:
        datamodule.load_state_dict(checkpoint[cls.__qualname__])
    return datamodule


def _rebuilt(cls: type, checkpoint: dict[str, Any], overrides: dict[str, Any]) -> Any:
    """``cls(...)`` as Lightning's ``_load_state`` builds it: the saved hyperparameters with ``overrides`` merged in,
    given back their saved type (an OmegaConf container) and passed as the one argument named under
    ``CHECKPOINT_HYPER_PARAMS_NAME`` or as keywords; ``overrides`` win. ``self``, ``*args`` and ``**kwargs`` are no
    argument names, and arguments ``__init__`` does not take are dropped unless it takes ``**kwargs``."""
    saved = checkpoint.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {})
    saved.update(overrides)
    # A module's hyperparameters under Lightning's keys of old releases come first; the current key's win.
    legacy = [checkpoint.get(key, {}) for key in _LEGACY_HPARAMS_KEYS] if issubclass(cls, Module) else []
    merged = {key: value for mapping in (*legacy, saved) for key, value in mapping.items()}
    arguments = _as_saved_type(merged, checkpoint.get(cls.CHECKPOINT_HYPER_PARAMS_TYPE))
    names = init_argument_names(cls)
    name = checkpoint.get(cls.CHECKPOINT_HYPER_PARAMS_NAME)
    if name and name in names:
        arguments = {name: arguments}
    arguments = {**arguments, **overrides}
    instantiator = _instantiator(cls, arguments.pop("_instantiator", None), arguments.get("_class_path"))
    # getfullargspec, as Lightning: a decorated __init__ is read here as its wrapper, whose **kwargs keeps everything.
    if not inspect.getfullargspec(cls.__init__).varkw:
        arguments = {key: value for key, value in arguments.items() if key in names}
    return instantiator(cls, arguments) if instantiator else cls(**arguments)


def _instantiator(cls: type, path: Any, class_path: Any) -> Any:
    """The function a checkpoint's ``_instantiator`` names (None where it names none), once the name is trusted and
    its ``_class_path`` is a subclass of ``cls`` already imported: loading a checkpoint never imports new code."""
    if path is None:
        return None
    if not isinstance(path, str) or path not in _INSTANTIATORS:
        raise ValueError(
            f"The instantiator {path!r} from the checkpoint is not one of the trusted instantiators "
            f"{sorted(_INSTANTIATORS)} and was blocked to prevent arbitrary code execution."
        )
    if class_path is not None and not _is_imported_subclass(class_path, cls):
        raise ValueError(
            f"The class {class_path!r} requested by the checkpoint does not resolve to an already imported subclass "
            f"of {cls.__name__} and was blocked to prevent arbitrary code execution. If you trust this checkpoint, "
            "import the module that defines the class before loading."
        )
    try:
        module = importlib.import_module(_INSTANTIATORS[path])
    except ImportError as missing:
        raise ImportError(
            f"The checkpoint was saved by a module LightningCLI built ({path}); pip install gpulayer-cli to load it"
        ) from missing
    return module.instantiate_module


def _is_imported_subclass(class_path: Any, cls: type) -> bool:
    if not isinstance(class_path, str):
        return False
    module_path, _, name = class_path.rpartition(".")
    target = getattr(sys.modules.get(module_path), name, None)
    return isinstance(target, type) and issubclass(target, cls)


def _as_saved_type(arguments: dict[str, Any], saved_type: Any) -> Any:
    """Lightning's ``_convert_loaded_hparams``: ``saved_type(arguments)``; a type saved as text (old files) gives an
    ``AttributeDict``."""
    if not saved_type:
        return arguments
    return AttributeDict(arguments) if isinstance(saved_type, str) else saved_type(arguments)
