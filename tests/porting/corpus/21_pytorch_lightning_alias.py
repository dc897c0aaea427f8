"""The older package name, `import pytorch_lightning as pl`: `pl.LightningModule`, `pl.LightningDataModule`,
`pl.Trainer`, `pl.callbacks.EarlyStopping`, and a callback imported under another name."""

import os

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback as Hook
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Points(pl.LightningDataModule):
    def setup(self, stage):
        x = torch.randn(96, 3, generator=torch.Generator().manual_seed(1))
        self.data = TensorDataset(x, (x[:, :1] > 0).float())

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=48)


class Logistic(pl.LightningModule):
    def __init__(self, lr: float = 0.5):
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.binary_cross_entropy_with_logits(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class CountEpochs(Hook):
    def __init__(self):
        self.epochs = 0

    def on_train_epoch_end(self, trainer, pl_module):
        self.epochs += 1
        pl_module.log("epochs_seen", float(self.epochs))


pl.seed_everything(5)
model = Logistic()
trainer = pl.Trainer(
    max_epochs=6,
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_model_summary=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
    callbacks=[CountEpochs(), pl.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.05)],
)
trainer.fit(model, datamodule=Points())
