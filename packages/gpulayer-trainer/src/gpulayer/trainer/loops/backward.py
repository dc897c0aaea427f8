"""``Backward``: the backward of a loss, one path for automatic and manual optimization, in Lightning's order.

DDP's reducer readied (manual optimization only), the loss scaled by fp16 AMP's ``GradScaler``,
``on_before_backward``, the module's ``backward`` (or ``loss.backward()``), ``on_after_backward``. Lightning 2.6's is
``Strategy.backward`` (``lightning/pytorch/strategies/strategy.py``) with its precision plugin's ``pre_backward`` and
``post_backward``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gpulayer.runtime import CollectiveError
from gpulayer.runtime.collectives import is_transport_failure
from gpulayer.trainer.core.hooks import is_called
from gpulayer.trainer.core.module import Module

if TYPE_CHECKING:
    from gpulayer.trainer.core.hooks import Hooks
    from gpulayer.trainer.strategies.strategy import Strategy


class Backward:
    """The backward of each loss of a ``fit`` (``run``), built by its optimization with what it uses. A transport
    failure of the strategy's gradient collective (a lost peer) is raised as a ``CollectiveError`` naming it and the
    batch, under either optimization."""

    def __init__(self, module: Module, hooks: Hooks, strategy: Strategy, manual: bool) -> None:
        self._hooks = hooks
        self.scaler = strategy.precision_plugin.scaler
        # Under manual optimization a step may run several backward passes of one forward (a GAN's): DDP's reducer
        # is readied for each. Under automatic optimization DDP's forward readied it.
        self._prepare = strategy.prepare_manual_backward if manual else None
        self._own_backward = is_called("backward", module, Module)
        # What backward's gradient collective is called when it fails (a peer that never entered it, a lost peer).
        self._gradient_sync = strategy.gradient_sync
        self._global_rank = strategy.global_rank
        self._call_site = "manual_backward() in training_step" if manual else "loss.backward() after training_step"

    def run(self, loss: torch.Tensor, batch_idx: int, *args: Any, **kwargs: Any) -> None:
        """Backward of ``loss`` in batch ``batch_idx``; ``args`` and ``kwargs`` go to the module's ``backward``."""
        hooks, scaler = self._hooks, self.scaler
        if self._prepare is not None:
            self._prepare(loss)
        if scaler is not None:
            loss = scaler.scale(loss)
        active = hooks.active
        if "on_before_backward" in active:
            hooks.both("on_before_backward", loss)
        try:
            if self._own_backward:
                hooks.module("backward", loss, *args, **kwargs)
            else:
                loss.backward(*args, **kwargs)
        except RuntimeError as error:  # no cost until one is raised
            if self._gradient_sync is None or not is_transport_failure(error):
                raise
            where = f"{self._call_site}(batch_idx={batch_idx})"
            raise CollectiveError(self._gradient_sync, where, self._global_rank, error) from error
        if "on_after_backward" in active:
            hooks.both("on_after_backward")
