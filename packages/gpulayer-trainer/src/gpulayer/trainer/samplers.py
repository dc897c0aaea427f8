"""Distributed samplers, as Lightning's ``use_distributed_sampler=True`` puts them into DataLoaders.

Lightning 2.6's is ``_get_distributed_sampler`` in ``lightning/pytorch/trainer/connectors/data_connector.py``.

Each rank reads its own shard: training loaders shuffle (Lightning's rule, whatever the loader said), val and
test keep their loader's order and are padded to equal shards, predict is split without padding. The seed is
``PL_GLOBAL_SEED`` (``seed_everything`` sets it) or 0, and ``set_epoch`` reshuffles every epoch.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

if TYPE_CHECKING:
    from gpulayer.trainer.trainer import Trainer


def with_distributed_sampler(loader: Any, stage: str, world_size: int, rank: int, overfitting: bool = False) -> Any:
    """``loader`` remade with this rank's sampler, under a distributed strategy (DDP on one process too, as in
    Lightning); unchanged when it needs none (an iterable dataset, a DistributedSampler already, or not a
    DataLoader). Under ``overfit_batches`` nothing shuffles."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if isinstance(loader.sampler, DistributedSampler):
        return loader
    seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
    shuffle = (stage == "train" or isinstance(loader.sampler, RandomSampler)) and not overfitting
    if stage == "predict":
        sampler: Sampler = ShardedSampler(loader.sampler, world_size, rank, shuffle=False, seed=seed, pad=False)
    elif isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
        sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)
    else:
        sampler = ShardedSampler(loader.sampler, world_size, rank, shuffle=shuffle, seed=seed, pad=True)
    return _rebuilt(loader, sampler, stage)


def sampled(loader: Any, stage: str, trainer: Trainer, fitting: bool) -> Any:
    """The loader a stage reads: in order under ``overfit_batches`` while fitting, and this rank's share under a
    distributed strategy with ``use_distributed_sampler`` (nothing shuffles under ``overfit_batches``)."""
    args = trainer.args
    overfitting = args.overfit_batches > 0
    if overfitting and fitting:
        loader = without_shuffling(loader, stage)
    if args.use_distributed_sampler and trainer.strategy.is_distributed:
        loader = with_distributed_sampler(loader, stage, trainer.world_size, trainer.global_rank, overfitting)
    return loader


def without_shuffling(loader: Any, stage: str) -> Any:
    """``overfit_batches``: a DataLoader that does not read its dataset in order is remade with a
    ``SequentialSampler``, so every epoch sees the same batches (Lightning's ``_resolve_overfit_batches``)."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if isinstance(loader.sampler, SequentialSampler):
        return loader
    warnings.warn(
        f"overfit_batches: the {stage} loader shuffles; it is remade with a SequentialSampler so that every epoch "
        "trains on the same batches",
        UserWarning,
        stacklevel=5,
    )
    advice = "give overfit_batches a loader that reads its dataset in order"
    return _rebuilt(loader, SequentialSampler(loader.dataset), stage, "a SequentialSampler", advice)


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """``set_epoch(epoch)`` on the loader's sampler and its batch sampler's sampler (each once), as Lightning."""
    found = {
        id(sampler): sampler
        for sampler in (
            getattr(loader, "sampler", None),
            getattr(getattr(loader, "batch_sampler", None), "sampler", None),
        )
        if sampler is not None
    }
    for sampler in found.values():
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


class ShardedSampler(Sampler[int]):
    """This rank's share of another sampler's indices (Lightning's ``DistributedSamplerWrapper``; with
    ``pad=False`` its unrepeated variant for predict): optionally shuffled by ``seed + epoch``, every
    ``world_size``-th index from ``rank``, padded to equal shards by repeating the first indices."""

    def __init__(self, sampler: Any, world_size: int, rank: int, *, shuffle: bool, seed: int, pad: bool) -> None:
        self.sampler, self.world_size, self.rank = sampler, world_size, rank
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        indices = list(self.sampler)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
        if self.pad:
            total = math.ceil(len(indices) / self.world_size) * self.world_size
            indices += (indices * math.ceil(total / max(len(indices), 1)))[: total - len(indices)]
        return iter(indices[self.rank :: self.world_size])

    def __len__(self) -> int:
        length = len(self.sampler)
        if self.pad:
            return math.ceil(length / self.world_size)
        return len(range(self.rank, length, self.world_size))


_DISTRIBUTED_ADVICE = (
    "pass use_distributed_sampler=False to the Trainer and give each rank its own shard (for example "
    "sampler=DistributedSampler(dataset))"
)


def _rebuilt(
    loader: DataLoader,
    sampler: Sampler,
    stage: str,
    what_sampler: str = "a distributed sampler",
    advice: str = _DISTRIBUTED_ADVICE,
) -> DataLoader:
    """A plain DataLoader with ``loader``'s settings and ``sampler``; subclasses and custom batch samplers cannot be
    remade faithfully, so they get a clear error instead."""
    custom_batches = loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler
    if type(loader) is not DataLoader or custom_batches:
        what = (
            f"{type(loader).__name__}" if type(loader) is not DataLoader else "a DataLoader with a custom batch_sampler"
        )
        raise ValueError(f"the {stage} loader ({what}) cannot be remade with {what_sampler}; {advice}")
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
        in_order=getattr(loader, "in_order", True),
    )
