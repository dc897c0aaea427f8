"""Data and model faults: a batch of the wrong type, an empty loader (on every rank, or on one rank of two), a
``val_check_interval`` longer than the epoch, and a loss that becomes NaN."""

from __future__ import annotations

import os
import traceback
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks

EMPTY_WARNING = "Total length of `DataLoader` across ranks is zero. Please make sure this was your intention."


class Regression(gl.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return F.mse_loss(self.layer(inputs), targets)

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        self.log("val_loss", F.mse_loss(self.layer(inputs), targets))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Words(Dataset):
    """Samples of text where the model expects tensors."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[str, str]:
        return f"sentence {index}", "label"


def _data(samples: int, nan_at: int | None = None) -> DataLoader:
    inputs = torch.randn(samples, 4, generator=torch.Generator().manual_seed(0))
    if nan_at is not None:
        inputs[nan_at] = float("nan")
    return DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True)), batch_size=4)


def _trainer(root, **options) -> gl.Trainer:
    return gl.Trainer(default_root_dir=str(root), max_epochs=2, **options)


def _files(root) -> list[str]:
    """Every file and folder below ``root``."""
    return sorted(os.path.relpath(os.path.join(f, n), root) for f, ds, fs in os.walk(root) for n in ds + fs)


def test_a_batch_of_the_wrong_type_fails_in_training_step_with_the_users_traceback(tmp_path, outcome):
    trainer = _trainer(tmp_path)
    with pytest.raises(TypeError) as raised:
        trainer.fit(Regression(), DataLoader(Words(), batch_size=4))
    frames = [frame.name for frame in traceback.extract_tb(raised.tb)]
    outcome(
        "Data and model faults",
        "a batch of strings where training_step expects tensors",
        error=type(raised.value).__name__,
        files_written=len([path for path in tmp_path.rglob("*") if path.is_file()]),
        data_lost="none",
        result=(
            f"torch's own {type(raised.value).__name__} from the user's training_step ({raised.value}) reaches "
            f"the caller unchanged at step {trainer.global_step}; the batch is passed as it came (Lightning too)"
        ),
    )
    assert "training_step" in frames and trainer.global_step == 0
    assert not list(tmp_path.rglob("*.ckpt"))


def test_an_empty_train_loader_warns_as_lightning_does_and_trains_nothing(tmp_path, outcome):
    model = Regression()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(tmp_path, logger=False, enable_checkpointing=False)
        trainer.fit(model, _data(0))
    messages = [str(w.message) for w in caught]
    outcome(
        "Data and model faults",
        "an empty train loader",
        files_written=len(_files(tmp_path)),  # logger and checkpointing off: not even a folder
        data_lost="none",
        result=f"Lightning's warning ({EMPTY_WARNING!r}); fit returns at step {trainer.global_step}, weights untouched",
    )
    assert EMPTY_WARNING in messages, messages
    assert trainer.global_step == 0
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def _fit_on_two_ranks(runtime, rank_one_data: dict, max_epochs: int) -> str:
    """Rank 1 reads ``_data(**rank_one_data)``, rank 0 16 clean samples: the step and error where each rank stopped."""
    data = _data(**rank_one_data) if runtime.global_rank == 1 else _data(16)
    trainer = gl.Trainer(
        devices=2, max_epochs=max_epochs, logger=False, enable_checkpointing=False, use_distributed_sampler=False
    )
    try:
        trainer.fit(Regression(), data)
    except (RuntimeError, ValueError) as error:
        return f"step {trainer.global_step}: {type(error).__name__}: {error}"
    return f"no error on rank {runtime.global_rank}"


@pytest.mark.multiprocess
def test_a_loader_empty_on_one_rank_only_is_an_error_on_every_rank(outcome):
    messages = run_ranks(_fit_on_two_ranks, {"samples": 0}, 1, timeout=60)
    outcome(
        "Data and model faults",
        "a train loader empty on rank 1 of 2 only (DDP)",
        data_lost="none",
        result=f"RuntimeError on both ranks before any step, naming the empty rank: {messages[0]!r}",
    )
    for message in messages:
        assert "train loader 0 has zero length on rank(s) [1]" in message, message


def test_a_val_check_interval_longer_than_the_epoch_fails_before_the_first_step(tmp_path, outcome):
    trainer = _trainer(tmp_path, val_check_interval=10, num_sanity_val_steps=0)
    with pytest.raises(ValueError, match="val_check_interval=10 is more than the 4 training batches") as raised:
        trainer.fit(Regression(), _data(16), _data(8))
    written = _files(tmp_path)
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    outcome(
        "Data and model faults",
        "val_check_interval=10 with 4 batches per epoch",
        error="ValueError",
        files_written=len(files),
        data_lost="none",
        result=(
            f"{raised.value} (raised when fit reads the train loader's length, at step {trainer.global_step}; "
            f"the logger's empty version folder exists by then, as in Lightning: {written})"
        ),
    )
    assert trainer.global_step == 0 and files == []


@pytest.mark.parametrize(("log_every_n_steps", "step", "batch_idx"), [(1, 3, 2), (50, 4, 3)], ids=["log", "epoch-end"])
def test_a_nan_loss_ends_fit_with_an_error_naming_the_step(tmp_path, outcome, log_every_n_steps, step, batch_idx):
    # Sample 9 is in the third batch of four: seen at that log step, or at the epoch's last batch without one.
    trainer = _trainer(tmp_path, logger=False, enable_checkpointing=False, log_every_n_steps=log_every_n_steps)
    with pytest.raises(gl.NonFiniteLossError) as raised:
        trainer.fit(Regression(), _data(16, nan_at=9))
    message = str(raised.value)
    outcome(
        "Data and model faults",
        f"a NaN loss at step 3, log_every_n_steps={log_every_n_steps}",
        error="NonFiniteLossError",
        data_lost="none",
        result=f"fit ends at step {trainer.global_step}: {message.split(';')[0]}",
    )
    assert f"is nan at step {step} (epoch 0, batch_idx {batch_idx})" in message, message
    assert "check_finite_loss=False" in message and trainer.global_step == step


def test_check_finite_loss_false_trains_on_through_a_nan_loss(tmp_path):
    trainer = _trainer(tmp_path, logger=False, enable_checkpointing=False, log_every_n_steps=1, check_finite_loss=False)
    trainer.fit(Regression(), _data(16, nan_at=9))
    assert trainer.global_step == 8


@pytest.mark.multiprocess
def test_a_nan_loss_on_one_rank_ends_fit_on_every_rank_at_the_same_step(outcome):
    # Sample 13 is in the epoch's last batch: under DDP a NaN at an earlier step reaches both ranks' weights
    messages = run_ranks(_fit_on_two_ranks, {"samples": 16, "nan_at": 13}, 2, timeout=60)
    outcome(
        "Data and model faults",
        "a NaN loss on rank 1 of 2 only, at step 4 (DDP)",
        error="NonFiniteLossError",
        data_lost="none",
        result=(
            "both ranks raise at step 4, the epoch's last batch: they agree on it in the collective they already "
            "share at that sync point; rank 1 names its loss, rank 0 says another rank's was not finite"
        ),
    )
    error = "step 4: NonFiniteLossError: "
    assert messages[0].startswith(error + "another rank's training_step loss is not finite at step 4"), messages
    assert messages[1].startswith(error + "the loss training_step returned is nan at step 4"), messages
