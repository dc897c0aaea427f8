"""Manual optimization (``automatic_optimization = False``), Lightning 2.6's semantics.

``training_step`` does the optimization itself: ``self.optimizers()`` hands it ``ManualOptimizer`` wrappers whose
``step()`` runs ``on_before_optimizer_step`` and the precision's scaler around the optimizer's own step and counts
``global_step`` (two optimizers stepping once each advance it by two); ``self.manual_backward(loss)`` runs the
backward hooks with the scaled loss. Schedulers step only when the user steps them. Lightning 2.6's are
``_ManualOptimization`` (``lightning/pytorch/loops/optimization/manual.py``) and ``LightningOptimizer``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.core.module import Module
from gpulayer.trainer.exceptions import MisconfiguredTypeError
from gpulayer.trainer.loops.backward import Backward
from gpulayer.trainer.loops.optimization import training_step_arity
from gpulayer.trainer.strategies.precision import ScaledOptimizer

if TYPE_CHECKING:
    from gpulayer.trainer.core.hooks import Hooks
    from gpulayer.trainer.loops.fit_loop import FitLoop
    from gpulayer.trainer.strategies.precision import Precision
    from gpulayer.trainer.strategies.strategy import Strategy


_SHARED = ("param_groups", "state", "defaults")


class ManualOptimizer:
    """An optimizer as ``self.optimizers()`` returns it under manual optimization. It is an instance of the
    optimizer's own class too (``isinstance(opt, torch.optim.Adam)`` holds, as with Lightning's wrapper), and its
    ``param_groups``, ``state`` and ``defaults`` are the optimizer's, also after a checkpoint's state replaced them;
    ``optimizer`` is the wrapped one."""

    def __init__(self, optimizer: torch.optim.Optimizer, loop: FitLoop, hooks: Hooks, precision: Precision) -> None:
        self.__class__ = type(f"Manual{type(optimizer).__name__}", (ManualOptimizer, type(optimizer)), {})
        skipped = ("step", "__del__", *_SHARED)
        self.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in skipped})
        self._optimizer, self._loop, self._hooks, self._scaler = optimizer, loop, hooks, precision.scaler
        self._scaled = None if self._scaler is None else ScaledOptimizer(optimizer, self._scaler, automatic=False)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (a Trainer pickled mid-fit, as Lightning allows) as a wrapper made again: its class, made for its
        optimizer's class, has no name to be found by."""
        return _manual_optimizer_of, (type(self._optimizer),), dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # not Optimizer.__setstate__, which patches the class's step

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    param_groups = property(lambda self: self._optimizer.param_groups)
    state = property(lambda self: self._optimizer.state)
    defaults = property(lambda self: self._optimizer.defaults)

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """The optimizer's step, after ``closure`` (if given), the scaler's unscale and ``on_before_optimizer_step``;
        then ``global_step`` advances by one."""
        if closure is not None and not callable(closure):
            raise MisconfiguredTypeError(f"optimizer.step(closure={closure!r}): the closure must be callable")
        if self._scaled is not None:
            output = self._scaled.step(functools.partial(self._before_step, closure, unscale=True), **kwargs)
        elif closure is None:  # the common call: no closure to wrap
            self._before_step(None)
            output = self._optimizer.step(**kwargs)
        else:
            output = self._optimizer.step(closure=functools.partial(self._before_step, closure), **kwargs)
        self._loop.progress.global_step += 1
        return output

    def _before_step(self, closure: Callable[[], Any] | None, unscale: bool = False) -> Any:
        result = closure() if closure is not None else None
        if unscale:
            self._scaler.unscale_(self._optimizer)
        if "on_before_optimizer_step" in self._hooks.active:
            self._hooks.both("on_before_optimizer_step", self._optimizer)
        return result


def _manual_optimizer_of(optimizer_class: type) -> ManualOptimizer:
    """An empty wrapper of ``optimizer_class``, for pickle to fill with its state."""
    wrapper = object.__new__(ManualOptimizer)
    wrapper.__class__ = type(f"Manual{optimizer_class.__name__}", (ManualOptimizer, optimizer_class), {})
    return wrapper


class ManualOptimization:
    """The optimization of one batch when ``automatic_optimization`` is off: ``training_step``, whose returned loss
    (if any) reaches ``on_train_batch_end`` detached, as ``{"loss": ...}`` or the returned dict."""

    manual = True  # training_step steps the optimizers: the module's optimizers() and manual_backward use this
    steps_schedulers = False  # the user steps them (Lightning's rule)

    def __init__(
        self,
        loop: FitLoop,
        module: Module,
        hooks: Hooks,
        strategy: Strategy,
        optimizers: list[torch.optim.Optimizer],
    ) -> None:
        precision = strategy.precision_plugin
        self.manual_optimizers = [ManualOptimizer(optimizer, loop, hooks, precision) for optimizer in optimizers]
        self._backward = Backward(module, hooks, strategy, manual=True).run
        self._step_arity = training_step_arity(module)
        self._training_step = strategy.manual_training_step_runner(hooks.step_caller("training_step"))
        self._step_context = precision.step_context
        self._batch_idx = 0  # the running batch's, for the call site a failed gradient collective names

    def run(self, batch: Any, batch_idx: int, accumulate: bool) -> tuple[dict[str, Any], torch.Tensor | None]:
        """One batch (``accumulate`` is never true: accumulation is refused under manual optimization)."""
        self._batch_idx = batch_idx
        with self._step_context():
            output = self._training_step(*(batch, batch_idx)[: self._step_arity])
        if isinstance(output, torch.Tensor):
            return {"loss": output.detach()}, output
        if isinstance(output, Mapping):
            outputs = dict(output)
            if isinstance(outputs.get("loss"), torch.Tensor):
                outputs["loss"] = outputs["loss"].detach()
            return outputs, outputs.get("loss")
        if output is None:
            return {}, None
        raise MisconfiguredTypeError(
            f"training_step returned {type(output).__name__}; under manual optimization it returns a tensor, a dict "
            "or nothing"
        )

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``manual_backward``: the one backward path (``Backward``), for the running batch."""
        self._backward(loss, self._batch_idx, *args, **kwargs)
