"""A LightningCLI script, as Lightning's backbone image classifier example writes one: the classifier takes an
optional backbone module, the DataModule its batch size, and run=False leaves fit, then test(ckpt_path="best"), to
the script."""

import os

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split


def make_digits(count: int, seed: int) -> TensorDataset:
    """``count`` noisy 8x8 images of ten fixed stroke patterns, one per class, with their labels."""
    patterns = (torch.rand(10, 8, 8, generator=torch.Generator().manual_seed(0)) > 0.6).float()
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (count,), generator=generator)
    images = patterns[labels] + 0.4 * torch.randn(count, 8, 8, generator=generator)
    return TensorDataset(images.clamp(0, 1).unsqueeze(1), labels)


class Backbone(torch.nn.Module):
    def __init__(self, hidden_dim: int = 32):
        super().__init__()
        self.l1 = torch.nn.Linear(8 * 8, hidden_dim)
        self.l2 = torch.nn.Linear(hidden_dim, 10)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x.flatten(1))))


class LitClassifier(LightningModule):
    def __init__(self, backbone: Backbone | None = None, learning_rate: float = 0.0001):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = Backbone() if backbone is None else backbone

    def forward(self, x):
        return self.backbone(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("valid_loss", F.cross_entropy(logits, y), on_step=True)
        self.log("valid_acc", (logits.argmax(dim=1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("test_loss", F.cross_entropy(logits, y))
        self.log("test_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


class MyDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 32):
        super().__init__()
        self.digits_test = make_digits(100, seed=2)
        self.digits_train, self.digits_val = random_split(
            make_digits(300, seed=1), [240, 60], generator=torch.Generator().manual_seed(42)
        )
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.digits_train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.digits_val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.digits_test, batch_size=self.batch_size)


cli = LightningCLI(
    LitClassifier,
    MyDataModule,
    seed_everything_default=1234,
    trainer_defaults={
        "max_epochs": 3,
        "accelerator": "cpu",
        "enable_progress_bar": False,
        "default_root_dir": os.environ.get("OUT_DIR", "runs"),
    },
    save_config_kwargs={"overwrite": True},
    run=False,
)
cli.trainer.fit(cli.model, datamodule=cli.datamodule)
test_results = cli.trainer.test(ckpt_path="best", datamodule=cli.datamodule)
