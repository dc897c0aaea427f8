"""A tiny DDP training job that injects one fault at a precise point, run as a user runs a script.

    python _faults_script.py OUT [KEY=VALUE ...]

``devices=2`` makes the Trainer re-run this script under ``gpulayer launch`` (the first process becomes the
agent). Each rank writes ``OUT/pid<R>`` on starting; the rank that injects the fault writes ``OUT/fault_time``
(``time.time()``) just before it; a rank that finishes writes ``OUT/rank<R>.pt``. Faults (see ``OPTIONS``):

- ``raise_in_training_step``, ``raise_in_validation_step``, ``raise_in_callback`` (a Callback's
  ``on_train_batch_end``), ``raise_in_checkpoint_save`` (the module's ``on_save_checkpoint`` while
  ModelCheckpoint saves): a RuntimeError naming the rank;
- ``raise_and_linger``: the RuntimeError in ``training_step``, then an exit that waits (in an atexit handler) for
  the agent's SIGTERM, so that the peer, whose all-reduce times out, dies first (with ``manual=True`` that
  all-reduce is in the peer's ``manual_backward``);
- ``sigkill``: the rank SIGKILLs itself inside ``training_step``;
- ``desync``: the rank enters ``trainer.runtime.barrier()`` (at ``DESYNC_LINE``) that its peer skips;
- ``kill_during_save``: global rank 0 writes half of its second checkpoint, then SIGKILLs itself. ``torch.save``
  is wrapped here, in user code: the Trainer's ``save_atomic`` calls it to write its temporary file;
- ``sigterm``: the rank sends SIGTERM to the launcher (its parent), as Slurm or Kubernetes would;
- ``crash_once``: a RuntimeError in ``training_step``, in the first run only (restart count 0), for a launcher
  started with ``--max-restarts 1``.
"""

from __future__ import annotations

import ast
import atexit
import hashlib
import io
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks import ModelCheckpoint

FAULTS = (
    None,
    "raise_in_training_step",
    "raise_and_linger",
    "raise_in_validation_step",
    "raise_in_callback",
    "raise_in_checkpoint_save",
    "sigkill",
    "desync",
    "kill_during_save",
    "sigterm",
    "crash_once",
)
OPTIONS = {
    "fault": None,
    "rank": 1,  # the global rank that injects the fault
    "batch": 3,  # ... at this batch_idx (training or validation) of ...
    "epoch": 0,  # ... this epoch
    "devices": 2,
    "max_epochs": 2,
    "timeout": 30.0,  # DDPStrategy(timeout=...), seconds: bounds every collective
    "ckpt_path": None,  # resume from this checkpoint ("last" or a path)
    "manual": False,  # manual optimization: training_step steps the optimizer (manual_backward, step)
}
SAMPLES = 32  # batches of 4 on 2 ranks: 4 training batches per rank and epoch, 2 validation batches
SAVE_EVERY_N_STEPS = 4
_save = torch.save  # the real one, for this script's own records


def main() -> None:
    out, pairs = Path(sys.argv[1]), sys.argv[2:]
    options = dict(OPTIONS)
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in options:
            raise SystemExit(f"unknown option {key!r}")
        options[key] = ast.literal_eval(value)
    if options["fault"] not in FAULTS:
        raise SystemExit(f"fault={options['fault']!r}: one of {FAULTS}")
    if "RANK" in os.environ:  # a rank the launcher started: the test checks that none outlives the job
        out.mkdir(parents=True, exist_ok=True)
        written = out / f".pid{os.environ['RANK']}"  # then renamed: a reader never sees half a pid
        written.write_text(str(os.getpid()))
        written.replace(out / f"pid{os.environ['RANK']}")
    run(out, SimpleNamespace(**options))


