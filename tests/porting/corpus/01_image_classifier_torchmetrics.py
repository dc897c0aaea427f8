"""A small CNN classifying 8x8 images of three shapes, with torchmetrics accuracy in every stage."""

import os

import torch
import torchmetrics
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def make_images(count: int, generator: torch.Generator) -> TensorDataset:
    labels = torch.randint(0, 3, (count,), generator=generator)
    images = torch.randn(count, 1, 8, 8, generator=generator) * 0.3
    images[labels == 0, :, 2:6, 2:6] += 1.0  # a square
    images[labels == 1, :, :, 3:5] += 1.0  # a vertical bar
    images[labels == 2, :, 3:5, :] += 1.0  # a horizontal bar
    return TensorDataset(images, labels)


class ShapeClassifier(LightningModule):
    def __init__(self, channels: int = 8, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(channels * 4, 3),
        )
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.val_acc.update(logits, y)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.test_acc(self(x), y)
        self.log("test_acc", self.test_acc)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


seed_everything(7)
data = make_images(240, torch.Generator().manual_seed(0))
train_set, val_set, test_set = random_split(data, [160, 40, 40], generator=torch.Generator().manual_seed(1))
model = ShapeClassifier()
trainer = Trainer(
    max_epochs=3,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(model, DataLoader(train_set, batch_size=16, shuffle=True), DataLoader(val_set, batch_size=20))
test_results = trainer.test(model, DataLoader(test_set, batch_size=20), verbose=False)
