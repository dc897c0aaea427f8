"""Early stopping on a validation metric with patience, min_delta and a checkpoint of the best epoch."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Overfitter(LightningModule):
    """Wide enough to overfit 40 noisy samples: the validation loss turns up and training stops."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 128), nn.ReLU(), nn.Linear(128, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


seed_everything(13)
generator = torch.Generator().manual_seed(0)
x = torch.randn(100, 10, generator=generator)
y = x[:, :1] + 0.5 * torch.randn(100, 1, generator=generator)
out_dir = os.environ.get("OUT_DIR", "runs")
stopper = EarlyStopping(monitor="val_loss", patience=3, min_delta=1e-3, mode="min")
best = ModelCheckpoint(monitor="val_loss", filename="best")
model = Overfitter()
trainer = Trainer(max_epochs=50, accelerator="cpu", logger=False, callbacks=[stopper, best], default_root_dir=out_dir)
trainer.fit(
    model,
    DataLoader(TensorDataset(x[:40], y[:40]), batch_size=8, shuffle=True),
    DataLoader(TensorDataset(x[40:], y[40:]), batch_size=30),
)
stopping_results = {
    "stopped_epoch": stopper.stopped_epoch,
    "wait_count": stopper.wait_count,
    "best": float(best.best_model_score),
}