def run(out: Path, o: SimpleNamespace) -> None:
    gl.seed_everything(1234, verbose=False)
    generator = torch.Generator().manual_seed(99)
    x = torch.randn(SAMPLES, 6, generator=generator)
    y = x @ torch.randn(6, 1, generator=generator)
    starts: list[int] = []

    def here(trainer: gl.Trainer, batch_idx: int) -> bool:
        """True on the faulty rank at the chosen batch (never in the sanity check)."""
        chosen = (o.rank, o.epoch, o.batch)
        return not trainer.sanity_checking and (trainer.global_rank, trainer.current_epoch, batch_idx) == chosen

    def injecting(what: str) -> None:
        (out / "fault_time").write_text(repr(time.time()))
        print(f"injecting {what} on rank {o.rank}", file=sys.stderr, flush=True)

    class Model(gl.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
            self.automatic_optimization = not o.manual

        def on_train_start(self) -> None:
            starts.append(self.trainer.global_step)

        def training_step(self, batch, batch_idx):
            inputs, target = batch
            trainer = self.trainer
            if o.fault == "raise_in_training_step" and here(trainer, batch_idx):
                injecting(o.fault)
                raise RuntimeError(f"injected fault in training_step on rank {o.rank}")
            if o.fault == "raise_and_linger" and here(trainer, batch_idx):
                injecting(o.fault)
                atexit.register(_wait_for_the_agent)
                raise RuntimeError(f"injected fault in training_step on rank {o.rank}")
            if o.fault == "sigkill" and here(trainer, batch_idx):
                injecting(o.fault)
                os.kill(os.getpid(), signal.SIGKILL)
            if o.fault == "sigterm" and here(trainer, batch_idx):
                injecting(o.fault)
                os.kill(os.getppid(), signal.SIGTERM)
            if o.fault == "crash_once" and here(trainer, batch_idx) and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
                injecting(o.fault)
                raise RuntimeError(f"injected fault in training_step on rank {o.rank}, before any restart")
            if o.fault == "desync" and here(trainer, batch_idx):
                injecting(o.fault)
                trainer.runtime.barrier()  # DESYNC_LINE: the peer skips this collective
            loss = F.mse_loss(self.net(inputs), target)
            if o.manual:
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
            return loss

        def validation_step(self, batch, batch_idx):
            inputs, target = batch
            if o.fault == "raise_in_validation_step" and here(self.trainer, batch_idx):
                injecting(o.fault)
                raise RuntimeError(f"injected fault in validation_step on rank {o.rank}")
            self.log("val_loss", F.mse_loss(self.net(inputs), target))

        def on_save_checkpoint(self, checkpoint):
            trainer = self.trainer
            first_save = trainer.global_step == SAVE_EVERY_N_STEPS
            if o.fault == "raise_in_checkpoint_save" and trainer.global_rank == o.rank and first_save:
                injecting(o.fault)
                raise RuntimeError(f"injected fault in on_save_checkpoint on rank {o.rank}")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Faulty(gl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if o.fault == "raise_in_callback" and here(trainer, batch_idx):
                injecting(o.fault)
                raise RuntimeError(f"injected fault in on_train_batch_end on rank {o.rank}")

    if o.fault == "kill_during_save":
        torch.save = _half_then_sigkill(out, injecting)
    checkpoints = ModelCheckpoint(
        dirpath=out / "checkpoints", save_top_k=0, save_last=True, every_n_train_steps=SAVE_EVERY_N_STEPS
    )
    trainer = gl.Trainer(
        accelerator="cpu",
        devices=o.devices,
        strategy=gl.DDPStrategy(timeout=o.timeout),
        max_epochs=o.max_epochs,
        callbacks=[checkpoints, Faulty()],
        logger=False,
        default_root_dir=str(out),
    )
    dataset = TensorDataset(x, y)
    model = Model()
    trainer.fit(
        model,
        DataLoader(dataset, batch_size=4, shuffle=True),
        DataLoader(TensorDataset(x[: SAMPLES // 2], y[: SAMPLES // 2]), batch_size=4),
        ckpt_path=o.ckpt_path,
    )
    record = {
        "global_step": trainer.global_step,
        "started_at_step": starts,
        "current_epoch": trainer.current_epoch,
        "weights": model.state_dict(),
    }
    _save(record, out / f"rank{trainer.global_rank}.pt")


def _wait_for_the_agent() -> None:
    signal.pause()  # until the agent, having seen the peer fail, stops this rank with SIGTERM


def _half_then_sigkill(out: Path, injecting):
    """``torch.save`` that writes the first checkpoint in full and half of the second, then kills the process."""
    saves = []

    def save(obj, f, *args, **kwargs):
        saves.append(f)
        if len(saves) < 2:
            return _save(obj, f, *args, **kwargs)
        last = out / "checkpoints" / "last.ckpt"
        (out / "before_kill.sha256").write_text(hashlib.sha256(last.read_bytes()).hexdigest())
        data = io.BytesIO()
        _save(obj, data, *args, **kwargs)
        f.write(data.getbuffer()[: len(data.getbuffer()) // 2])
        f.flush()
        os.fsync(f.fileno())
        injecting("kill_during_save")
        os.kill(os.getpid(), signal.SIGKILL)
        return None

    return save


if __name__ == "__main__":
    main()
