"""A script that asks Lightning's Tuner for a learning rate before training: GPUlayer has no Tuner, so the
port reports it, with what to do, and keeps the import marked."""

import lightning.pytorch as pl
import torch
from lightning.pytorch.tuner import Tuner
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Line(pl.LightningModule):
    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.lr = lr
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


x = torch.randn(64, 2)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
model = Line()
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", profiler="simple")
Tuner(trainer).lr_find(model, loader, num_training=20)
trainer.fit(model, loader)
