"""One training script, run under Lightning 2.6 or GPUlayer with any placement the test chooses.

    python train_script.py FRAMEWORK OUT [KEY=VALUE ...]

Each rank writes ``OUT/rank<R>.pt``: its weights, ``global_step``, ``current_epoch``, ``callback_metrics``, the
batches it trained on, and what the scenario asked to record. KEY=VALUE pairs are the scenario (see ``OPTIONS``).
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

OPTIONS = {
    "devices": 2,  # processes per node
    "num_nodes": 1,
    "samples": 64,  # training samples (validation: half as many)
    "batch_size": 4,
    "max_epochs": 2,
    "max_steps": -1,
    "max_time": None,  # seconds
    "accumulate": 1,
    "clip": None,
    "sync": False,  # log the sync_dist=True metrics as well
    "shuffle": True,
    "use_distributed_sampler": True,
    "log_every_n_steps": 2,
    "uneven": 0,  # rank 1 gets this many batches fewer (use_distributed_sampler=False shards)
    "stop_rank": None,  # sets trainer.should_stop in training_step on this rank ...
    "stop_step": None,  # ... at this global step
    "fail_rank": None,  # raises in training_step on this rank ...
    "fail_step": None,  # ... at this global step
    "early_stopping_rank": None,  # EarlyStopping whose metric stops improving on this rank only
    "logger": False,
    "checkpoint": False,
    "root": None,  # default_root_dir
    "ckpt_path": None,  # resume from this checkpoint
    "save": None,  # save a checkpoint here when fit ends
    "step_seconds": 0.0,  # busy-wait per training step (for max_time)
    "skip_rank": None,  # on_train_batch_start returns -1 (ends the epoch) on this rank ...
    "skip_batch": None,  # ... at this batch_idx of the first epoch; unset, the hook is not overridden
    "manual": False,  # manual optimization: each layer its optimizer, toggled, one backward each per step
    "manual_accumulate": 0,  # manual optimization accumulating this many batches by hand, without gradient sync
    # on the batches that do not step (strategy.block_backward_sync); the record counts DDP's reductions
    "strategy": "auto",
    "async_save": False,  # GPUlayer: strategy=DDPStrategy(async_save=True)
    "profiler": None,  # a SimpleProfiler with this filename, writing fit-{filename}-{local rank}.txt to the out folder
}


def main() -> None:
    name, out, pairs = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    options = dict(OPTIONS)
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in options:
            raise SystemExit(f"unknown option {key!r}")
        options[key] = ast.literal_eval(value) if value[:1] not in "/" else value
    if "RANK" in os.environ:  # a rank a launcher started: tests check that no process of the job outlives it
        out.mkdir(parents=True, exist_ok=True)
        (out / f"pid{os.environ['RANK']}").write_text(str(os.getpid()))
    run(_framework(name), name, out, SimpleNamespace(**options))


def _framework(name: str) -> SimpleNamespace:
    if name == "lightning":
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import EarlyStopping

        return SimpleNamespace(
            Module=pl.LightningModule,
            Trainer=pl.Trainer,
            seed=pl.seed_everything,
            EarlyStopping=EarlyStopping,
            SimpleProfiler=pl.profilers.SimpleProfiler,
        )
    import gpulayer.trainer as gl
    from gpulayer.callbacks import EarlyStopping

    if name == "gpulayer-lightning-module":  # GPUlayer's Trainer, the module on Lightning's class as a library's
        import lightning.pytorch as pl

    return SimpleNamespace(
        Module=pl.LightningModule if name == "gpulayer-lightning-module" else gl.Module,
        Trainer=gl.Trainer,
        seed=gl.seed_everything,
        EarlyStopping=EarlyStopping,
        DDPStrategy=gl.DDPStrategy,
        SimpleProfiler=gl.SimpleProfiler,
    )


def run(fw: SimpleNamespace, name: str, out: Path, o: SimpleNamespace) -> None:
    fw.seed(1234, verbose=False)
    generator = torch.Generator().manual_seed(99)
    x = torch.randn(o.samples, 6, generator=generator)
    y = x @ torch.randn(6, 1, generator=generator) + 0.1 * torch.randn(o.samples, 1, generator=generator)
    seen: list[list[int]] = []

    class Model(fw.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            index, inputs, target = batch
            seen.append(index.tolist())
            trainer, rank = self.trainer, self.trainer.global_rank
            if o.fail_rank == rank and trainer.global_step == o.fail_step:
                raise RuntimeError(f"injected failure on rank {rank} at step {trainer.global_step}")
            if o.stop_rank == rank and trainer.global_step == o.stop_step:
                trainer.should_stop = True
            busy_until = _now() + o.step_seconds
            while _now() < busy_until:
                pass
            if o.manual_accumulate:
                loss = F.mse_loss(self.net(inputs), target)
                steps = (batch_idx + 1) % o.manual_accumulate == 0
                with contextlib.nullcontext() if steps else trainer.strategy.block_backward_sync():
                    self.manual_backward(loss / o.manual_accumulate)
                if steps:
                    for optimizer in self.optimizers():
                        optimizer.step()
                        optimizer.zero_grad()
            elif o.manual:
                for optimizer in self.optimizers():
                    with self.toggled_optimizer(optimizer):
                        loss = F.mse_loss(self.net(inputs), target)
                        optimizer.zero_grad()
                        self.manual_backward(loss)
                        optimizer.step()
            else:
                loss = F.mse_loss(self.net(inputs), target)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            if o.sync:
                self.log("train_loss_sync", loss, on_step=True, on_epoch=True, sync_dist=True)
                self.log("train_max_sync", loss, on_epoch=True, reduce_fx="max", sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            _, inputs, target = batch
            loss = F.mse_loss(self.net(inputs), target)
            self.log("val_loss", loss)
            if o.sync:
                self.log("val_loss_sync", loss, sync_dist=True)
            if o.early_stopping_rank is not None:
                worse = float(self.trainer.global_rank == o.early_stopping_rank) * self.trainer.current_epoch
                self.log("watched", torch.tensor(10.0 - self.trainer.current_epoch + 20 * worse))

        def on_train_start(self):
            if o.manual_accumulate:
                self.reductions = 0

                def counting(state, bucket):
                    self.reductions += 1
                    return allreduce_hook(state, bucket)

                self.trainer.strategy.model.register_comm_hook(None, counting)

        def configure_optimizers(self):
            if o.manual or o.manual_accumulate:
                first, last = self.net[0].parameters(), self.net[2].parameters()
                return [torch.optim.SGD(first, lr=0.05, momentum=0.9), torch.optim.Adam(last, lr=0.01)]
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    class SkippingModel(Model):
        def on_train_batch_start(self, batch, batch_idx):
            trainer = self.trainer
            if (trainer.global_rank, trainer.current_epoch, batch_idx) == (o.skip_rank, 0, o.skip_batch):
                return -1
            return None

    dataset = TensorDataset(torch.arange(o.samples), x, y)
    val = TensorDataset(torch.arange(o.samples // 2), x[: o.samples // 2], y[: o.samples // 2])
    if not o.use_distributed_sampler:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        shard = list(range(rank, o.samples, world))
        if rank == 1 and o.uneven:
            shard = shard[: len(shard) - o.uneven * o.batch_size]
        dataset = torch.utils.data.Subset(dataset, shard)
    callbacks = []
    if o.early_stopping_rank is not None:
        callbacks.append(fw.EarlyStopping(monitor="watched", patience=0))
    trainer = fw.Trainer(
        accelerator="cpu",
        devices=o.devices,
        num_nodes=o.num_nodes,
        strategy=fw.DDPStrategy(async_save=True) if o.async_save else o.strategy,
        max_epochs=o.max_epochs,
        max_steps=o.max_steps,
        max_time=None if o.max_time is None else {"seconds": o.max_time},
        accumulate_grad_batches=o.accumulate,
        gradient_clip_val=o.clip,
        use_distributed_sampler=o.use_distributed_sampler,
        log_every_n_steps=o.log_every_n_steps,
        logger=o.logger,
        enable_checkpointing=o.checkpoint,
        default_root_dir=o.root,
        callbacks=callbacks,
        profiler=None if o.profiler is None else fw.SimpleProfiler(dirpath=str(out), filename=o.profiler),
        **({"enable_progress_bar": False, "enable_model_summary": False} if name == "lightning" else {}),
    )
    model = Model() if o.skip_rank is None else SkippingModel()
    model.automatic_optimization = not (o.manual or o.manual_accumulate)
    trainer.fit(
        model,
        DataLoader(dataset, batch_size=o.batch_size, shuffle=o.shuffle),
        DataLoader(val, batch_size=o.batch_size),
        ckpt_path=o.ckpt_path,
    )
    if o.save:
        trainer.save_checkpoint(o.save)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "should_stop": trainer.should_stop,
        "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "seen": seen,
        "world_size": trainer.world_size,
        "reductions": getattr(model, "reductions", None),
        "profiled": sorted(trainer.profiler.recorded_durations) if o.profiler else None,
        "log_dir": trainer.log_dir,
        "placed_by": runtime.placement.source if (runtime := getattr(trainer, "runtime", None)) else None,  # GPUlayer
    }
    torch.save(record, out / f"rank{trainer.global_rank}.pt")
    if torch.distributed.is_initialized():  # Lightning leaves its gloo group to the exit, which can abort the process
        torch.distributed.destroy_process_group()


def _now() -> float:
    import time

    return time.perf_counter()


if __name__ == "__main__":
    main()
