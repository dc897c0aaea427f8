"""The one progress display: every ``log_every_n_steps`` optimizer steps, rank 0 prints one line (none with
``enable_progress_bar=False``, Lightning's switch for its progress bar).

It is the only place a training step reads values back from the device, and only on the steps it prints.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.batch import batch_size_of

if TYPE_CHECKING:
    from gpulayer.trainer.trainer import Trainer


class LogLine:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.shown = trainer.is_global_zero and trainer.args.enable_progress_bar
        # Where the current interval began: the time, the fit loop's batches, its batches that stepped.
        self._since = 0.0
        self._start_total = self._start_done = 0

    def start(self) -> None:
        """Training starts: the first interval begins (the batches are the fit loop's counters, not counted here)."""
        loop = self.trainer.fit_loop
        self._since, self._start_total, self._start_done = (
            time.monotonic(),
            loop.progress.total_batches,
            loop.progress.batches_that_stepped,
        )

    def print(self, batch: Any, loss: torch.Tensor | None) -> None:
        """On a log step (the fit loop decides which): rank 0 prints the line, with this step's ``loss``."""
        if self.shown:
            print(self._line(batch, loss), flush=True)

    def _line(self, batch: Any, loss: torch.Tensor | None) -> str:
        trainer = self.trainer
        elapsed = max(time.monotonic() - self._since, 1e-9)
        batches = trainer.fit_loop.progress.total_batches - self._start_total
        samples = batches * _safe_batch_size(batch) * trainer.world_size / elapsed  # over all ranks
        # Progress counts batches that stepped (the units of estimated_stepping_batches): the loop counts this one
        # after the line. Under automatic optimization that is global_step; under manual optimization global_step
        # counts every optimizer's steps, so it is shown apart.
        total, done = trainer.estimated_stepping_batches, trainer.fit_loop.progress.batches_that_stepped + 1
        if trainer.lightning_module.automatic_optimization:
            parts = [f"epoch {trainer.current_epoch}", f"step {trainer.global_step}/{_count(total)}"]
        else:
            parts = [f"epoch {trainer.current_epoch}", f"step {trainer.global_step}", f"batch {done}/{_count(total)}"]
        if loss is not None:
            parts.append(f"loss {loss.item():.4g}")
        parts += [f"{name} {value:.4g}" for name, value in trainer.progress_bar_metrics.items()]
        parts.append(f"{samples:.1f} samples/s")
        if total != math.inf and done > self._start_done:
            left = max(total - done, 0) * elapsed / (done - self._start_done)
            parts.append(f"{timedelta(seconds=round(left))} left")
        self._since, self._start_total, self._start_done = (
            time.monotonic(),
            trainer.fit_loop.progress.total_batches,
            done,
        )
        return " | ".join(parts)


def _count(total: float) -> str:
    return "?" if total == math.inf else str(int(total))


def _safe_batch_size(batch: Any) -> int:
    try:
        size = batch_size_of(batch, warn=False)  # Lightning warns from self.log alone
    except RecursionError:
        return 1
    return 1 if size is None else size
