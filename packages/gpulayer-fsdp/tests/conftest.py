"""Models, data and the run that each rank does: the same script under DDP and under FSDP, and in one process.

Rank r of 2 reads samples r, r+2, ... with batch b (``use_distributed_sampler=False``), so a step of the two ranks
sees what a step of one process with batch 2b sees, and every placement trains the same model.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

import gpulayer.trainer as gl

SAMPLES = 32
VOCAB, CONTEXT, WIDTH = 16, 8, 16


class Block(nn.Module):
    """A pre-norm transformer block: attention, then a feed-forward layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attention = nn.MultiheadAttention(WIDTH, num_heads=2, batch_first=True)
        self.feed_forward = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), diagonal=1)
        y = self.norm1(x)
        x = x + self.attention(y, y, y, attn_mask=causal, need_weights=False)[0]
        return x + self.feed_forward(self.norm2(x))


class LanguageModel(gl.Module):
    """Embedding, two blocks, a norm and a head; the position table is the module's own parameter."""

    def __init__(self, optimizer: str = "adamw") -> None:
        super().__init__()
        self.optimizer_name = optimizer
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.02)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        loss = F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        tokens, targets = batch
        self.log("val_loss", F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten()), sync_dist=True)

    def configure_optimizers(self):
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.5)
        if self.optimizer_name == "momentum":
            return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class Regression(gl.Module):
    """An MLP trained with plain SGD: a sum of gradients where a mean belongs would show in its weights at once."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.net(batch[0]), batch[1]), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


class ManualRegression(Regression):
    """The MLP under manual optimization: its first and last layers each have an optimizer, and each steps after
    a forward and ``manual_backward`` of its own (two backward passes a step)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        for optimizer in self.optimizers():
            loss = F.mse_loss(self.net(batch[0]), batch[1])
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return [torch.optim.SGD(self.net[:2].parameters(), lr=0.2), torch.optim.Adam(self.net[2:].parameters())]


class StepLosses(gl.Callback):
    """Each optimizer step's training loss, read where a test may sync: the run is short."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())


def make_model(kind: str) -> gl.Module:
    """``transformer`` (AdamW), ``transformer_sgd``, ``transformer_momentum``, ``mlp`` or ``mlp_manual``, the same on
    every rank."""
    torch.manual_seed(0)
    if kind.startswith("mlp"):
        return ManualRegression() if kind == "mlp_manual" else Regression()
    return LanguageModel(kind.removeprefix("transformer").lstrip("_") or "adamw")


def dataset(kind: str) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    if kind.startswith("transformer"):
        tokens = torch.randint(VOCAB, (SAMPLES, CONTEXT + 1), generator=generator)
        return TensorDataset(tokens[:, :-1], tokens[:, 1:])
    inputs = torch.randn(SAMPLES, 6, generator=generator)
    return TensorDataset(inputs, torch.sin(inputs[:, :2]) + inputs[:, 2:4] ** 2)


def loader(kind: str, rank: int, world_size: int, shuffled: bool = False) -> DataLoader:
    """Rank r's interleaved shard, batch 8 // world_size per rank: global batches of 8 on 1, 2 or 4 ranks (on 3, of
    6, the last 2 samples dropped so that every rank steps 5 times); ``shuffled``: the whole dataset, shuffled, for
    the Trainer's distributed sampler to shard."""
    if shuffled:
        return DataLoader(dataset(kind), batch_size=8 // world_size, shuffle=True)
    shard = Subset(dataset(kind), list(range(rank, SAMPLES, world_size)))
    return DataLoader(shard, batch_size=8 // world_size, shuffle=False, drop_last=True)


def fit(
    kind: str,
    strategy: object,
    folder: Path,
    *,
    rank: int = 0,
    world_size: int = 2,
    max_epochs: int = 2,
    ckpt_path: str | None = None,
    save: str | None = None,
    shuffled: bool = False,
    **trainer_options: object,
) -> dict:
    """Train ``kind`` and return what the tests compare: losses per step and the full weights (from a checkpoint
    written at the end, so the FSDP runs are read through their full-state saving). ``shuffled``: the train data
    through the Trainer's shuffling distributed sampler."""
    model, losses = make_model(kind), StepLosses()
    options = {"accumulate_grad_batches": 2, "gradient_clip_val": 0.5, **trainer_options}
    callbacks = [losses, *options.pop("callbacks", [])]
    trainer = gl.Trainer(
        devices=world_size,
        strategy=strategy,
        max_epochs=max_epochs,
        default_root_dir=str(folder),
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=shuffled,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **options,
    )
    train = loader(kind, rank, world_size, shuffled)
    trainer.fit(model, train, loader(kind, rank, world_size), ckpt_path=ckpt_path)
    final = str(folder / "final.ckpt")
    trainer.save_checkpoint(final)  # every rank calls it: under FSDP it gathers the shards
    if save is not None:
        trainer.save_checkpoint(save)
    trainer.runtime.barrier()  # rank 0 has written the files
    checkpoint = torch.load(final, weights_only=True)
    return {
        "losses": losses.losses,
        "global_step": trainer.global_step,
        "weights": checkpoint["state_dict"],
        "optimizer": checkpoint["optimizer_states"][0],
        "val_loss": float(trainer.callback_metrics.get("val_loss", math.nan)),  # none: a run stopped mid-epoch
    }


def packed(record: object) -> bytes:
    """A rank's record as bytes: tensors sent through a queue would live in memory that dies with the rank."""
    buffer = io.BytesIO()
    torch.save(record, buffer)
    return buffer.getvalue()


def unpacked(ranks: list[bytes]) -> list:
    return [torch.load(io.BytesIO(record), weights_only=True) for record in ranks]
