"""A GAN in the shape of Lightning's basic GAN example: manual optimization, two Adams with their own betas, the
generator's step with the discriminator toggled off, images logged as a dict, a validation step that samples."""

import os

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Points(LightningDataModule):
    def __init__(self, batch_size: int = 64):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage):
        generator = torch.Generator().manual_seed(0)
        angles = torch.rand(1024, generator=generator) * 2 * torch.pi
        radius = 1 + 0.1 * torch.randn(1024, generator=generator)
        self.points = torch.stack([radius * angles.cos(), radius * angles.sin()], dim=1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.points[:896]), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(TensorDataset(self.points[896:]), batch_size=self.batch_size)


class Generator(nn.Module):
    def __init__(self, latent_dim: int):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(latent_dim, 64), nn.LeakyReLU(0.2), nn.Linear(64, 2))

    def forward(self, z):
        return self.model(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def forward(self, x):
        return self.model(x)


class GAN(LightningModule):
    def __init__(self, latent_dim: int = 8, lr: float = 2e-3, b1: float = 0.5, b2: float = 0.999):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim)
        self.discriminator = Discriminator()

    def forward(self, z):
        return self.generator(z)

    def adversarial_loss(self, y_hat, y):
        return F.binary_cross_entropy_with_logits(y_hat, y)

    def training_step(self, batch, batch_idx):
        (points,) = batch
        optimizer_g, optimizer_d = self.optimizers()
        z = torch.randn(points.shape[0], self.hparams.latent_dim).type_as(points)

        self.toggle_optimizer(optimizer_g)
        generated = self(z)
        valid = torch.ones(points.size(0), 1).type_as(points)
        g_loss = self.adversarial_loss(self.discriminator(generated), valid)
        self.manual_backward(g_loss)
        optimizer_g.step()
        optimizer_g.zero_grad()
        self.untoggle_optimizer(optimizer_g)

        self.toggle_optimizer(optimizer_d)
        real_loss = self.adversarial_loss(self.discriminator(points), valid)
        fake = torch.zeros(points.size(0), 1).type_as(points)
        fake_loss = self.adversarial_loss(self.discriminator(generated.detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.manual_backward(d_loss)
        optimizer_d.step()
        optimizer_d.zero_grad()
        self.untoggle_optimizer(optimizer_d)

        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def validation_step(self, batch, batch_idx):
        (points,) = batch
        z = torch.randn(points.shape[0], self.hparams.latent_dim).type_as(points)
        self.log("val_radius_error", (self(z).norm(dim=1) - 1).abs().mean())

    def configure_optimizers(self):
        lr, betas = self.hparams.lr, (self.hparams.b1, self.hparams.b2)
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=betas)
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=betas)
        return [opt_g, opt_d], []


seed_everything(21)
model = GAN()
trainer = Trainer(
    accelerator="cpu",
    max_epochs=3,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(model, datamodule=Points())
val_results = trainer.validate(model, datamodule=Points(), verbose=False)
