"""Train for two epochs with a last checkpoint, then resume the same run to five epochs with ckpt_path="last".

Nothing here draws random numbers after the first epoch starts (no dropout, no shuffling): GPUlayer resumes the
random state a checkpoint saved, Lightning does not (the porting guide says so), and this script is about resuming
the loop, the optimizer and the scheduler."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(LightningModule):
    def __init__(self):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.8)}


def loaders():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(180, 6, generator=generator)
    y = x.abs().sum(dim=1, keepdim=True)
    return (
        DataLoader(TensorDataset(x[:150], y[:150]), batch_size=15),
        DataLoader(TensorDataset(x[150:], y[150:]), batch_size=30),
    )


out_dir = os.environ.get("OUT_DIR", "runs")
seed_everything(1)
first = Trainer(
    max_epochs=2,
    accelerator="cpu",
    logger=False,
    callbacks=[ModelCheckpoint(dirpath=os.path.join(out_dir, "ckpt"), save_last=True)],
    default_root_dir=out_dir,
)
first.fit(Model(), *loaders())

seed_everything(1)
model = Model()
trainer = Trainer(
    max_epochs=5,
    accelerator="cpu",
    logger=False,
    callbacks=[ModelCheckpoint(dirpath=os.path.join(out_dir, "ckpt"), save_last=True)],
    default_root_dir=out_dir,
)
trainer.fit(model, *loaders(), ckpt_path="last")
resume_results = {"first_steps": first.global_step}
