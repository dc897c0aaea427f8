"""Train a tiny character-level transformer language model on generated sentences with GPUlayer's Trainer.

It shows bf16 mixed precision (CPU autocast on a CPU, CUDA autocast on a GPU), gradient accumulation, a warmup +
cosine learning rate stepped once per optimizer step, validation every N batches, the two best checkpoints by
`val_loss` (and `last.ckpt`), and the learning rate in `metrics.csv`. The text comes from a small seeded grammar,
so it runs offline; the default run takes about half a minute on two CPU cores:

    pip install -e packages/gpulayer-runtime -e packages/gpulayer-trainer -e packages/gpulayer-callbacks
    python docs/examples/transformer_lm.py
    python docs/examples/transformer_lm.py --accelerator gpu --max-steps 600
    python docs/examples/transformer_lm.py --precision 32-true         # on a CPU, faster for a model this small
    python docs/examples/transformer_lm.py --devices 2                 # DDP on two processes (gloo on CPU)
    gpulayer launch --nproc-per-node 2 docs/examples/transformer_lm.py # the same, started by the launcher

Logs and checkpoints go to `--root-dir` (`runs/transformer_lm/lightning_logs/version_N/`). At the end it prints
the best checkpoint, its `val_loss` and a greedy sample from it. Moving from Lightning, only the imports change.
"""

import argparse
import math
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpulayer.callbacks import LearningRateMonitor, ModelCheckpoint
from gpulayer.trainer import DataModule, Module, Trainer, seed_everything

# A grammar with agreement (a cat sees / the cats see, a / an) and optional places: easy to learn, not trivial.
NOUNS = ["cat", "dog", "bird", "fox", "child", "robot", "farmer", "teacher"]
VERBS = ["see", "chase", "like", "find", "follow", "help"]
ADJECTIVES = ["small", "quick", "lazy", "happy", "old", "red"]
PLACES = ["in the park", "near the river", "at home", "on the hill"]
VOCAB = "".join(sorted(set("".join(NOUNS + VERBS + ADJECTIVES + PLACES) + "the an es ren .\n")))  # all it writes


def noun_phrase(rng: random.Random) -> tuple[str, bool]:
    plural = rng.random() < 0.4
    words = [rng.choice(ADJECTIVES)] if rng.random() < 0.5 else []
    noun = rng.choice(NOUNS)
    if plural:
        noun = noun + "ren" if noun == "child" else noun + ("es" if noun.endswith("x") else "s")
    words.append(noun)
    article = "the" if plural or rng.random() < 0.5 else ("an" if words[0][0] in "aeiou" else "a")
    return " ".join([article, *words]), plural


def sentence(rng: random.Random) -> str:
    subject, plural = noun_phrase(rng)
    verb = rng.choice(VERBS)
    verb = verb if plural else verb + "s"
    words = [subject, verb, noun_phrase(rng)[0]]
    if rng.random() < 0.3:
        words.append(rng.choice(PLACES))
    return " ".join(words) + "."


