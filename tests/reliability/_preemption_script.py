"""A short fit that may send itself SIGTERM at a batch: ``python _preemption_script.py ROOT [sigterm_at] [ckpt]``."""

import os
import signal
import sys

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl


class Regression(gl.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class SigtermAt(gl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    root, sigterm_at, ckpt_path = sys.argv[1], int(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else None)
    gl.seed_everything(0)
    inputs = torch.randn(64, 4)
    data = DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True)), batch_size=8, shuffle=True)
    model = Regression()
    callbacks = [SigtermAt(sigterm_at)] if sigterm_at else []
    trainer = gl.Trainer(
        max_epochs=3, default_root_dir=root, logger=False, enable_checkpointing=False, callbacks=callbacks
    )
    trainer.fit(model, data, ckpt_path=ckpt_path)
    os.makedirs(root, exist_ok=True)
    torch.save({"weights": model.state_dict(), "global_step": trainer.global_step}, os.path.join(root, "final.pt"))


if __name__ == "__main__":
    main()
