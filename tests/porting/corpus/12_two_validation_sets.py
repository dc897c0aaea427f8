"""Validation on two sets at once (in-distribution and shifted): validation_step takes dataloader_idx."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class ShiftAware(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


seed_everything(6)
generator = torch.Generator().manual_seed(0)
x = torch.randn(260, 3, generator=generator)
y = (x[:, 0] + x[:, 1] > 0).long()
shifted = x[200:] + torch.tensor([0.5, -0.5, 1.0])
model = ShiftAware()
trainer = Trainer(
    max_epochs=3,
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
val_loaders = [
    DataLoader(TensorDataset(x[200:], y[200:]), batch_size=30),
    DataLoader(TensorDataset(shifted, y[200:]), batch_size=20),
]
trainer.fit(model, DataLoader(TensorDataset(x[:200], y[:200]), batch_size=20, shuffle=True), val_loaders)
validate_results = trainer.validate(model, val_loaders, verbose=False)
