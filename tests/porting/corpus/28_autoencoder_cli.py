"""A LightningCLI script, as Lightning's autoencoder example writes one with `import lightning as L`: a callback in
trainer_defaults reconstructs a few validation images at the end of each training epoch, and run=False leaves fit,
test and predict, each from the best checkpoint, to the script."""

import os

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split


def make_digits(count: int, seed: int) -> TensorDataset:
    """``count`` noisy 8x8 images of ten fixed stroke patterns, one per class, with their labels."""
    patterns = (torch.rand(10, 8, 8, generator=torch.Generator().manual_seed(0)) > 0.6).float()
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (count,), generator=generator)
    images = patterns[labels] + 0.3 * torch.randn(count, 8, 8, generator=generator)
    return TensorDataset(images.clamp(0, 1).unsqueeze(1), labels)


class ImageSampler(L.Callback):
    """Reconstructs the first ``num_samples`` validation images after each training epoch: it keeps them, by epoch,
    and logs their reconstruction error to the loggers (where the example saves image grids)."""

    def __init__(self, num_samples: int = 4):
        super().__init__()
        self.num_samples = num_samples
        self.reconstructions = {}

    @rank_zero_only
    def on_train_epoch_end(self, trainer, pl_module):
        images, _ = next(iter(DataLoader(trainer.datamodule.digits_val, batch_size=self.num_samples)))
        flattened = images.view(images.size(0), -1).to(pl_module.device)
        with torch.no_grad():
            pl_module.eval()
            generated = pl_module(flattened)
            pl_module.train()
        self.reconstructions[trainer.current_epoch] = generated.view(images.shape).cpu()
        error = F.mse_loss(generated, flattened).item()
        for logger in trainer.loggers:
            logger.log_metrics({"sample_reconstruction_error": error}, step=trainer.global_step)


class LitAutoEncoder(L.LightningModule):
    def __init__(self, hidden_dim: int = 64, learning_rate: float = 1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(8 * 8, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 3))
        self.decoder = nn.Sequential(nn.Linear(3, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 8 * 8))

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx):
        return self._common_step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._common_step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._common_step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(self._prepare_batch(batch))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

    def _prepare_batch(self, batch):
        x, _ = batch
        return x.view(x.size(0), -1)

    def _common_step(self, batch, stage: str):
        x = self._prepare_batch(batch)
        loss = F.mse_loss(self(x), x)
        self.log(f"{stage}_loss", loss, on_step=True)
        return loss


class MyDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 32):
        super().__init__()
        self.digits_test = make_digits(64, seed=2)
        self.digits_train, self.digits_val = random_split(
            make_digits(256, seed=1), [192, 64], generator=torch.Generator().manual_seed(42)
        )
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.digits_train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.digits_val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.digits_test, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.digits_test, batch_size=self.batch_size)


sampler = ImageSampler()
cli = LightningCLI(
    LitAutoEncoder,
    MyDataModule,
    seed_everything_default=1234,
    run=False,
    trainer_defaults={
        "callbacks": sampler,
        "max_epochs": 3,
        "accelerator": "cpu",
        "enable_progress_bar": False,
        "default_root_dir": os.environ.get("OUT_DIR", "runs"),
    },
    save_config_kwargs={"overwrite": True},
)
cli.trainer.fit(cli.model, datamodule=cli.datamodule)
test_results = cli.trainer.test(ckpt_path="best", datamodule=cli.datamodule)
predictions = cli.trainer.predict(ckpt_path="best", datamodule=cli.datamodule)
predict_results = torch.cat(predictions)
sampler_results = sampler.reconstructions
