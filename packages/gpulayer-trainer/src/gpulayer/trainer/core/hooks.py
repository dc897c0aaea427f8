"""Calling hooks in Lightning's order: callbacks first (in ``trainer.callbacks`` order), then the module.

Each call records the running hook's name on the module, which is how ``self.log`` knows where it is. Lightning 2.6
calls every hook (``lightning/pytorch/trainer/call.py``); GPUlayer calls one only where it is ``is_called``, so an
unused hook costs nothing per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpulayer.trainer.core.callback import CALLBACK_HOOKS, TRAIN_BATCH_HOOKS, Callback, callback_base

if TYPE_CHECKING:
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.trainer import Trainer

# Module hooks whose default does nothing (or hands its first argument back): not calling them when they are
# not overridden is the same run, minus a Python call per hook per step.
_DEFAULT_NOOPS = frozenset(name for name in CALLBACK_HOOKS if name not in ("setup", "teardown", "on_exception"))
_DEFAULT_PASS_THROUGH = frozenset({"on_before_batch_transfer", "on_after_batch_transfer"})
# The module's methods whose overriding a stage checks as it sets up (Lightning's configuration checks).
_ASKED_BY_STAGES = frozenset(
    {
        "training_step",
        "validation_step",
        "test_step",
        "predict_step",
        "forward",
        "configure_optimizers",
        "configure_model",
        "prepare_data",
    }
)


def is_overridden(name: str, instance: Any, base: type) -> bool:
    """Lightning 2.6's ``is_overridden`` (``lightning/pytorch/utilities/model_helpers.py``): whether ``instance``'s
    class, or the instance itself (``DataModule.from_datasets`` sets its loader methods that way), defines ``name``
    differently from ``base``. It looks through a ``functools.wraps`` wrapper (``__wrapped__``): a wrapper of
    ``base``'s own method is no override. The set-up checks and the choice of a hook's owner ask this."""
    return _defines(name, instance, base, unwrap=True)


def is_called(name: str, instance: Any, base: type) -> bool:
    """Whether the Trainer calls the hook ``name``: its class defines one other than ``base``'s, or the instance holds
    its own, a ``functools.wraps`` wrapper of ``base``'s included (tracing tools and Lightning's
    ``tests_pytorch/models/test_hooks.py`` assign those, and Lightning calls them as it calls every hook)."""
    return _defines(name, instance, base, unwrap=False)


def _defines(name: str, instance: Any, base: type, unwrap: bool) -> bool:
    """The rule of both: a hook set to None on the instance is switched off; an object that passes for a ``base``
    without deriving from it (a ``Mock(spec=Callback)``) defines every hook, as Lightning calls every hook."""
    default = getattr(base, name, None)
    own = getattr(instance, "__dict__", {})
    if name in own:
        value = own[name]
        return value is not None and (not unwrap or _function(value, unwrap) is not default)
    if isinstance(instance, base) and not issubclass(type(instance), base):
        return True
    method = getattr(type(instance), name, None)
    return method is not None and _function(method, unwrap) is not default


def _function(method: Any, unwrap: bool) -> Any:
    """The function behind a method; with ``unwrap``, unwrapped once from ``functools.wraps`` as Lightning's
    ``is_overridden`` does."""
    if unwrap:
        method = getattr(method, "__wrapped__", method)
    return getattr(method, "__func__", method)


def _set_to_none(module: Module, base: type) -> set[str]:
    """The hooks of ``base`` that ``module`` (its instance or its class) sets to None: Lightning's
    ``_call_lightning_module_hook`` skips them."""
    owners = (vars(module), *(vars(cls) for cls in type(module).__mro__))
    named = {name for owner in owners for name, value in owner.items() if value is None}
    return {name for name in named if getattr(module, name, 0) is None and callable(getattr(base, name, None))}


def _call_step(module: Module, state: dict[str, Any], name: str, *args: Any) -> Any:
    """``module.<name>(*args)`` with ``name`` recorded as the running hook: ``Hooks.step_caller``'s body, at module
    level so that a Trainer holding a step caller pickles (a partial of it costs no more per call than a closure)."""
    previous, state["_current_fx_name"] = state["_current_fx_name"], name
    try:
        return getattr(module, name)(*args)
    finally:
        state["_current_fx_name"] = previous


def monitors_metrics(callback: Callback) -> bool:
    """Early stopping and checkpoint callbacks run after the module's ``on_train_epoch_end`` (Lightning's rule)."""
    return getattr(callback, "_runs_after_module_on_train_epoch_end", False)


class Hooks:
    """The Trainer's one hook caller; ``attach`` points it at each stage's module and callbacks."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer
        self.active: frozenset[str] = frozenset()
        self.every_batch: frozenset[str] = frozenset()
        self.overridden: frozenset[str] = frozenset()

    def attach(self, module: Module, callbacks: list[Callback]) -> None:
        from gpulayer.trainer.core.module import Module

        self._module = module
        self._callbacks = callbacks
        self._overriding = {
            name: [cb for cb in callbacks if is_called(name, cb, callback_base(cb))] for name in CALLBACK_HOOKS
        }
        # Which set-up methods the module overrides (Lightning's rule), and which default hooks it calls, asked once.
        self.overridden = frozenset(name for name in _ASKED_BY_STAGES if is_overridden(name, module, Module))
        skippable = _DEFAULT_NOOPS | _DEFAULT_PASS_THROUGH
        called = frozenset(name for name in skippable if is_called(name, module, Module))
        self._noops = _DEFAULT_NOOPS - called
        self._pass_through = _DEFAULT_PASS_THROUGH - called
        self._not_called = self._noops | self._pass_through | _set_to_none(module, Module)
        # The hook name is written to the instance dict directly: nn.Module.__setattr__ costs microseconds.
        self._module_state = module.__dict__
        # The hooks for which ``both`` calls anything: per-step callers skip the others (and building their
        # arguments) with one set lookup.
        self.active = frozenset(name for name in CALLBACK_HOOKS if self._overriding[name] or name not in self._noops)
        # The train batch hooks that must run at every batch: the module's, and callbacks' not marked
        # ``follows_cadence`` (as in Lightning, a user's batch hook sees every batch).
        self.every_batch = frozenset(
            name
            for name in TRAIN_BATCH_HOOKS
            if name not in self._noops
            or any(getattr(getattr(cb, name), "follows_cadence", None) is not True for cb in self._overriding[name])
        )

    def callbacks(self, name: str, *args: Any, monitoring: bool | None = None, **kwargs: Any) -> None:
        """``name`` on every callback that overrides it; ``monitoring`` selects one side of Lightning's split."""
        overriding = self._overriding[name]
        if not overriding:
            return
        state = self._module_state
        previous, state["_current_fx_name"] = state["_current_fx_name"], name
        try:
            for callback in overriding:
                if monitoring is None or monitors_metrics(callback) == monitoring:
                    getattr(callback, name)(self._trainer, self._module, *args, **kwargs)
        finally:
            state["_current_fx_name"] = previous

    def module(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name in self._not_called:
            return args[0] if name in self._pass_through else None
        state = self._module_state
        previous, state["_current_fx_name"] = state["_current_fx_name"], name
        try:
            return getattr(self._module, name)(*args, **kwargs)
        finally:
            state["_current_fx_name"] = previous

    def step_caller(self, name: str) -> Callable[..., Any]:
        """``module(name, ...)`` for a step method called every batch (``training_step``, ``validation_step``): the
        module and its state looked up once. Step methods have no default to skip."""
        return functools.partial(_call_step, self._module, self._module_state, name)

    def both(self, name: str, *args: Any) -> Any:
        if self._overriding[name]:
            self.callbacks(name, *args)
        if name in self._noops:
            return None
        return self.module(name, *args)

    def on_exception(self, exception: BaseException) -> None:
        """Every callback's ``on_exception`` (not only overriding ones: it is cheap and rare), but one set to None."""
        for callback in self._callbacks:
            hook = callback.on_exception
            if callable(hook):
                hook(self._trainer, self._module, exception)
