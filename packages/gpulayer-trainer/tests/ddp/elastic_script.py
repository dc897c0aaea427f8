"""A DDP fit run under ``gpulayer launch``, whose ranks record every step's sample indices, and which can lose a node.

    gpulayer launch ... elastic_script.py OUT [kill_step=N] [ckpt_path=PATH]

48 samples in batches of 2 per rank, 2 epochs, a checkpoint every 3 steps (``OUT/checkpoints``). Each rank appends
``{"step", "epoch", "indices"}`` to ``OUT/steps-<attempt>-<rank>.jsonl`` at every step (``attempt``: the agent's
restart count) and writes ``OUT/start-<attempt>-<rank>.json`` (world size, the step it starts at, the checkpoint it
resumed from) as training starts. ``kill_step``: in the first attempt, local rank 0 of node 1 SIGKILLs its agent
and every process below it (the node is lost) when it reaches that step.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import kill_tree

SAMPLES, BATCH, EPOCHS, SAVE_EVERY_N_STEPS = 48, 2, 2, 3


class Recorded(gl.Module):
    def __init__(self, out: Path, kill_step: int | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)
        self.out, self.kill_step = out, kill_step
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def on_train_start(self) -> None:
        trainer = self.trainer
        start = {"world_size": trainer.world_size, "step": trainer.global_step, "ckpt_path": trainer.ckpt_path}
        (self.out / f"start-{self.attempt}-{trainer.global_rank}.json").write_text(json.dumps(start))

    def training_step(self, batch, batch_idx):
        index, inputs, target = batch
        trainer = self.trainer
        lost_node = os.environ.get("GROUP_RANK") == "1" and trainer.local_rank == 0
        if self.attempt == 0 and lost_node and trainer.global_step == self.kill_step:
            kill_tree(os.getppid())  # the agent, its workers, and this process
        step = {"step": trainer.global_step, "epoch": trainer.current_epoch, "indices": index.tolist()}
        with open(self.out / f"steps-{self.attempt}-{trainer.global_rank}.jsonl", "a") as steps:
            steps.write(json.dumps(step) + "\n")
        return F.mse_loss(self.net(inputs), target)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    # Imported here: the trainer-alone tier collects test_elastic_launch.py, which imports this file.
    from gpulayer.callbacks import ModelCheckpoint

    out, options = Path(sys.argv[1]), dict(pair.split("=", 1) for pair in sys.argv[2:])
    out.mkdir(parents=True, exist_ok=True)
    gl.seed_everything(7, verbose=False)
    inputs = torch.randn(SAMPLES, 3, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(torch.arange(SAMPLES), inputs, inputs.sum(dim=1, keepdim=True))
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    trainer = gl.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=int(os.environ["WORLD_SIZE"]) // per_node,
        strategy="ddp",
        max_epochs=EPOCHS,
        logger=False,
        callbacks=[ModelCheckpoint(out / "checkpoints", every_n_train_steps=SAVE_EVERY_N_STEPS, save_top_k=-1)],
    )
    kill_step = int(options["kill_step"]) if "kill_step" in options else None
    model = Recorded(out, kill_step)
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True), ckpt_path=options.get("ckpt_path"))


if __name__ == "__main__":
    main()
