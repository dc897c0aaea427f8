"""A library's ``LightningModule`` under GPUlayer's Trainer: taken as it is, with GPUlayer's ``Module`` underneath.

pytorch-forecasting's models, torchgeo's tasks and many research packages ship classes built on Lightning's
``LightningModule``. Their inherited ``log``, ``trainer``, ``optimizers``, ... are Lightning's, which read Lightning's
Trainer. For the length of one entry point (``fit``, ``validate``, ``test``, ``predict``) such an instance is given a
class of its own, made once per library class, whose method resolution order puts GPUlayer's ``Module`` (and its
mixins) between the library's classes and Lightning's:

    <library classes> → Module, GPUlayer's mixins → LightningModule, Lightning's mixins → nn.Module

So every method the library (or the user) defines still wins, a library method's ``super().log(...)`` reaches
GPUlayer's ``log``, a name only Lightning defines (``fabric``, ``to_tensorrt``, the device-tracking ``to``) stays
Lightning's, and ``isinstance`` holds for the library's class, Lightning's and GPUlayer's. GPUlayer's loop never calls
Lightning's code. When the entry point returns, the instance gets its own class back, so the library's own
Lightning-based paths (its ``predict`` that builds Lightning's Trainer, its ``load_from_checkpoint``) see it as before.
Lightning is recognised by module name: the trainer never imports it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from torch import nn

from gpulayer.trainer.core.hooks import is_overridden
from gpulayer.trainer.core.lightning_classes import is_lightnings, lightning_class
from gpulayer.trainer.core.module import Module
from gpulayer.trainer.exceptions import MisconfigurationException

# GPUlayer's classes that take the place of Lightning's: Module and its mixins, without nn.Module's own classes.
_GPULAYER_CLASSES = tuple(kind for kind in Module.__mro__ if kind not in nn.Module.__mro__)


def lightning_module_base(model: Any) -> type | None:
    """Lightning's ``LightningModule`` where ``model`` is built on it (and not on GPUlayer's ``Module``), else None."""
    return None if isinstance(model, Module) else lightning_class(type(model), "LightningModule", "core.module")


@contextlib.contextmanager
def as_module(model: Any) -> Iterator[Any]:
    """``model`` as a GPUlayer ``Module`` for the block: a library's LightningModule is given its GPUlayer class (see
    the module's docstring) and gets its own back after; anything else is yielded unchanged."""
    base = lightning_module_base(model)
    if base is None:
        yield model
        return
    own = type(model)
    if is_overridden("configure_sharded_model", model, base):
        raise MisconfigurationException(
            f"{own.__qualname__}.configure_sharded_model: Lightning deprecated this hook and GPUlayer does not call it; "
            "override configure_model instead, or keep Lightning's Trainer for this model"
        )
    _add_module_state(model)
    model.__class__ = _gpulayer_class(own)
    try:
        yield model
    finally:
        model.__class__ = own
        _settle_lightning_device(model)


class _GPUlayerOrder(type):
    """The metaclass of the GPUlayer classes: GPUlayer's ``Module`` goes in just above Lightning's first class."""

    def mro(cls) -> list[type]:
        (own,) = cls.__bases__
        order: list[type] = [cls]
        for kind in own.__mro__:
            if is_lightnings(kind) and _GPULAYER_CLASSES[0] not in order:
                order.extend(_GPULAYER_CLASSES)
            order.append(kind)
        return order


@functools.cache
def _gpulayer_class(own: type) -> type:
    """``own``'s GPUlayer class: same name, and pickled (``torch.save``, ``copy.deepcopy``) as ``own``."""
    namespace = {"__module__": own.__module__, "__qualname__": own.__qualname__, "__reduce_ex__": _reduce_as_own}
    return _GPUlayerOrder(own.__name__, (own,), namespace)


def _reduce_as_own(self: Any, protocol: Any) -> Any:
    """``object.__reduce_ex__`` with the library's class in place of its GPUlayer class, so a copy made during a stage
    (an averaging callback's ``deepcopy``) is of the library's class and a pickle names a class that can be found."""
    reduced = object.__reduce_ex__(self, protocol)
    gpulayer_class, own = type(self), type(self).__bases__[0]
    arguments = tuple(own if each is gpulayer_class else each for each in reduced[1])
    return (reduced[0], arguments, *reduced[2:])


def _add_module_state(model: Any) -> None:
    """What GPUlayer's ``Module.__init__`` sets that Lightning's does not (Lightning's ``_trainer``,
    ``_current_fx_name``, ``_example_input_array`` and ``_strict_loading`` are GPUlayer's names already)."""
    model.__dict__.setdefault("_requires_grad_before_toggle", {})


def _settle_lightning_device(model: Any) -> None:
    """Lightning's ``device`` and ``dtype`` read attributes its ``to`` keeps; a strategy that moved the module through
    ``nn.Module``'s own methods leaves them stale, so they are set from the module's tensors."""
    for parameter in model.parameters():
        if "_device" in model.__dict__:
            model._device = parameter.device
        if "_dtype" in model.__dict__:
            model._dtype = parameter.dtype
        return
