"""ddp_fork and ddp_spawn fits whose rank 1 is killed or raises, then a fit that succeeds, in one process; prints
one JSON line of what the caller saw (for test_ddp_started_failures.py)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime import WorkerFailedError
from gpulayer.runtime.testing import descendants


class Regression(gl.Module):
    def __init__(self, raise_at=None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.raise_at = raise_at

    def training_step(self, batch, batch_idx):
        if self.raise_at == batch_idx and self.trainer.global_rank == 1:
            raise RuntimeError(f"injected failure on rank 1 at batch {batch_idx}")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class KillRank1(gl.Callback):
    """Records each rank's pid; SIGKILLs rank 1 at the end of batch ``at``."""

    def __init__(self, folder, at):
        self.folder, self.at = folder, at

    def on_fit_start(self, trainer, module):
        with open(os.path.join(self.folder, f"pid{trainer.global_rank}"), "w") as file:
            file.write(str(os.getpid()))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.at == batch_idx and trainer.global_rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)


def loader():
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def fit(folder, strategy, module, callbacks=()):
    trainer = gl.Trainer(
        strategy=strategy, devices=2, accelerator="cpu", max_epochs=2, callbacks=list(callbacks), logger=False,
        enable_checkpointing=False, default_root_dir=folder,
    )  # fmt: skip
    started = time.monotonic()
    try:
        trainer.fit(module, loader())
    except WorkerFailedError as error:
        cause = error.__cause__
        return {
            "rank": error.rank,
            "exitcode": error.exitcode,
            "cause": None if cause is None else f"{type(cause).__name__}: {cause}",
            "status": str(trainer.state.status.value),
            "seconds": time.monotonic() - started,
        }
    return {"global_step": trainer.global_step, "status": str(trainer.state.status.value)}


def main(folder):
    seen = {
        "killed": fit(folder, "ddp_fork", Regression(), [KillRank1(folder, at=2)]),
        "raised": fit(folder, "ddp_spawn", Regression(raise_at=1)),
        "after": fit(folder, "ddp_fork", Regression()),
    }
    seen["pids"] = {path.name: int(path.read_text()) for path in Path(folder).glob("pid*")}
    seen["left"] = [
        pid for pid in descendants(os.getpid()) if "resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_text()
    ]
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
