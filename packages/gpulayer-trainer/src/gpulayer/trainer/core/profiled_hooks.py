"""``ProfiledHooks``: the hook caller of a Trainer given a profiler, each call timed under Lightning 2.6's action
name (``lightning/pytorch/trainer/call.py``): ``[Callback]{state_key}.{hook}``, ``[LightningModule]{class}.{hook}``,
and ``[Strategy]{class}.{step}`` for the steps. A Trainer without a profiler builds ``Hooks`` itself, whose calls
are untouched.

It calls the hooks ``Hooks`` calls, so the run is the same: a hook GPUlayer skips (a default no-op) is not timed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpulayer.trainer.core.hooks import Hooks, monitors_metrics
from gpulayer.trainer.profilers.attach import Timed

if TYPE_CHECKING:
    from gpulayer.trainer.core.callback import Callback
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.profilers.profiler import Profiler
    from gpulayer.trainer.trainer import Trainer


class ProfiledHooks(Hooks):
    """``Hooks`` with each call of a callback's hook, the module's hook or a step timed by ``profiler``."""

    def __init__(self, trainer: Trainer, profiler: Profiler) -> None:
        super().__init__(trainer)
        self._profiler = profiler

    def attach(self, module: Module, callbacks: list[Callback]) -> None:
        super().attach(module, callbacks)
        self._module_action = f"[LightningModule]{type(module).__name__}."

    def callbacks(self, name: str, *args: Any, monitoring: bool | None = None, **kwargs: Any) -> None:
        overriding = self._overriding[name]
        if not overriding:
            return
        state, profile = self._module_state, self._profiler.profile
        previous, state["_current_fx_name"] = state["_current_fx_name"], name
        try:
            for callback in overriding:
                if monitoring is None or monitors_metrics(callback) == monitoring:
                    with profile(f"[Callback]{callback.state_key}.{name}"):
                        getattr(callback, name)(self._trainer, self._module, *args, **kwargs)
        finally:
            state["_current_fx_name"] = previous

    def module(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name in self._not_called or name == "backward":  # Lightning times backward as the strategy's alone
            return super().module(name, *args, **kwargs)
        with self._profiler.profile(self._module_action + name):
            return super().module(name, *args, **kwargs)

    def step_caller(self, name: str) -> Callable[..., Any]:
        """The step timed as the strategy's (Lightning's ``_call_strategy_hook``)."""
        action = f"[Strategy]{type(self._trainer.strategy).__name__}.{name}"
        return Timed(self._profiler, action, super().step_caller(name))

    def on_exception(self, exception: BaseException) -> None:
        for callback in self._callbacks:
            if callable(callback.on_exception):
                with self._profiler.profile(f"[Callback]{callback.state_key}.on_exception"):
                    callback.on_exception(self._trainer, self._module, exception)
