"""Custom callbacks: one logs the gradient norm through the module, one counts batches and stops training once
the validation loss is low enough, one keeps a history in its state."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class GradientNorm(Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in pl_module.parameters()]))
        pl_module.log("grad_norm", norm, on_step=True, on_epoch=False)


class StopWhenGoodEnough(Callback):
    def __init__(self, threshold: float):
        self.threshold = threshold
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking and trainer.callback_metrics["val_loss"] < self.threshold:
            trainer.should_stop = True


class History(Callback):
    def __init__(self):
        self.val_losses = []

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.val_losses.append(float(trainer.callback_metrics["val_loss"]))

    def state_dict(self):
        return {"val_losses": self.val_losses}

    def load_state_dict(self, state_dict):
        self.val_losses = state_dict["val_losses"]


class Linear(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(5, 1)

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


seed_everything(2)
generator = torch.Generator().manual_seed(0)
x = torch.randn(200, 5, generator=generator)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0], [3.0]]) + 0.01 * torch.randn(200, 1, generator=generator)
stopper, history = StopWhenGoodEnough(threshold=0.05), History()
model = Linear()
trainer = Trainer(
    max_epochs=20,
    accelerator="cpu",
    callbacks=[GradientNorm(), stopper, history],
    logger=False,
    enable_checkpointing=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(
    model,
    DataLoader(TensorDataset(x[:160], y[:160]), batch_size=16),
    DataLoader(TensorDataset(x[160:], y[160:]), batch_size=40),
)
history_results = {"val_losses": history.val_losses, "batches": stopper.batches}
