"""The epoch's global order: ``GlobalOrderSampler`` is torch's ``DistributedSampler`` until it resumes, its order is
the same on any world size, and a resume at a position on another world size reads the rest of it once, with one
warning naming what cannot be exact."""

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset, WeightedRandomSampler

from gpulayer.trainer.data.order_position import OrderPosition, order_position, resumed_iterator
from gpulayer.trainer.data.samplers import GlobalOrderSampler, with_distributed_sampler
from gpulayer.trainer.loops.progress import Progress


def _data(length: int) -> TensorDataset:
    return TensorDataset(torch.arange(length))


@pytest.mark.parametrize("length", [9, 10, 11])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_it_gives_distributed_samplers_indices_until_it_resumes(length, world_size, shuffle):
    for epoch in (0, 3):
        for rank in range(world_size):
            theirs = DistributedSampler(_data(length), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=7)
            ours = GlobalOrderSampler(_data(length), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=7)
            theirs.set_epoch(epoch)
            ours.set_epoch(epoch)
            assert (list(ours), len(ours)) == (list(theirs), len(theirs))


def _shards(length: int, world_size: int, epoch: int, consumed: int = 0, seed: int = 7) -> list[list[int]]:
    shards = []
    for rank in range(world_size):
        sampler = GlobalOrderSampler(_data(length), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        sampler.resume_at(epoch, consumed)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def _interleaved(shards: list[list[int]]) -> list[int]:
    return [index for step in zip(*shards, strict=True) for index in step]


def test_the_global_order_is_the_same_on_any_world_size_and_a_resume_reads_its_rest():
    order = _interleaved(_shards(48, 1, epoch=2))
    assert sorted(order) == list(range(48))
    for world_size in (2, 3, 4):
        assert _interleaved(_shards(48, world_size, epoch=2)) == order
    # 3 batches of 4 on 2 ranks read the order's first 24 indices; 3 ranks, then 1, go on from there.
    first = [index for shard in _shards(48, 2, epoch=2) for index in shard[: 3 * 4]]
    assert sorted(first) == sorted(order[:24])
    for world_size in (3, 1):
        assert _interleaved(_shards(48, world_size, epoch=2, consumed=24)) == order[24:]
    assert len(GlobalOrderSampler(_data(48), num_replicas=3, rank=0, shuffle=True, seed=7)) == 16


def test_a_resume_holds_for_its_epoch_only_and_pads_with_the_epochs_first_indices():
    sampler = GlobalOrderSampler(_data(10), num_replicas=3, rank=2, shuffle=False, seed=0)
    sampler.resume_at(1, 6)
    sampler.set_epoch(1)
    assert (list(sampler), len(sampler)) == ([8, 1], 2)  # of 6, 7, 8, 9 and the padding 0, 1
    sampler.set_epoch(2)
    assert (list(sampler), len(sampler)) == ([2, 5, 8, 1], 4)  # DistributedSampler's


def test_the_position_counts_every_ranks_batches_from_where_the_iterator_began():
    loader = with_distributed_sampler(DataLoader(_data(48), batch_size=4), "train", world_size=2, rank=0)
    assert isinstance(loader.sampler, GlobalOrderSampler)
    position = order_position(loader, world_size=2)
    assert (position.batch_samples, position.state_dict(3)["consumed"]) == (8, 24)
    resumed = OrderPosition(world_size=3, batch_samples=12, start_batch=3, start_sample=24)
    assert resumed.state_dict(5) == {"world_size": 3, "consumed": 48, "start_batch": 3, "start_sample": 24}
    own = DataLoader(_data(48), sampler=WeightedRandomSampler([1.0] * 48, 48))
    assert order_position(own, world_size=2).state_dict(3)["consumed"] is None
    # A checkpoint saved inside batch 2's step runs that batch again: 2 batches are consumed, not 3.
    progress = Progress(batch_idx=2, phase="step", order=position)
    assert progress.state_dict()["global_order"]["consumed"] == 16
    progress.phase = "batch"
    assert progress.state_dict()["global_order"]["consumed"] == 24


def _resume(loader, saved_world_size: int, consumed: int | None, batch_idx: int, world_size: int):
    progress = SimpleNamespace(order=order_position(loader, world_size), epochs_processed=0, data_snapshots={})
    progress.data_snapshots = {"iter": {"torch": torch.get_rng_state()}, "first": {"torch": torch.get_rng_state()}}
    saved = {"world_size": saved_world_size, "consumed": consumed, "start_batch": 0, "start_sample": 0}
    resume = {"batch_idx": batch_idx, "global_order": saved}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iterator, count = resumed_iterator(loader, progress, resume, len(loader), 1.0, is_global_zero=True)
    return [batch[0].tolist() for batch in iterator], count, progress, [str(w.message) for w in caught]


def test_a_resume_on_another_world_size_goes_on_from_the_saved_position_without_a_warning(monkeypatch):
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # the loader's sampler is seeded with 0
    # 2 ranks read 3 batches of 4: 24 of 48 samples; rank 1 of 3 takes every third of the other 24.
    loader = with_distributed_sampler(DataLoader(_data(48), batch_size=4), "train", world_size=3, rank=1)
    batches, count, progress, warned = _resume(loader, 2, 24, batch_idx=2, world_size=3)
    rest = _shards(48, 3, epoch=0, consumed=24, seed=0)[1]
    assert ([index for batch in batches for index in batch], count, warned) == (rest, 3 + 2, [])
    assert (progress.order.start_batch, progress.order.start_sample) == (3, 24)
    assert progress.order.state_dict(4)["consumed"] == 36  # one batch of 4 on 3 ranks further


def test_what_cannot_be_exact_is_named_in_one_warning():
    padded = with_distributed_sampler(DataLoader(_data(50), batch_size=4, drop_last=True), "train", 3, 0)
    *_, warned = _resume(padded, 2, 24, batch_idx=2, world_size=3)
    assert len(warned) == 1
    assert "26 samples left do not split evenly over 3 ranks, so 1 of the epoch's first" in warned[0]
    assert "drop_last: each rank's last 1 samples do not fill a batch of 4" in warned[0]
    own = with_distributed_sampler(
        DataLoader(_data(48), batch_size=4, sampler=WeightedRandomSampler([1.0] * 48, 48)), "train", 3, 0
    )
    batches, _, _, warned = _resume(own, 2, None, batch_idx=2, world_size=3)
    assert len(warned) == 1
    assert "the train data (its own sampler, WeightedRandomSampler) has no global order" in warned[0]
    assert len(batches) == 4 - 3  # today's replay: the first 3 batches of the new shard are skipped
    ours = with_distributed_sampler(DataLoader(_data(48), batch_size=4), "train", 3, 0)
    *_, warned = _resume(ours, 1, None, batch_idx=2, world_size=3)
    assert len(warned) == 1 and "the checkpoint records no position in the epoch's global order" in warned[0]
    *_, warned = _resume(DataLoader(_Stream(), batch_size=4), 2, None, batch_idx=0, world_size=3)
    assert len(warned) == 1 and "an IterableDataset has no global order" in warned[0]


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(8))

    def __len__(self):
        return 8
