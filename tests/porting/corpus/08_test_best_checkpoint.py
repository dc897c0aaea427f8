"""Keep the two best checkpoints by validation loss, then test the best one: test(ckpt_path="best")."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(LightningModule):
    def __init__(self, lr: float = 0.2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)  # large: the loss goes up and down


seed_everything(21)
generator = torch.Generator().manual_seed(0)
x = torch.randn(150, 3, generator=generator)
y = torch.sin(x.sum(dim=1, keepdim=True))
out_dir = os.environ.get("OUT_DIR", "runs")
checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=2, filename="{epoch}-{val_loss:.4f}")
model = Net()
trainer = Trainer(max_epochs=6, accelerator="cpu", logger=False, callbacks=[checkpoint], default_root_dir=out_dir)
loader = DataLoader(TensorDataset(x[:100], y[:100]), batch_size=10, shuffle=True)
held_out = DataLoader(TensorDataset(x[100:], y[100:]), batch_size=25)
trainer.fit(model, loader, held_out)
test_results = trainer.test(ckpt_path="best", dataloaders=held_out, verbose=False)
best_results = {"best": os.path.basename(checkpoint.best_model_path), "score": float(checkpoint.best_model_score)}
