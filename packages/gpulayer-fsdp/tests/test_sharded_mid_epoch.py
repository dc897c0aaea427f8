"""A sharded checkpoint saved in the middle of an epoch on 2 FSDP ranks and resumed on 3 trains each sample of every
epoch once: ``meta.pt`` carries the position in the epoch's global order as a full-state file does.

48 samples, batches of 4 per rank: ``max_steps=3`` stops epoch 0 after 24 samples; 3 ranks finish it in 2 steps.
"""

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.fsdp import FSDPStrategy
from gpulayer.runtime.testing import run_ranks

pytestmark = pytest.mark.multiprocess

SAMPLES, BATCH, EPOCHS = 48, 4, 2


class _Recorded(gl.Module):
    """A small MLP that records each step's epoch and sample indices."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        index, inputs, target = batch
        self.seen.append((self.trainer.current_epoch, index.tolist()))
        return F.mse_loss(self.net(inputs), target)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def _fit(runtime, folder: str, max_steps: int = -1, ckpt_path: str | None = None) -> dict:
    gl.seed_everything(7, verbose=False)
    inputs = torch.randn(SAMPLES, 3, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(torch.arange(SAMPLES), inputs, inputs.sum(dim=1, keepdim=True))
    model = _Recorded()
    trainer = gl.Trainer(
        accelerator="cpu",
        devices=runtime.world_size,
        strategy=FSDPStrategy(state_dict_type="sharded"),
        max_epochs=EPOCHS,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True), ckpt_path=ckpt_path)
    if ckpt_path is None:
        trainer.save_checkpoint(str(Path(folder) / "two.ckpt"))
    return {"seen": model.seen, "global_step": trainer.global_step, "folder": (Path(folder) / "two.ckpt").is_dir()}


def _three_ranks(runtime, folder: str) -> dict:
    return _fit(runtime, folder, ckpt_path=str(Path(folder) / "two.ckpt"))


def test_a_sharded_checkpoint_saved_mid_epoch_on_2_ranks_resumes_on_3_with_each_sample_once(tmp_path):
    first = run_ranks(_fit, str(tmp_path), 3, world_size=2, timeout=120)
    resumed = run_ranks(_three_ranks, str(tmp_path), world_size=3, timeout=120)
    assert [r["folder"] for r in first] == [True, True]  # saved sharded
    assert [r["global_step"] for r in first + resumed] == [3, 3] + [3 + 2 + 4] * 3
    epochs: dict[int, list[int]] = {}
    for record in first + resumed:
        for epoch, indices in record["seen"]:
            epochs.setdefault(epoch, []).extend(indices)
    assert {epoch: sorted(indices) for epoch, indices in epochs.items()} == {
        epoch: list(range(SAMPLES)) for epoch in range(EPOCHS)
    }
