"""Everything data in a LightningDataModule: prepare_data writes a file once, setup splits it per stage."""

import os

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


class SpiralData(LightningDataModule):
    def __init__(self, root: str, batch_size: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.path = os.path.join(root, "spiral.pt")

    def prepare_data(self):
        if not os.path.exists(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            generator = torch.Generator().manual_seed(0)
            t = torch.rand(600, generator=generator) * 3 * math_pi()
            label = torch.randint(0, 2, (600,), generator=generator)
            radius = t / (3 * math_pi())
            angle = t + label * math_pi()
            points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
            torch.save({"points": points + 0.02 * torch.randn(600, 2, generator=generator), "labels": label}, self.path)

    def setup(self, stage: str):
        data = torch.load(self.path)
        full = TensorDataset(data["points"], data["labels"])
        self.train_set, self.val_set, self.test_set = random_split(
            full, [400, 100, 100], generator=torch.Generator().manual_seed(42)
        )

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)


def math_pi() -> float:
    return float(torch.pi)


class SpiralNet(LightningModule):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 2)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self.net(x).argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


seed_everything(5)
out_dir = os.environ.get("OUT_DIR", "runs")
datamodule = SpiralData(os.path.join(out_dir, "data"))
model = SpiralNet()
trainer = Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=out_dir)
trainer.fit(model, datamodule=datamodule)
test_results = trainer.test(model, datamodule=datamodule, verbose=False)
