"""Automatic optimization of one batch, in Lightning's order.

``training_step``, zero-grad at the start of an accumulation window, backward of ``loss / k``; on a stepping
batch all of that runs inside the closure handed to ``optimizer_step``, followed by
``on_before_optimizer_step`` (unclipped gradients) and ``configure_gradient_clipping``. Lightning 2.6's is
``_AutomaticOptimization`` in ``lightning/pytorch/loops/optimization/automatic.py``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.batch import map_tensors
from gpulayer.trainer.core.hooks import is_called
from gpulayer.trainer.core.module import Module
from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError
from gpulayer.trainer.loops.backward import Backward
from gpulayer.trainer.loops.evaluation_loop import takes_batch_idx
from gpulayer.trainer.strategies.precision import ScaledOptimizer

if TYPE_CHECKING:
    from gpulayer.trainer.arguments import TrainerArguments
    from gpulayer.trainer.core.hooks import Hooks
    from gpulayer.trainer.loops.fit_loop import FitLoop
    from gpulayer.trainer.strategies.strategy import Strategy


class AutomaticOptimization:
    """The optimization of one batch (``run``) when ``automatic_optimization`` is on: the fit loop holds one per
    ``fit``, built with everything it uses, and counts on it to advance ``global_step``."""

    manual = False  # training_step does not step the optimizer
    steps_schedulers = True  # the fit loop steps the schedulers (under manual optimization the user does)

    def __init__(
        self,
        loop: FitLoop,
        module: Module,
        hooks: Hooks,
        strategy: Strategy,
        optimizers: list[torch.optim.Optimizer],
        args: TrainerArguments,
    ) -> None:
        self.loop, self.hooks, self.args = loop, hooks, args
        self.optimizer = optimizers[0]
        self._warned_none = False
        self._step_arity = training_step_arity(module)
        # Under DDP the step runs inside DDP's forward (so its backward reduces gradients), and micro-batches
        # that do not step keep their gradients local.
        self._training_step = strategy.training_step_runner(hooks.step_caller("training_step"))
        self._no_sync = strategy.no_sync
        self._backward = Backward(module, hooks, strategy, manual=False).run
        precision = strategy.precision_plugin
        self._scaler = precision.scaler
        # What optimizer_step receives: under fp16 AMP the wrapper whose step lets the scaler step.
        self._stepper = self.optimizer if self._scaler is None else ScaledOptimizer(self.optimizer, self._scaler)
        self._step_context = None if precision.step_context is contextlib.nullcontext else precision.step_context
        # The default configure_gradient_clipping does nothing without a clip value: skip the call then.
        self._clips = bool(args.gradient_clip_val) or is_called("configure_gradient_clipping", module, Module)
        # Only an on_train_batch_end that runs at every batch reads the outputs (those that follow the cadence get
        # None): without one they are not built (a detach per step).
        self._returns_outputs = "on_train_batch_end" in hooks.every_batch
        # The step hooks a module does not override are their defaults, run directly: a hook call less each. An
        # optimizer_zero_grad set to None is skipped, as in Lightning: gradients then add up across steps.
        self._own_zero_grad, self._own_step = (
            is_called(name, module, Module) for name in ("optimizer_zero_grad", "optimizer_step")
        )
        self._own_zero_grad = self._own_zero_grad or module.optimizer_zero_grad is None

    def run(self, batch: Any, batch_idx: int, accumulate: bool) -> tuple[dict[str, Any] | None, torch.Tensor | None]:
        """One batch; returns the ``outputs`` that ``on_train_batch_end`` receives (None when nothing does) and
        ``training_step``'s loss, for the log line (not detached: read only on the steps that print)."""
        loop, hooks, args = self.loop, self.hooks, self.args
        active = hooks.active
        optimizer = self.optimizer
        scaler = self._scaler
        result: list[Any] = [None, {}, None]

        def closure() -> torch.Tensor | None:
            """training_step, zero_grad and backward; on a stepping batch also what precedes the step."""
            step_args = (batch, batch_idx)[: self._step_arity]
            if self._step_context is None:
                output = self._training_step(*step_args)
            else:
                with self._step_context():
                    output = self._training_step(*step_args)
            step_loss, extra = (output, {}) if isinstance(output, torch.Tensor) else self._split(output)
            loss, window = step_loss, loop.cadence.window  # the loss is averaged over the accumulation window
            if loss is not None and window > 1:
                loss = loss / window  # x / 1 == x: no division op when not accumulating
            if window == 1 or loop.cadence.starts_window(batch_idx):  # a window of 1 starts at every batch
                if "on_before_zero_grad" in active:
                    hooks.both("on_before_zero_grad", optimizer)
                if self._own_zero_grad:
                    hooks.module("optimizer_zero_grad", loop.progress.epochs_completed, batch_idx, optimizer)
                else:
                    optimizer.zero_grad()
            if loss is not None:
                self._backward(loss, batch_idx)
            result[:] = [loss, extra, step_loss]
            if accumulate:
                return loss
            if scaler is not None and loss is not None:
                scaler.unscale_(optimizer)
            if "on_before_optimizer_step" in active:
                hooks.both("on_before_optimizer_step", optimizer)
            if self._clips:
                hooks.module(
                    "configure_gradient_clipping",
                    optimizer,
                    gradient_clip_val=args.gradient_clip_val,
                    gradient_clip_algorithm=args.gradient_clip_algorithm,
                )
            return loss

        if accumulate:
            with self._no_sync():
                closure()
        else:
            if self._own_step:
                hooks.module("optimizer_step", loop.progress.epochs_completed, batch_idx, self._stepper, closure)
            else:
                self._stepper.step(closure=closure)
            loop.progress.global_step += 1
        loss, extra, step_loss = result
        if not self._returns_outputs:
            return None, step_loss
        return ({} if loss is None else {"loss": loss.detach(), **extra}), step_loss

    def _split(self, output: Any) -> tuple[torch.Tensor | None, dict[str, Any]]:
        if isinstance(output, torch.Tensor):
            return output, {}
        if isinstance(output, dict):
            if output.get("loss") is None:
                raise MisconfiguredValueError(
                    'training_step returned a dict without "loss"; automatic optimization needs it'
                )
            extra = {k: map_tensors(v, torch.Tensor.detach) for k, v in output.items() if k != "loss"}
            return output["loss"], extra
        if output is None:
            if not self._warned_none:
                self._warned_none = True
                warnings.warn(
                    "training_step returned None: backward is skipped for that batch (the optimizer step still "
                    "counts in global_step, as in Lightning)",
                    UserWarning,
                    stacklevel=2,
                )
            return None, {}
        raise MisconfiguredTypeError(
            f"training_step returned {type(output).__name__}; automatic optimization accepts a tensor (the loss), "
            'a dict with "loss", or None (skip the batch)'
        )


