"""Distributed samplers, as Lightning's ``use_distributed_sampler=True`` puts them into DataLoaders.

Lightning 2.6's is ``_get_distributed_sampler`` in ``lightning/pytorch/trainer/connectors/data_connector.py``.

Each rank reads its own shard: training loaders shuffle (Lightning's rule, whatever the loader said), val and
test keep their loader's order and are padded to equal shards, predict is split without padding. The seed is
``PL_GLOBAL_SEED`` (``seed_everything`` sets it) or 0, and ``set_epoch`` reshuffles every epoch. A
``GlobalOrderSampler`` in place of torch's ``DistributedSampler`` lets a resumed epoch go on from its position
(``order_position.py``).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler, SequentialSampler

from gpulayer.trainer.data.loader_rebuild import is_shuffled, rebuilt
from gpulayer.trainer.data.seed import seed_workers_of

if TYPE_CHECKING:
    from gpulayer.trainer.trainer import Trainer


def with_distributed_sampler(
    loader: Any, stage: str, world_size: int, rank: int, overfitting: bool = False, record_indices: bool = False
) -> Any:
    """``loader`` remade with this rank's sampler, under a distributed strategy (DDP on one process too, as in
    Lightning); unchanged when it needs none (an iterable dataset, a DistributedSampler already, or not a
    DataLoader). Under ``overfit_batches`` nothing shuffles; ``record_indices``: see ``rebuilt``."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if isinstance(loader.sampler, DistributedSampler):
        return loader
    seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
    shuffle = (stage == "train" or is_shuffled(loader)) and not overfitting
    if stage == "predict":
        sampler: Sampler = ShardedSampler(loader.sampler, world_size, rank, shuffle=False, seed=seed, pad=False)
    elif isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
        sampler = GlobalOrderSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)
    else:
        sampler = ShardedSampler(loader.sampler, world_size, rank, shuffle=shuffle, seed=seed, pad=True)
    return rebuilt(loader, sampler, stage, is_global_zero=rank == 0, record_indices=record_indices)


def sampled(loader: Any, stage: str, trainer: Trainer, fitting: bool, record_indices: bool = False) -> Any:
    """The loader a stage reads: in order under ``overfit_batches`` while fitting, and this rank's share under a
    distributed strategy with ``use_distributed_sampler`` (nothing shuffles under ``overfit_batches``). Every
    predict DataLoader is remade, with its own sampler if it needs no other, so that it keeps its last batch
    (Lightning's ``_prepare_dataloader``), and records its batches' indices with ``record_indices``."""
    args = trainer.args
    overfitting = args.overfit_batches > 0
    if overfitting and fitting:
        loader = without_shuffling(loader, stage)
    given = loader
    if args.use_distributed_sampler and trainer.strategy.is_distributed:
        rank = trainer.global_rank
        loader = with_distributed_sampler(loader, stage, trainer.world_size, rank, overfitting, record_indices)
    if stage == "predict" and loader is given and isinstance(loader, DataLoader):
        loader = rebuilt(loader, loader.sampler, stage, trainer.is_global_zero, record_indices)
    seed_workers_of(loader, trainer.global_rank)  # a remade loader has the worker_init_fn it was made with
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
    return rebuilt(loader, SequentialSampler(loader.dataset), stage)


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


class GlobalOrderSampler(DistributedSampler):
    """torch's ``DistributedSampler``, which can begin one epoch some samples into its global order (``resume_at``);
    until then it yields ``DistributedSampler``'s indices exactly. The global order is ``DistributedSampler``'s
    before its padding, ``randperm(len(dataset))`` seeded with ``seed + epoch`` (``range`` unshuffled): no world
    size changes it."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int, shuffle: bool, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.resumed = (-1, 0)  # (epoch, samples of its global order already trained on)

    def resume_at(self, epoch: int, consumed: int) -> None:
        """Epoch ``epoch`` begins after its first ``consumed`` samples; every other epoch from its start."""
        self.resumed = (epoch, consumed)

    @property
    def start(self) -> int:
        epoch, consumed = self.resumed
        return consumed if epoch == self.epoch else 0

    def __iter__(self) -> Iterator[int]:
        size = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(size, generator=generator).tolist()
        else:
            order = list(range(size))
        rest = order[self.start :]
        # DistributedSampler's padding to equal shards: the epoch's first indices again.
        padding = -len(rest) % self.num_replicas
        rest += (order * math.ceil(padding / max(size, 1)))[:padding]
        return iter(rest[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        return math.ceil(max(len(self.dataset) - self.start, 0) / self.num_replicas)
