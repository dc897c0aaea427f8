"""`import lightning as L`, as Lightning's own docs write it: `L.LightningModule`, `L.Trainer`,
`L.seed_everything` and a callback reached through the package, `L.pytorch.callbacks.ModelCheckpoint`."""

import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Line(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


L.seed_everything(3)
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(1, keepdim=True))
model = Line()
trainer = L.Trainer(
    max_epochs=2,
    accelerator="cpu",
    logger=False,
    enable_model_summary=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
    callbacks=[L.pytorch.callbacks.ModelCheckpoint(monitor="val_loss")],
)
trainer.fit(model, DataLoader(data, batch_size=16, shuffle=True), DataLoader(data, batch_size=32))
val_results = trainer.validate(model, DataLoader(data, batch_size=32), ckpt_path="best", verbose=False)