class ForwardOnly:
    """What the fit loop runs batches with while ``fit_loop._skip_backward`` is set (SWA's batch-norm epoch):
    ``training_step`` alone, with no zero-grad, backward or optimizer step, so ``global_step`` stays. Lightning 2.6
    still steps the optimizer at such an epoch's last batch, with the gradients the last backward left; here nothing
    is stepped, as its SWA callback means to."""

    manual = False
    steps_schedulers = True

    def __init__(self, optimization: AutomaticOptimization) -> None:
        self.optimization = optimization

    def run(self, batch: Any, batch_idx: int, accumulate: bool) -> tuple[dict[str, Any] | None, torch.Tensor | None]:
        """``training_step`` on ``batch``, inside ``no_sync`` (no backward follows); returns what ``run`` returns."""
        opt = self.optimization
        step_args = (batch, batch_idx)[: opt._step_arity]
        with opt._no_sync(), contextlib.nullcontext() if opt._step_context is None else opt._step_context():
            output = opt._training_step(*step_args)
        step_loss, extra = (output, {}) if isinstance(output, torch.Tensor) else opt._split(output)
        if not opt._returns_outputs:
            return None, step_loss
        window = opt.loop.cadence.window
        loss = step_loss if step_loss is None or window == 1 else step_loss / window
        return ({} if loss is None else {"loss": loss.detach(), **extra}), step_loss


def training_step_arity(module: Module) -> int:
    """How many of ``(batch, batch_idx)`` ``training_step`` is called with, under either optimization: 2, or 1 for a
    step that does not take ``batch_idx`` (Lightning's rule, ``takes_batch_idx``). A slice, not a call, per step."""
    return 2 if takes_batch_idx(module.training_step) else 1
