"""Where a fit is in its epoch's global order of training samples, as a checkpoint records it, and the resumed
epoch's iterator: a fit resumed mid-epoch on another world size trains each of the epoch's samples once.

Rank ``r`` of ``W`` reads every ``W``-th index of the order from ``r`` (``GlobalOrderSampler``), so after ``k``
batches of ``B`` on every rank exactly the first ``k * B * W`` indices are read. A checkpoint records that count
(``consumed``); a resume on ``W'`` ranks splits the rest of the order over them the same way. Lightning 2.6 restarts
the epoch's shards on the new ranks instead.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from gpulayer.trainer.data.data import data_rng_state, num_batches, replayed_iterator, set_sampler_epoch
from gpulayer.trainer.data.samplers import GlobalOrderSampler, ShardedSampler


@dataclass
class OrderPosition:
    """Where the fit is in its epoch's global order: ``batch_samples`` indices per batch over all ranks (None when
    the train loader is not read by a ``GlobalOrderSampler`` with a known batch size), and the batch index and
    samples consumed at which this epoch's iterator began (0 and 0, unless it was resumed on another world size)."""

    world_size: int = 1
    batch_samples: int | None = None
    start_batch: int = 0
    start_sample: int = 0

    def state_dict(self, batches_done: int) -> dict[str, Any]:
        """The checkpoint's ``global_order``, after ``batches_done`` batches of the epoch."""
        consumed = None
        if self.batch_samples is not None:
            consumed = self.start_sample + (batches_done - self.start_batch) * self.batch_samples
        return {
            "world_size": self.world_size,
            "consumed": consumed,
            "start_batch": self.start_batch,
            "start_sample": self.start_sample,
        }


def order_position(loader: Any, world_size: int) -> OrderPosition:
    """The position at an epoch's start for ``loader`` on ``world_size`` ranks."""
    batch_size = getattr(loader, "batch_size", None)
    known = isinstance(getattr(loader, "sampler", None), GlobalOrderSampler) and batch_size is not None
    return OrderPosition(world_size, batch_size * world_size if known else None)


def resumed_iterator(
    loader: Any, progress: Any, resume: dict[str, Any], count: int | float, limit: int | float, is_global_zero: bool
) -> tuple[Iterator[Any], int | float]:
    """The iterator of the epoch a checkpoint saved mid-epoch, and the epoch's batch count (``count`` unless its
    iterator began inside the global order). On the world size it was saved on, its iterator is remade and read
    past the batches done (bit for bit as the unbroken run); on another, the rest of the global order is split over
    the ranks, or, where that is not possible, the batches done are skipped on the new shards (with a warning)."""
    saved = resume.get("global_order") or {}  # absent before 2026-12-06
    position, epoch = progress.order, progress.epochs_processed
    batches_done = resume["batch_idx"] + 1
    sampler = loader.sampler if position.batch_samples is not None else None
    if saved.get("world_size", position.world_size) == position.world_size:
        position.start_batch, position.start_sample = saved.get("start_batch", 0), saved.get("start_sample", 0)
        if sampler is not None and position.start_sample:
            sampler.resume_at(epoch, position.start_sample)
            count = num_batches(range(position.start_batch + len(loader)), limit, "train")
        return replayed_iterator(loader, progress, batches_done - position.start_batch, count), count
    inexact = _inexact(loader, sampler, saved.get("consumed"), position.world_size)
    if is_global_zero and inexact:
        warnings.warn(
            f"resuming epoch {epoch} at batch {batches_done} on {position.world_size} ranks, saved on "
            f"{saved['world_size']}: {'; '.join(inexact)}",
            UserWarning,
            stacklevel=4,
        )
    if sampler is None or saved.get("consumed") is None:
        return replayed_iterator(loader, progress, batches_done, count), count
    position.start_batch, position.start_sample = batches_done, saved["consumed"]
    set_sampler_epoch(loader, epoch)
    sampler.resume_at(epoch, position.start_sample)
    progress.data_snapshots = {"iter": data_rng_state(loader)}  # what a resume of this iterator remakes it from
    iterator = iter(loader)
    progress.data_snapshots["first"] = data_rng_state(loader)
    return iterator, num_batches(range(batches_done + len(loader)), limit, "train")


def _inexact(loader: Any, sampler: GlobalOrderSampler | None, consumed: int | None, world_size: int) -> list[str]:
    """Why the rest of the epoch cannot be each remaining sample once, by name; empty when it can."""
    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return ["an IterableDataset has no global order: its stream restarts, and samples repeat or are skipped"]
    if sampler is None:
        if not isinstance(loader, DataLoader):
            own = f"a {type(loader).__name__}, not a DataLoader"
        elif loader.batch_size is None:
            own = f"its own batch_sampler, {type(loader.batch_sampler).__name__}"
        else:
            inner = loader.sampler.sampler if isinstance(loader.sampler, ShardedSampler) else loader.sampler
            own = f"its own sampler, {type(inner).__name__}"
        return [
            f"the train data ({own}) has no global order: the epoch's first batches are skipped on the new shards, "
            "so samples repeat or are skipped (use_distributed_sampler=True with a shuffled or sequential "
            "DataLoader under a distributed strategy keeps the order)"
        ]
    if consumed is None:
        return ["the checkpoint records no position in the epoch's global order: its first batches are skipped on "
                "the new shards, so samples repeat or are skipped"]  # fmt: skip
    rest = max(len(sampler.dataset) - consumed, 0)
    inexact = []
    if padding := -rest % world_size:
        inexact.append(
            f"padding: the {rest} samples left do not split evenly over {world_size} ranks, so {padding} of the "
            "epoch's first samples are trained on again"
        )
    left_over = math.ceil(rest / world_size) % loader.batch_size
    if loader.drop_last and left_over:
        inexact.append(
            f"drop_last: each rank's last {left_over} samples do not fill a batch of {loader.batch_size} and are "
            "not trained on"
        )
    return inexact
