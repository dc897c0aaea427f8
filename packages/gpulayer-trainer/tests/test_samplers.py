"""Distributed samplers as Lightning 2.6's ``_get_distributed_sampler`` injects them, checked against its wrappers."""

import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from gpulayer.trainer.data.samplers import ShardedSampler, set_sampler_epoch, with_distributed_sampler

DATA = TensorDataset(torch.arange(10.0))


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


@pytest.mark.parametrize("length", [9, 10, 11])
@pytest.mark.parametrize("epoch", [0, 3])
def test_sharded_sampler_gives_the_indices_of_lightnings_wrappers(length, epoch):
    indices = list(range(100, 100 + length))
    for rank in range(3):
        theirs = DistributedSamplerWrapper(indices, num_replicas=3, rank=rank, shuffle=True, seed=7)
        ours = ShardedSampler(indices, 3, rank, shuffle=True, seed=7, pad=True)
        theirs.set_epoch(epoch)
        ours.set_epoch(epoch)
        assert (list(ours), len(ours)) == (list(theirs), len(theirs))
        unrepeated = UnrepeatedDistributedSamplerWrapper(indices, num_replicas=3, rank=rank, shuffle=False, seed=7)
        split = ShardedSampler(indices, 3, rank, shuffle=False, seed=7, pad=False)
        assert (list(split), len(split)) == (list(unrepeated), len(unrepeated))


def test_train_loaders_get_a_shuffling_distributed_sampler_and_keep_their_settings(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "42")
    collate = torch.utils.data.default_collate
    loader = DataLoader(DATA, batch_size=3, drop_last=True, collate_fn=collate)  # not shuffled: Lightning shuffles
    made = with_distributed_sampler(loader, "train", world_size=2, rank=1)
    assert isinstance(made.sampler, DistributedSampler)
    assert (made.sampler.num_replicas, made.sampler.rank, made.sampler.shuffle, made.sampler.seed) == (2, 1, True, 42)
    assert (made.batch_size, made.drop_last, made.collate_fn) == (3, True, collate)
    assert made.dataset is DATA


def test_evaluation_loaders_keep_their_order_and_predict_is_split_without_padding():
    val = with_distributed_sampler(DataLoader(DATA, batch_size=4), "val", world_size=3, rank=2)
    assert (val.sampler.shuffle, list(val.sampler)) == (False, [2, 5, 8, 1])  # padded with the first indices
    shuffled = with_distributed_sampler(DataLoader(DATA, shuffle=True), "test", world_size=2, rank=0)
    assert shuffled.sampler.shuffle is True
    predict = with_distributed_sampler(DataLoader(DATA, batch_size=4, drop_last=True), "predict", world_size=3, rank=2)
    assert list(predict.batch_sampler.sampler) == [2, 5, 8]  # in a batch sampler that keeps the last batch
    assert list(predict.batch_sampler) == [[2, 5, 8]]


def test_a_custom_sampler_is_sharded_around():
    weighted = WeightedRandomSampler([1.0] * 10, num_samples=10, generator=torch.Generator().manual_seed(0))
    made = with_distributed_sampler(DataLoader(DATA, sampler=weighted), "train", world_size=2, rank=0)
    assert isinstance(made.sampler, ShardedSampler) and made.sampler.sampler is weighted
    assert len(made.sampler) == 5


@pytest.mark.parametrize(
    "loader",
    [
        DataLoader(_Stream()),
        DataLoader(DATA, sampler=DistributedSampler(DATA, num_replicas=2, rank=0)),
        [torch.zeros(2)],  # not a DataLoader
    ],
)
def test_loaders_that_need_no_sampler_are_left_alone(loader):
    assert with_distributed_sampler(loader, "train", world_size=2, rank=0) is loader


def test_set_epoch_reaches_the_sampler_and_the_batch_samplers_sampler_once_each():
    class Counting(SequentialSampler):
        epochs: list[int]

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    shared = Counting(DATA)
    shared.epochs = []
    set_sampler_epoch(DataLoader(DATA, sampler=shared), 4)
    inner = Counting(DATA)
    inner.epochs = []
    set_sampler_epoch(DataLoader(DATA, batch_sampler=BatchSampler(inner, 2, False)), 5)
    assert (shared.epochs, inner.epochs) == ([4], [5])
