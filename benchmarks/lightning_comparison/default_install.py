"""The ``default_install`` workloads' extra work, for each trainer and, by hand, for the raw loops.

A default install of either trainer checkpoints after each epoch (``ModelCheckpoint()``, given no checkpoint
callback: the model, optimizer and scheduler states), writes the logged values with a CSV logger and, here, steps a
``StepLR`` per epoch and logs its learning rate at each epoch's start (``LearningRateMonitor(logging_interval=
"epoch")``). ``default_install_batch_hook`` adds a user callback that defines ``on_train_batch_end``, counting
batches. ``RawDefaultInstall`` is the same work in a hand-written loop: the loss kept every ``log_every_n_steps``
steps (no host read per step) and written as CSV rows at the epoch's end, then ``torch.save`` of the three states,
then the scheduler's step.
"""

from __future__ import annotations

import csv
import os
from typing import Any

import torch

STEP_SIZE, GAMMA = 1, 0.5  # StepLR: the learning rate halves after each epoch


def configure_optimizers(parameters: Any, lr: float) -> dict:
    """What ``configure_optimizers`` returns: SGD and its ``StepLR``, stepped at each epoch's end."""
    optimizer = torch.optim.SGD(parameters, lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, STEP_SIZE, GAMMA)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def callbacks(framework: str, batch_hook: bool) -> list:
    """``LearningRateMonitor(logging_interval="epoch")`` of ``framework`` (``gpulayer`` or ``lightning``), and
    with ``batch_hook`` a batch counter; the default checkpoint is the trainer's own."""
    if framework == "gpulayer":
        from gpulayer.callbacks import LearningRateMonitor
        from gpulayer.trainer import Callback
    else:
        from lightning.pytorch import Callback
        from lightning.pytorch.callbacks import LearningRateMonitor

    class BatchCounter(Callback):
        batches = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.batches += 1

    return [LearningRateMonitor(logging_interval="epoch"), *([BatchCounter()] if batch_hook else [])]


def counted_batches(callbacks: list) -> int | None:
    """The batches the batch counter among ``callbacks`` saw; None without one."""
    return next((callback.batches for callback in callbacks if hasattr(callback, "batches")), None)


class RawDefaultInstall:
    """A raw loop's default install, in ``root``: the loop calls ``epoch_start``, keeps ``(epoch, step, loss)`` in
    ``rows`` on each log step, calls ``on_batch_end`` (when not None) after each batch, and ``epoch_end``."""

    def __init__(self, root: str, net: torch.nn.Module, optimizer: torch.optim.Optimizer, batch_hook: bool) -> None:
        self.net, self.optimizer = net, optimizer
        self.scheduler = torch.optim.lr_scheduler.StepLR(optimizer, STEP_SIZE, GAMMA)
        self.rows: list[tuple[int, int, Any]] = []
        self.batches = 0
        self.on_batch_end = self._count if batch_hook else None
        self._checkpoint = os.path.join(root, "last.ckpt")
        self._metrics = os.path.join(root, "metrics.csv")
        self._lr_rows: list[tuple[int, int, float]] = []

    def _count(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1

    def epoch_start(self, epoch: int, step: int) -> None:
        self._lr_rows.append((epoch, step, self.optimizer.param_groups[0]["lr"]))

    def epoch_end(self, epoch: int, step: int) -> None:
        """Lightning's order at an epoch's end: the checkpoint, then the scheduler's step, then the logger's flush."""
        states = {"state_dict": self.net.state_dict(), "optimizer_states": [self.optimizer.state_dict()]}
        states |= {"lr_schedulers": [self.scheduler.state_dict()], "epoch": epoch, "global_step": step}
        torch.save(states, self._checkpoint)
        self.scheduler.step()
        new = not os.path.exists(self._metrics)
        with open(self._metrics, "a", newline="") as out:
            writer = csv.writer(out)
            if new:
                writer.writerow(["epoch", "step", "lr-SGD", "loss"])
            writer.writerows((e, s, lr, "") for e, s, lr in self._lr_rows)
            writer.writerows((e, s, "", float(loss)) for e, s, loss in self.rows)
        self.rows.clear()
        self._lr_rows.clear()
