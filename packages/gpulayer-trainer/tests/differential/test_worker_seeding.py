"""After ``seed_everything(workers=True)`` (what LightningCLI calls), DataLoader workers draw what Lightning's draw:
random augmentations in ``__getitem__`` give the same batches, so the same losses from the first step."""

import random
import warnings

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import gpulayer.trainer as gl
from gpulayer.trainer.data.seed import worker_init_function

from .conftest import quiet_lightning


def _states() -> tuple:
    return torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1]


@pytest.mark.parametrize(("seed", "worker_id", "rank"), [(0, 1, 0), (7, 1, 0), (7, 3, 2), (2**32 - 1, 5, 1)])
def test_a_worker_is_seeded_as_lightnings_worker_init_function_seeds_it(seed, worker_id, rank):
    from lightning.fabric.utilities.seed import pl_worker_init_function

    states = []
    for init in (pl_worker_init_function, worker_init_function):
        torch.manual_seed(seed + worker_id)  # a worker's initial seed: the loader's base seed plus its id
        init(worker_id, rank=rank)
        states.append(_states())
    (torch_theirs, python_theirs, numpy_theirs), (torch_ours, python_ours, numpy_ours) = states
    assert torch.equal(torch_ours, torch_theirs)
    assert python_ours == python_theirs
    assert (numpy_ours == numpy_theirs).all()


class _Flipped(Dataset):
    """Eight fixed rows, each negated at random by the worker's global torch generator."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        row = torch.arange(4.0) + index
        return -row if torch.rand(()) < 0.5 else row


def _batches(framework, base, root) -> list:
    class Recorded(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            self.seen.append(batch.clone())
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    framework.seed_everything(7, workers=True)
    model = Recorded()
    loader = DataLoader(_Flipped(), batch_size=2, shuffle=True, num_workers=2)
    extra = {"enable_progress_bar": False, "enable_model_summary": False} if base is not gl.Module else {}
    trainer = framework.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, default_root_dir=root, **extra
    )
    trainer.fit(model, loader)
    return model.seen


def test_augmentations_in_seeded_workers_give_lightnings_batches(tmp_path):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _batches(pl, pl.LightningModule, tmp_path / "lightning")
    ours = _batches(gl, gl.Module, tmp_path / "gpulayer")
    assert len(ours) == len(theirs) == 4
    assert all(torch.equal(mine, lightnings) for mine, lightnings in zip(ours, theirs, strict=True))
