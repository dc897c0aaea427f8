"""A fit checkpointed in the middle of an epoch on 2 ranks and resumed on 3, and on 1, trains each sample of every
epoch once: the resumed ranks go on from the saved position in the epoch's global order (``order_position.py``).
A run resumed on the world size it was saved on repeats the unbroken run bit for bit, a resumed one included.

48 samples, batches of 4 per rank: 6 batches an epoch on 2 ranks; ``max_steps=3`` stops epoch 0 after 24 samples.
"""

import io
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks

pytestmark = pytest.mark.multiprocess

SAMPLES, BATCH, EPOCHS = 48, 4, 2


class _Recorded(gl.Module):
    """A regression that records each step's epoch and sample indices."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        index, inputs, target = batch
        self.seen.append((self.trainer.current_epoch, index.tolist()))
        return F.mse_loss(self.net(inputs), target)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(world_size: int, *, max_steps: int = -1, ckpt_path: Path | None = None, save: Path | None = None) -> dict:
    gl.seed_everything(7, verbose=False)
    inputs = torch.randn(SAMPLES, 3, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(torch.arange(SAMPLES), inputs, inputs.sum(dim=1, keepdim=True))
    model = _Recorded()
    trainer = gl.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy="ddp",
        max_epochs=EPOCHS,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True), ckpt_path=ckpt_path)
    if save is not None:
        trainer.save_checkpoint(save)
    weights = io.BytesIO()
    torch.save(model.state_dict(), weights)
    return {"seen": model.seen, "global_step": trainer.global_step, "weights": weights.getvalue()}


def _two_ranks(runtime, folder: str) -> dict:
    return _fit(2, max_steps=3, save=Path(folder) / "two.ckpt")


def _three_ranks(runtime, folder: str) -> dict:
    folder = Path(folder)
    resumed = _fit(3, ckpt_path=folder / "two.ckpt")
    stopped = _fit(3, max_steps=4, ckpt_path=folder / "two.ckpt", save=folder / "three.ckpt")
    return {"resumed": resumed, "stopped": stopped, "resumed again": _fit(3, ckpt_path=folder / "three.ckpt")}


def _one_rank(runtime, folder: str) -> dict:
    return _fit(1, ckpt_path=Path(folder) / "two.ckpt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    folder = str(tmp_path_factory.mktemp("elastic"))
    return {
        "two": run_ranks(_two_ranks, folder, world_size=2, timeout=120),
        "three": run_ranks(_three_ranks, folder, world_size=3, timeout=120),
        "one": run_ranks(_one_rank, folder, world_size=1, timeout=120),
    }


def _by_epoch(*ranks: list[dict]) -> dict[int, list[int]]:
    """Every index the ranks trained on, by epoch, sorted."""
    epochs: dict[int, list[int]] = {}
    for records in ranks:
        for record in records:
            for epoch, indices in record["seen"]:
                epochs.setdefault(epoch, []).extend(indices)
    return {epoch: sorted(indices) for epoch, indices in epochs.items()}


def test_resumed_on_3_and_on_1_rank_each_sample_of_each_epoch_is_trained_on_once(runs):
    first = runs["two"]
    assert [record["global_step"] for record in first] == [3, 3]
    assert _by_epoch(first) == {0: sorted(_by_epoch(first)[0])} and len(_by_epoch(first)[0]) == 24
    three = [ranks["resumed"] for ranks in runs["three"]]
    assert _by_epoch(first, three) == _by_epoch(first, runs["one"]) == {e: list(range(SAMPLES)) for e in range(EPOCHS)}
    # 2 steps finish epoch 0 on 3 ranks, 4 train epoch 1; on 1 rank, 6 and 12.
    assert [r["global_step"] for r in three] == [3 + 2 + 4] * 3
    assert [r["global_step"] for r in runs["one"]] == [3 + 6 + 12]


def test_a_run_resumed_on_the_world_size_it_was_saved_on_repeats_the_unbroken_run_bit_for_bit(runs):
    # The 3-rank run from two.ckpt, stopped at step 4 and resumed on 3 ranks, is the 3-rank run from two.ckpt.
    for ranks in runs["three"]:
        unbroken, stopped, again = ranks["resumed"], ranks["stopped"], ranks["resumed again"]
        assert stopped["seen"] + again["seen"] == unbroken["seen"]
        assert again["weights"] == unbroken["weights"]
