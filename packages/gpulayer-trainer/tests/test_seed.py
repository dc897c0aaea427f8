"""seed_everything: Lightning's seeding, environment variables and worker seeding."""

import os
import random
import warnings

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gpulayer.trainer import Module, Trainer, seed_everything


def _draws():
    return random.random(), numpy.random.rand(), torch.rand(1).item()


def test_the_same_seed_gives_the_same_python_numpy_and_torch_streams():
    assert seed_everything(7) == 7
    first = _draws()
    seed_everything(7)
    assert _draws() == first
    assert (os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"]) == ("7", "0")


def test_the_seed_comes_from_the_environment_else_zero_with_a_warning(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "11")
    assert seed_everything() == 11
    monkeypatch.delenv("PL_GLOBAL_SEED")
    with pytest.warns(UserWarning, match="PL_GLOBAL_SEED"):
        assert seed_everything() == 0


@pytest.mark.parametrize(("given", "seed"), [("7", 7), (3.9, 3)])
def test_a_non_int_seed_is_converted(given, seed):
    assert seed_everything(given) == seed


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_out_of_range_is_refused(seed):
    with pytest.raises(ValueError, match=f"seed={seed}"):
        seed_everything(seed)


class _WorkerSeeds(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return torch.tensor([float(torch.randint(0, 2**30, (1,)).item())])


class _Echo(Module):
    def predict_step(self, batch, batch_idx):
        return batch


def test_workers_true_seeds_each_worker_distinctly_and_reproducibly(tmp_path):
    runs = []
    for _ in range(2):
        seed_everything(5, workers=True)
        loader = DataLoader(_WorkerSeeds(), batch_size=1, num_workers=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DataLoader may warn about worker counts on small machines
            runs.append(
                [t.item() for t in Trainer(accelerator="cpu", default_root_dir=tmp_path).predict(_Echo(), loader)]
            )
        assert loader.worker_init_fn is not None
    assert runs[0] == runs[1] and len(set(runs[0])) == 4
