"""Fine-tuning with a linear warmup then cosine decay, stepped every batch through a scheduler dict, watched by
LearningRateMonitor."""

import math
import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(LightningModule):
    def __init__(self, warmup_steps: int = 10, lr: float = 3e-2, weight_decay: float = 1e-4):
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU())
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), prog_bar=True)

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if n.endswith("weight")]
        no_decay = [p for n, p in self.named_parameters() if not n.endswith("weight")]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr,
        )
        total = self.trainer.estimated_stepping_batches
        warmup = self.hparams.warmup_steps

        def schedule(step):
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"}}


seed_everything(3)
generator = torch.Generator().manual_seed(0)
x = torch.randn(320, 8, generator=generator)
y = (x[:, :4].sum(dim=1, keepdim=True) - x[:, 4:].prod(dim=1, keepdim=True)).tanh()
out_dir = os.environ.get("OUT_DIR", "runs")
model = Regressor()
trainer = Trainer(
    max_epochs=3,
    accelerator="cpu",
    log_every_n_steps=5,
    callbacks=[LearningRateMonitor(logging_interval="step")],
    logger=CSVLogger(out_dir, name="finetune"),
    enable_checkpointing=False,
    default_root_dir=out_dir,
)
trainer.fit(
    model,
    DataLoader(TensorDataset(x[:256], y[:256]), batch_size=16, shuffle=True),
    DataLoader(TensorDataset(x[256:], y[256:]), batch_size=32),
)
