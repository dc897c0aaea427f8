"""Your own TensorBoard logger for GPUlayer's Trainer, on torch.utils.tensorboard (`pip install tensorboard`).

python docs/examples/tensorboard_logger.py --root-dir runs   # then: tensorboard --logdir runs
"""

import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter

from gpulayer.trainer import Logger, Module, Trainer, rank_zero_only


class TensorBoardLogger(Logger):
    """Scalars in <save_dir>/<name>/version_N (the next free N), as Lightning's TensorBoardLogger writes them."""

    def __init__(self, save_dir, name="lightning_logs"):
        self._save_dir, self._name, self._writer = save_dir, name, None
        root = os.path.join(save_dir, name)
        taken = os.listdir(root) if os.path.isdir(root) else []
        self._version = max([int(d.split("_")[1]) for d in taken if d.startswith("version_")], default=-1) + 1

    name = property(lambda self: self._name)
    version = property(lambda self: self._version)
    save_dir = property(lambda self: self._save_dir)
    log_dir = property(lambda self: os.path.join(self._save_dir, self._name, f"version_{self._version}"))

    @property
    def experiment(self):  # the SummaryWriter on rank 0 (None elsewhere): self.logger.experiment.add_image(...)
        if self._writer is None and rank_zero_only.rank == 0:
            self._writer = SummaryWriter(self.log_dir)
        return self._writer

    # The Trainer calls a logger on every rank, as Lightning does: these write on rank 0 alone.
    @rank_zero_only
    def log_metrics(self, metrics, step=None):
        for name, value in metrics.items():
            self.experiment.add_scalar(name, value, step)

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs):
        self.experiment.add_text("hparams", "\n".join(f"    {key}: {value}" for key, value in dict(params).items()))

    @rank_zero_only
    def save(self):
        self.experiment.flush()

    @rank_zero_only
    def finalize(self, status):
        if self._writer is not None:
            self._writer.close()


class Regression(Module):
    def __init__(self, lr=0.1):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        if batch_idx == 0 and self.trainer.is_global_zero:
            self.logger.experiment.add_image("weights", self.layer.weight.detach().sigmoid()[None], self.global_step)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--root-dir", default="runs")
    root = parser.parse_args().root_dir
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)
    logger = TensorBoardLogger(root)
    trainer = Trainer(accelerator="cpu", max_epochs=5, log_every_n_steps=4, logger=logger, default_root_dir=root)
    trainer.fit(Regression(), data)
    loss = float(trainer.callback_metrics["train_loss_epoch"])
    print(f"wrote {trainer.logger.log_dir}; last train_loss_epoch {loss:.4f}")
