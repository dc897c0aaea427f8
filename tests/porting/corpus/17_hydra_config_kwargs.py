"""A Hydra-style project: the config is an OmegaConf ``DictConfig`` (interpolations included), the module takes its
section as keyword arguments and keeps the rest in ``**kwargs``, saves them all as hyperparameters, and is rebuilt
from its checkpoint."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = OmegaConf.create(
    """
    seed: 23
    model:
      hidden: 24
      lr: 0.02
      weight_decay: 1e-4
      scheduler:
        step_size: 2
        gamma: ${model.decay}
      decay: 0.5
      tag: baseline
    data:
      samples: 240
      batch_size: 16
    trainer:
      max_epochs: 4
      accelerator: cpu
      log_every_n_steps: 5
    """
)


class LitRegressor(LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 1e-3, **kwargs):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(5, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, **self.hparams.scheduler)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def loaders(config: DictConfig):
    generator = torch.Generator().manual_seed(config.seed)
    x = torch.randn(config.data.samples, 5, generator=generator)
    y = torch.sin(x).sum(dim=1, keepdim=True)
    split = int(0.75 * len(x))
    return (
        DataLoader(TensorDataset(x[:split], y[:split]), batch_size=config.data.batch_size, shuffle=True),
        DataLoader(TensorDataset(x[split:], y[split:]), batch_size=config.data.batch_size),
    )


out_dir = os.environ.get("OUT_DIR", "runs")
seed_everything(CONFIG.seed)
model = LitRegressor(**CONFIG.model)
trainer = Trainer(**CONFIG.trainer, logger=CSVLogger(out_dir), enable_checkpointing=False, default_root_dir=out_dir)
trainer.fit(model, *loaders(CONFIG))

path = os.path.join(out_dir, "final.ckpt")
trainer.save_checkpoint(path)
restored = LitRegressor.load_from_checkpoint(path, weights_only=False)
restored_results = {
    "hparams": {
        name: OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
        for name, value in restored.hparams.items()
    },
    "same_weights": all(torch.equal(a, b) for a, b in zip(model.parameters(), restored.parameters(), strict=True)),
}
with open(os.path.join(trainer.log_dir, "hparams.yaml")) as file:
    hparams_yaml_results = file.read()
