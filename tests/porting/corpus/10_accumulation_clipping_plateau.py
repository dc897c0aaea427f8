"""Gradient accumulation, clipping by norm, and a ReduceLROnPlateau scheduler on the validation loss."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class PlateauNet(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.3, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "val_loss"}


seed_everything(4)
generator = torch.Generator().manual_seed(0)
x = torch.randn(220, 4, generator=generator)
y = torch.cos(x[:, :1] * 2) + x[:, 1:2]
model = PlateauNet()
trainer = Trainer(
    max_epochs=5,
    accelerator="cpu",
    accumulate_grad_batches=3,
    gradient_clip_val=0.5,
    gradient_clip_algorithm="norm",
    logger=False,
    enable_checkpointing=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(
    model,
    DataLoader(TensorDataset(x[:180], y[:180]), batch_size=10),
    DataLoader(TensorDataset(x[180:], y[180:]), batch_size=20),
)
lr_results = [group["lr"] for group in trainer.optimizers[0].param_groups]