def generate_text(n_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    lines = []
    while sum(map(len, lines)) < n_chars:
        lines.append(sentence(rng) + "\n")
    return "".join(lines)


def encode(text: str) -> torch.Tensor:
    return torch.tensor([VOCAB.index(c) for c in text], dtype=torch.long)


class Windows(Dataset):
    """Every `stride`-th window of `block_size + 1` characters: the inputs, and the same shifted by one as targets."""

    def __init__(self, ids: torch.Tensor, block_size: int, stride: int) -> None:
        self.ids, self.block_size, self.stride = ids, block_size, stride

    def __len__(self) -> int:
        return (len(self.ids) - self.block_size - 1) // self.stride + 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.stride : i * self.stride + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class SentencesDataModule(DataModule):
    def __init__(self, block_size: int = 64, batch_size: int = 16, seed: int = 0) -> None:
        super().__init__()
        self.block_size, self.batch_size, self.seed = block_size, batch_size, seed

    def setup(self, stage: str) -> None:
        # Validation text comes from another seed of the same grammar: sentences the model has not seen.
        self.train_set = Windows(encode(generate_text(100_000, self.seed)), self.block_size, stride=1)
        self.val_set = Windows(encode(generate_text(10_000, self.seed + 1)), self.block_size, stride=self.block_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=128)


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each added to the residual stream (GPT-2's block)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.norm2(x))


class TransformerLM(Module):
    def __init__(
        self,
        vocab: str = VOCAB,
        block_size: int = 64,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        lr: float = 1e-2,
        warmup_steps: int = 20,
        min_lr_ratio: float = 0.1,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()  # into every checkpoint, so load_from_checkpoint rebuilds this model
        self.vocab = vocab
        self.token_embedding = nn.Embedding(len(vocab), d_model)
        self.position_embedding = nn.Embedding(block_size, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, n_heads) for _ in range(n_layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, len(vocab), bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)
        return self.head(self.norm(self.blocks(x)))

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(self(inputs).flatten(0, 1), targets.flatten())

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        # sync_dist: under DDP every rank validates its own shard; the checkpoint compares the mean of all of them.
        self.log("val_loss", self.loss(batch), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        # Optimizer steps, not batches: with accumulate_grad_batches=4 the scheduler steps once every 4 batches.
        total = self.trainer.estimated_stepping_batches
        warmup, floor = self.hparams.warmup_steps, self.hparams.min_lr_ratio

        def lr_factor(step: int) -> float:  # the factor for optimizer step `step` (0, 1, ...): peak at warmup - 1
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step + 1 - warmup) / max(1, total - warmup))  # 1.0 on the last step
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @torch.no_grad()
    def generate(self, prompt: str, n_chars: int) -> str:
        """Greedy decoding: the most likely next character, `n_chars` times."""
        self.eval()
        ids = encode(prompt).to(self.device)[None]
        for _ in range(n_chars):
            next_id = self(ids[:, -self.hparams.block_size :])[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        return "".join(self.vocab[i] for i in ids[0].tolist())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--root-dir", default="runs/transformer_lm", help="logs and checkpoints go here")
    parser.add_argument("--accelerator", default="auto", help='"cpu", "gpu" or "auto"')
    parser.add_argument(
        "--devices",
        type=lambda value: value if value == "auto" else int(value),
        default="auto",
        help='processes; more than 1 trains with DDP; "auto": a launcher\'s count, else every GPU or 1 CPU process',
    )
    parser.add_argument("--precision", default="bf16-mixed", help='e.g. "bf16-mixed", "32-true", "16-mixed"')
    parser.add_argument("--accumulate-grad-batches", type=int, default=4)
    parser.add_argument("--warmup-steps", type=int, default=20, help="optimizer steps of linear warmup")
    parser.add_argument("--val-check-interval", type=int, default=80, help="training batches between validations")
    parser.add_argument("--log-every-n-steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    seed_everything(args.seed)  # the model's initial weights and the shuffling order
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True, filename="{step}-{val_loss:.4f}")
    trainer = Trainer(
        max_steps=args.max_steps,
        accelerator=args.accelerator,
        devices=args.devices,
        precision=args.precision,
        accumulate_grad_batches=args.accumulate_grad_batches,
        # With check_val_every_n_epoch=None, Lightning counts val_check_interval's batches across epochs.
        val_check_interval=args.val_check_interval,
        check_val_every_n_epoch=None,
        log_every_n_steps=args.log_every_n_steps,
        callbacks=[checkpoint, LearningRateMonitor(logging_interval="step")],
        default_root_dir=args.root_dir,
    )
    model = TransformerLM(warmup_steps=args.warmup_steps)
    trainer.fit(model, datamodule=SentencesDataModule(block_size=model.hparams.block_size, seed=args.seed))

    if trainer.is_global_zero:
        best = TransformerLM.load_from_checkpoint(checkpoint.best_model_path)
        print(f"metrics: {trainer.logger.log_dir}/metrics.csv")
        print(f"best checkpoint: {checkpoint.best_model_path}")
        uniform = math.log(len(VOCAB))  # the loss of a model that knows nothing
        print(f"best val_loss: {checkpoint.best_model_score:.4f} (a uniform guess scores {uniform:.4f})")
        sample = best.generate("\n", 120)  # a line break first: what follows is the start of a sentence
        print(f"greedy sample: {sample!r}")
