"""A regression model with torchmetrics' MeanSquaredError, then predictions for new inputs with trainer.predict."""

import os

import torch
import torchmetrics
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class HousePrices(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(7, 24), nn.SiLU(), nn.Linear(24, 1))
        self.val_mse = torchmetrics.MeanSquaredError()

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_mse", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_mse(self(x), y)
        self.log("val_mse", self.val_mse)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=2e-2)


seed_everything(9)
generator = torch.Generator().manual_seed(0)
features = torch.randn(300, 7, generator=generator)
prices = features @ torch.linspace(-1, 1, 7) + 0.1 * torch.randn(300, generator=generator)
model = HousePrices()
trainer = Trainer(
    max_epochs=4,
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(
    model,
    DataLoader(TensorDataset(features[:240], prices[:240]), batch_size=24, shuffle=True),
    DataLoader(TensorDataset(features[240:], prices[240:]), batch_size=30),
)
predictions = trainer.predict(model, DataLoader(TensorDataset(features[240:250]), batch_size=5))
prediction_results = torch.cat(predictions).tolist()
