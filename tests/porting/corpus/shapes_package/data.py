"""The data module; the model reads its FEATURES."""

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 5


class Blobs(pl.LightningDataModule):
    def setup(self, stage):
        generator = torch.Generator().manual_seed(2)
        y = torch.randint(0, 2, (80,), generator=generator)
        x = torch.randn(80, FEATURES, generator=generator) + y[:, None].float()
        self.data = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=20, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=40)
