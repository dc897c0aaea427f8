"""A denoising autoencoder whose evaluation metrics come from one torchmetrics MetricCollection, logged with
log_dict, validated and tested."""

import os

import torch
import torchmetrics
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DenoisingAutoencoder(LightningModule):
    def __init__(self, noise: float = 0.2):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(20, 8), nn.ReLU())
        self.decoder = nn.Linear(8, 20)
        metrics = torchmetrics.MetricCollection(
            {"mse": torchmetrics.MeanSquaredError(), "mae": torchmetrics.MeanAbsoluteError()}
        )
        self.val_metrics = metrics.clone(prefix="val_")
        self.test_metrics = metrics.clone(prefix="test_")

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx):
        clean = batch[0]
        noisy = clean + self.hparams.noise * torch.randn_like(clean)
        loss = nn.functional.mse_loss(self(noisy), clean)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        clean = batch[0]
        self.val_metrics.update(self(clean), clean)
        self.log_dict(self.val_metrics)

    def test_step(self, batch, batch_idx):
        clean = batch[0]
        self.test_metrics.update(self(clean), clean)
        self.log_dict(self.test_metrics)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


seed_everything(15)
generator = torch.Generator().manual_seed(0)
signals = torch.randn(280, 5, generator=generator) @ torch.randn(5, 20, generator=generator)
model = DenoisingAutoencoder()
trainer = Trainer(
    max_epochs=3,
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(
    model,
    DataLoader(TensorDataset(signals[:200]), batch_size=20, shuffle=True),
    DataLoader(TensorDataset(signals[200:240]), batch_size=20),
)
test_results = trainer.test(model, DataLoader(TensorDataset(signals[240:]), batch_size=20), verbose=False)
