"""A Hydra research project's entry point: ``@hydra.main`` composes ``configs/hydra_project.yaml``, and the Trainer,
its callbacks and its logger are built from the config with ``hydra.utils.instantiate``."""

import hydra
import torch
from hydra.utils import instantiate
from lightning.pytorch import LightningModule, seed_everything
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

trainer = model = None  # set by main, for whoever runs this file


class Regressor(LightningModule):
    def __init__(self, hidden: int, lr: float):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.8)}


def loaders(samples: int, batch_size: int):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 6, generator=generator)
    y = x[:, :1] * 0.5 - x[:, 1:2] + 0.1 * torch.randn(samples, 1, generator=generator)
    split = samples * 3 // 4
    train = DataLoader(TensorDataset(x[:split], y[:split]), batch_size=batch_size, shuffle=True)
    return train, DataLoader(TensorDataset(x[split:], y[split:]), batch_size=batch_size)


@hydra.main(version_base="1.3", config_path="configs", config_name="hydra_project")
def main(config: DictConfig) -> None:
    global trainer, model
    seed_everything(config.seed)
    model = Regressor(**config.model)
    callbacks = [instantiate(callback) for callback in config.callbacks]
    trainer = instantiate(config.trainer, callbacks=callbacks, logger=instantiate(config.logger))
    trainer.fit(model, *loaders(config.data.samples, config.data.batch_size))


if __name__ == "__main__":
    main()
