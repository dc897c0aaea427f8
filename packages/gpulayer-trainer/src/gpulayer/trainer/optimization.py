"""Automatic optimization of one batch, in Lightning's order (§1.7, §1.8, §4.2).

``training_step``, zero-grad at the start of an accumulation window, backward of ``loss / k``; on a stepping
batch all of that runs inside the closure handed to ``optimizer_step``, followed by
``on_before_optimizer_step`` (unclipped gradients) and ``configure_gradient_clipping``.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any

import torch

from gpulayer.trainer.batch import map_tensors
from gpulayer.trainer.evaluation_loop import takes_batch_idx
from gpulayer.trainer.hooks import is_overridden
from gpulayer.trainer.module import Module
from gpulayer.trainer.precision import ScaledOptimizer


class AutomaticOptimization:
    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.last_loss: torch.Tensor | None = None
        self._warned_none = False
        self._takes_batch_idx = takes_batch_idx(trainer.lightning_module.training_step)
        # Under DDP the step runs inside DDP's forward (so its backward reduces gradients), and micro-batches
        # that do not step keep their gradients local.
        step = functools.partial(trainer._hooks.module, "training_step")
        parallel = trainer._data_parallel
        self._training_step = step if parallel is None else functools.partial(parallel.run, step)
        self._no_sync = contextlib.nullcontext if parallel is None else parallel.no_sync
        # The default configure_gradient_clipping does nothing without a clip value: skip the call then.
        self._clips = bool(trainer.args.gradient_clip_val) or is_overridden(
            "configure_gradient_clipping", trainer.lightning_module, Module
        )

    def run(self, batch: Any, batch_idx: int, accumulate: bool) -> dict[str, Any]:
        """One batch; returns the ``outputs`` that ``on_train_batch_end`` receives."""
        trainer = self.trainer
        hooks, args = trainer._hooks, trainer.args
        optimizer = trainer.optimizers[0]
        scaler = trainer._precision.scaler
        result: list[Any] = [None, {}]

        def closure() -> torch.Tensor | None:
            step_args = (batch, batch_idx) if self._takes_batch_idx else (batch,)
            with trainer._precision.step_context():
                output = self._training_step(*step_args)
            loss, extra = self._split(output)
            self.last_loss = loss.detach() if loss is not None else None  # not the graph: it is freed at backward
            if loss is not None and args.accumulate_grad_batches > 1:
                loss = loss / args.accumulate_grad_batches  # x / 1 == x: no division op when not accumulating
            if batch_idx % args.accumulate_grad_batches == 0:
                hooks.callbacks("on_before_zero_grad", optimizer)
                hooks.module("on_before_zero_grad", optimizer)
                hooks.module("optimizer_zero_grad", trainer.current_epoch, batch_idx, optimizer)
            if loss is not None:
                backward_loss = scaler.scale(loss) if scaler is not None else loss
                hooks.both("on_before_backward", backward_loss)
                hooks.module("backward", backward_loss)
                hooks.both("on_after_backward")
            result[:] = [loss, extra]
            return loss

        def step_closure() -> torch.Tensor | None:
            loss = closure()
            if scaler is not None and loss is not None:
                scaler.unscale_(optimizer)
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
            stepper = ScaledOptimizer(optimizer, scaler) if scaler is not None else optimizer
            hooks.module("optimizer_step", trainer.current_epoch, batch_idx, stepper, step_closure)
            trainer._global_step += 1
        loss, extra = result
        return {} if loss is None else {"loss": loss.detach(), **extra}

    def _split(self, output: Any) -> tuple[torch.Tensor | None, dict[str, Any]]:
        if isinstance(output, torch.Tensor):
            return output, {}
        if isinstance(output, dict):
            if output.get("loss") is None:
                raise ValueError('training_step returned a dict without "loss"; automatic optimization needs it')
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
        raise TypeError(
            f"training_step returned {type(output).__name__}; automatic optimization accepts a tensor (the loss), "
            'a dict with "loss", or None (skip the batch)'
        )
