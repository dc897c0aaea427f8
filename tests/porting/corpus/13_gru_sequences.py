"""A GRU classifying generated sequences by whether their running sum ever goes above a threshold."""

import os

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class SequenceClassifier(LightningModule):
    def __init__(self, hidden: int = 24, lr: float = 1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.gru = nn.GRU(input_size=1, hidden_size=hidden, batch_first=True)
        self.head = nn.Linear(hidden, 2)

    def forward(self, sequences):
        _, last = self.gru(sequences)
        return self.head(last[-1])

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)]


seed_everything(12)
generator = torch.Generator().manual_seed(0)
steps = torch.randn(360, 20, 1, generator=generator)
labels = (steps.cumsum(dim=1).amax(dim=(1, 2)) > 3).long()
model = SequenceClassifier()
trainer = Trainer(
    max_epochs=4,
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(
    model,
    DataLoader(TensorDataset(steps[:300], labels[:300]), batch_size=30, shuffle=True),
    DataLoader(TensorDataset(steps[300:], labels[300:]), batch_size=30),
)
