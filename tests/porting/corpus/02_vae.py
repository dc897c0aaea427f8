"""A variational autoencoder on generated 16-dimensional data: reconstruction plus KL, logged as a dict."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class VAE(LightningModule):
    def __init__(self, features: int = 16, latent: int = 4, beta: float = 0.5):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 2 * latent))
        self.decoder = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, features))

    def forward(self, x):
        mean, log_var = self.encoder(x).chunk(2, dim=-1)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)
        return self.decoder(z), mean, log_var

    def _losses(self, x):
        reconstruction, mean, log_var = self(x)
        rec = nn.functional.mse_loss(reconstruction, x)
        kl = -0.5 * torch.mean(1 + log_var - mean.pow(2) - log_var.exp())
        return rec, kl

    def training_step(self, batch, batch_idx):
        rec, kl = self._losses(batch[0])
        loss = rec + self.hparams.beta * kl
        self.log_dict({"train/rec": rec, "train/kl": kl, "train/loss": loss}, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        rec, kl = self._losses(batch[0])
        self.log_dict({"val/rec": rec, "val/kl": kl})

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


seed_everything(11)
generator = torch.Generator().manual_seed(0)
basis = torch.randn(4, 16, generator=generator)
samples = torch.randn(256, 4, generator=generator) @ basis + 0.05 * torch.randn(256, 16, generator=generator)
model = VAE()
trainer = Trainer(
    max_epochs=4,
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_model_summary=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(
    model,
    DataLoader(TensorDataset(samples[:192]), batch_size=32, shuffle=True),
    DataLoader(TensorDataset(samples[192:]), batch_size=32),
)
val_results = trainer.validate(model, DataLoader(TensorDataset(samples[192:]), batch_size=32), verbose=False)
