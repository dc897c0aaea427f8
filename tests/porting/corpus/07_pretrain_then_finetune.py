"""Pretrain an encoder on a reconstruction task with one Trainer, then fine-tune it for classification with a
second Trainer, starting from the pretrained checkpoint."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Pretrainer(LightningModule):
    def __init__(self, features: int = 12, code: int = 4):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(features, 24), nn.ReLU(), nn.Linear(24, code))
        self.decoder = nn.Sequential(nn.Linear(code, 24), nn.ReLU(), nn.Linear(24, features))

    def training_step(self, batch, batch_idx):
        x = batch[0]
        loss = nn.functional.mse_loss(self.decoder(self.encoder(x)), x)
        self.log("pretrain_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=5e-3)


class Classifier(LightningModule):
    def __init__(self, encoder: nn.Module, classes: int = 3):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder[-1].out_features, classes)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.head(self.encoder(x)), y)
        self.log("finetune_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.head(self.encoder(x)).argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(
            [{"params": self.encoder.parameters(), "lr": 1e-3}, {"params": self.head.parameters()}], lr=5e-2
        )


seed_everything(8)
out_dir = os.environ.get("OUT_DIR", "runs")
generator = torch.Generator().manual_seed(0)
labels = torch.randint(0, 3, (240,), generator=generator)
centers = torch.randn(3, 12, generator=generator) * 2
x = centers[labels] + torch.randn(240, 12, generator=generator)

checkpoint = ModelCheckpoint(dirpath=os.path.join(out_dir, "pretrain"), save_last=True)
pretrain_trainer = Trainer(
    max_epochs=3, accelerator="cpu", logger=False, callbacks=[checkpoint], default_root_dir=out_dir
)
pretrain_trainer.fit(Pretrainer(), DataLoader(TensorDataset(x), batch_size=24, shuffle=True))

pretrained = Pretrainer.load_from_checkpoint(checkpoint.last_model_path)
model = Classifier(pretrained.encoder)
trainer = Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=out_dir)
trainer.fit(
    model,
    DataLoader(TensorDataset(x[:200], labels[:200]), batch_size=20, shuffle=True),
    DataLoader(TensorDataset(x[200:], labels[200:]), batch_size=40),
)
pretrain_results = {"global_step": pretrain_trainer.global_step, "last": os.path.basename(checkpoint.last_model_path)}
