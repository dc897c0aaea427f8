"""A run described by one nested config: the model's hyperparameters and the Trainer's arguments come from it."""

import copy
import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = {
    "seed": 17,
    "model": {"in_features": 6, "hidden": [32, 16], "dropout": 0.1, "lr": 0.02, "optimizer": "adamw"},
    "data": {"samples": 300, "batch_size": 25},
    "trainer": {"max_epochs": 3, "accelerator": "cpu", "log_every_n_steps": 4, "gradient_clip_val": 1.0},
}


class ConfiguredMLP(LightningModule):
    def __init__(self, in_features, hidden, dropout, lr, optimizer):
        super().__init__()
        self.save_hyperparameters()
        layers, width = [], in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
            width = size
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.smooth_l1_loss(self.net(x), y)
        self.log("loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.smooth_l1_loss(self.net(x), y))

    def configure_optimizers(self):
        kind = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[self.hparams.optimizer]
        return kind(self.parameters(), lr=self.hparams.lr)


def build(config):
    config = copy.deepcopy(config)
    seed_everything(config["seed"])
    generator = torch.Generator().manual_seed(config["seed"])
    x = torch.randn(config["data"]["samples"], config["model"]["in_features"], generator=generator)
    y = x.pow(2).sum(dim=1, keepdim=True).sqrt()
    split = int(0.8 * len(x))
    loaders = (
        DataLoader(TensorDataset(x[:split], y[:split]), batch_size=config["data"]["batch_size"], shuffle=True),
        DataLoader(TensorDataset(x[split:], y[split:]), batch_size=config["data"]["batch_size"]),
    )
    trainer = Trainer(
        **config["trainer"],
        logger=False,
        enable_checkpointing=False,
        default_root_dir=os.environ.get("OUT_DIR", "runs"),
    )
    return ConfiguredMLP(**config["model"]), trainer, loaders


model, trainer, (train_loader, val_loader) = build(CONFIG)
trainer.fit(model, train_loader, val_loader)
