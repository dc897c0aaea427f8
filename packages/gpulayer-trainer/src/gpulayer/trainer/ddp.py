"""DistributedDataParallel around the module while it trains.

DDP reduces gradients only for backward passes that follow its own ``forward``, so each training step runs
inside it (Lightning's forward redirection). Evaluation steps call the module directly: they need no gradient
reduction, and so they run no collective per batch.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpulayer.trainer.strategy import DDPStrategy


class StepRunner(nn.Module):
    """What DDP (and a sharding strategy's root) wraps: the module, and a forward that runs the step it is handed."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, step: Any, *args: Any) -> Any:
        return step(*args)


class DataParallel:
    """Broadcasts rank 0's parameters and buffers at construction, then all-reduces gradients in backward."""

    def __init__(self, module: nn.Module, strategy: DDPStrategy, device: torch.device) -> None:
        self.wrapped = DistributedDataParallel(
            StepRunner(module), device_ids=[device.index] if device.type == "cuda" else None, **strategy.ddp_options()
        )

    def run(self, step: Any, *args: Any) -> Any:
        """``step(*args)`` inside DDP's forward, so the backward of its loss reduces gradients across ranks."""
        return self.wrapped(step, *args)

    def no_sync(self) -> AbstractContextManager[None]:
        """A micro-batch that does not step: its backward keeps gradients local (no all-reduce)."""
        return self.wrapped.no_sync()
