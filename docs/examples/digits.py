"""Train a small CNN on scikit-learn's handwritten digits (8x8 images, 10 classes) with GPUlayer's Trainer.

The data ships with scikit-learn, so this runs offline, on CPU, in a few seconds:

    pip install -e packages/gpulayer-runtime -e packages/gpulayer-trainer scikit-learn
    python docs/examples/digits.py                 # or: nox -s demo, which then draws the curves
    python docs/examples/digits.py --max-epochs 5 --accelerator cpu --precision bf16-mixed
    gpulayer plot runs/digits -o runs/digits/curves.png

It logs to runs/digits/lightning_logs/version_N/metrics.csv, prints the test accuracy and exits non-zero below
95%. Moving from Lightning, only the import changes.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

from gpulayer.trainer import DataModule, Module, Trainer, seed_everything


class DigitsDataModule(DataModule):
    def __init__(self, batch_size: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed

    def setup(self, stage: str) -> None:
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixels are 0..16
        labels = torch.tensor(digits.target)
        # Its own generator, so fit and test (each calls setup) cut the same 70/15/15 split.
        generator = torch.Generator().manual_seed(self.seed)
        self.train_set, self.val_set, self.test_set = random_split(
            TensorDataset(images, labels), [0.7, 0.15, 0.15], generator=generator
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=256)


class DigitsCNN(Module):
    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val_acc", (self(images).argmax(dim=1) == labels).float().mean(), prog_bar=True)

    def test_step(self, batch, batch_idx):
        images, labels = batch
        self.log("test_acc", (self(images).argmax(dim=1) == labels).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--accelerator", default="auto", help='"cpu", "gpu" or "auto"')
    parser.add_argument("--precision", default="32-true", help='e.g. "32-true", "bf16-mixed", "16-mixed"')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs/digits", help="where the CSV logs go (default runs/digits)")
    args = parser.parse_args()

    seed_everything(args.seed)  # the model's initial weights and the shuffling order
    trainer = Trainer(
        max_epochs=args.max_epochs,
        accelerator=args.accelerator,
        devices=1,
        precision=args.precision,
        enable_checkpointing=False,
        default_root_dir=args.root_dir,
    )
    datamodule = DigitsDataModule(seed=args.seed)
    model = DigitsCNN()
    trainer.fit(model, datamodule=datamodule)
    test_acc = trainer.test(model, datamodule=datamodule)[0]["test_acc"]

    print(f"test accuracy: {test_acc:.4f}")
    sys.exit(0 if test_acc >= 0.95 else 1)
