"""A script that prints Lightning's model summary and lets the rich progress bar draw: the summary utility is
reported, the display callbacks stay Lightning's (GPUlayer's Trainer takes them and drops them)."""

import pytorch_lightning as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.utilities.model_summary import ModelSummary
from torch import nn


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


model = Tiny()
print(ModelSummary(model, max_depth=2))
trainer = pl.Trainer(
    max_epochs=1,
    accelerator="tpu",
    callbacks=[ModelCheckpoint(), RichProgressBar()],
    plugins=[pl.plugins.MixedPrecision("bf16-mixed", "cpu")],
)
