"""A denoiser logging to TensorBoard: scalars, hyperparameters and sample images through self.logger.experiment,
with Rich's progress bar and model summary."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint, RichModelSummary, RichProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Denoiser(LightningModule):
    def __init__(self, noise=0.3, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64))

    def training_step(self, batch, batch_idx):
        (clean,) = batch
        noisy = clean + self.hparams.noise * torch.randn_like(clean)
        loss = nn.functional.mse_loss(self.net(noisy), clean)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        (clean,) = batch
        denoised = self.net(clean + self.hparams.noise * torch.randn_like(clean))
        self.log("val_loss", nn.functional.mse_loss(denoised, clean))
        if batch_idx == 0:
            grid = torch.cat([clean[:4], denoised[:4]]).view(-1, 1, 8, 8).clamp(0, 1)
            self.logger.experiment.add_images("val/denoised", grid, self.global_step)
            self.logger.experiment.add_image("val/first", grid[0], self.global_step)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


seed_everything(19)
generator = torch.Generator().manual_seed(0)
images = (torch.rand(320, 8, 8, generator=generator) > 0.7).float().view(320, 64)
out = os.environ.get("OUT_DIR", "runs")
model = Denoiser()
trainer = Trainer(
    max_epochs=3,
    accelerator="cpu",
    log_every_n_steps=5,
    logger=TensorBoardLogger(out, name="denoiser"),
    callbacks=[ModelCheckpoint(monitor="val_loss"), RichProgressBar(), RichModelSummary(max_depth=2)],
    default_root_dir=out,
)
trainer.fit(
    model,
    DataLoader(TensorDataset(images[:256]), batch_size=32, shuffle=True),
    DataLoader(TensorDataset(images[256:]), batch_size=32),
)
