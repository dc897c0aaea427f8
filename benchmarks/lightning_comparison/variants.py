"""The variants, each training a workload for a number of steps and timing its steady state the same way.

Every variant calls ``clock.tick(i)`` at the start of step ``i``. The clock keeps the time of two steps, the
first after warm-up and the last, so setup, warm-up and teardown are left out and each variant's figure is its
time per step while training. All variants take the same batches in the same order with SGD, on the same device
(``cpu`` or ``cuda``) at the same precision (``32-true``, or ``bf16-mixed``: bf16 autocast around the forward pass
and the loss, fp32 weights, no gradient scaler). The batches start on the CPU and each variant moves them.

- ``raw``: the loop a PyTorch user writes by hand (under DDP: the model wrapped in DistributedDataParallel);
- ``raw_lightning_order``: the same loop in Lightning's order of a step: ``optimizer.step(closure)``, the closure
  running the forward pass, then ``zero_grad``, then ``backward``. A trainer that keeps Lightning's hook order
  (``training_step`` before ``optimizer_zero_grad``) cannot go below it; the gap to ``raw`` is the order's cost;
- ``gpulayer``: GPUlayer's Trainer without logger, checkpoints or log line, as the raw loop writes and prints
  nothing (the same switches as ``lightning``'s);
- ``gpulayer_async_save``: ``gpulayer`` with its checkpoints written in the background
  (``SingleDeviceStrategy(async_save=True)``); run on the default-install workloads only, the ones that checkpoint;
- ``lightning``: Lightning 2.6 with its progress bar, model summary, logger and checkpoints off;
- ``lightning_defaults``: Lightning 2.6 as most users run it (progress bar, summary, CSV logger, checkpoints);
- ``raw_ema``, ``gpulayer_ema``, ``lightning_ema`` (the MLP and the transformer only): ``raw_lightning_order``,
  ``gpulayer`` and ``lightning`` with an exponential moving average of the weights updated after every optimizer
  step (decay 0.999) and copied into the model when training ends: by hand (``RawEMA``: one
  ``torch._foreach_lerp_``), and with each trainer's ``EMAWeightAveraging()``. Their final losses are checked
  against ``raw_ema``'s.

On the ``default_install`` workloads each variant also does that workload's extra work (``default_install.py``):
the trainers with their default checkpoint and CSV logger on, the raw loops by hand.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch
from default_install import RawDefaultInstall, callbacks, configure_optimizers, counted_batches
from workloads import EMA_VARIANTS, Workload, adversarial_step, optimizers_of

VARIANTS = (
    "raw",
    "raw_lightning_order",
    "gpulayer",
    "gpulayer_async_save",
    "lightning",
    "lightning_defaults",
    *EMA_VARIANTS,
)
EMA_DECAY = 0.999  # EMAWeightAveraging's default
LOG_EVERY_N_STEPS = 50  # both trainers' default: steps (batch_idx + 1) % 50 == 0 gather and emit the logged values


class Clock:
    """The time at the start of two steps: ``first`` (after warm-up) and ``last``.

    On CUDA it waits for the queued kernels at those two marks only: a wait on every step would time a loop that
    never lets the CPU run ahead of the GPU.
    """

    def __init__(self, steps: int, device: str = "cpu") -> None:
        self.first, self.last = max(2, steps // 10), steps - 1
        self.marks: list[float] = []
        self.log_call_ns: list[float] = []
        self._synchronize = torch.cuda.synchronize if device == "cuda" else None

    def tick(self, step: int) -> None:
        if step == self.first or step == self.last:
            if self._synchronize is not None:
                self._synchronize()
            self.marks.append(time.perf_counter())

    def seconds_per_step(self) -> float:
        start, end = self.marks
        return (end - start) / (self.last - self.first)

    def logged(self, step: int, nanoseconds: int, calls: int) -> None:
        """The time ``calls`` ``self.log`` calls took in ``step``, kept for a timed step that is not a log step."""
        if self.first <= step < self.last and (step + 1) % LOG_EVERY_N_STEPS:
            self.log_call_ns.append(nanoseconds / calls)

    def seconds_per_log_call(self) -> float | None:
        return statistics.median(self.log_call_ns) / 1e9 if self.log_call_ns else None


class FirstStepClock(Clock):
    """The wall-clock time (``time.time``) at which the first step has ended, i.e. the second one starts."""

    def tick(self, step: int) -> None:
        if step == 1:
            self.marks.append(time.time())


def train(
    variant: str,
    workload: Workload,
    batches: list,
    distributed: bool,
    clock: Clock | None = None,
    device: str = "cpu",
    precision: str = "32-true",
    devices: int | None = None,
) -> float:
    """One fit with ``variant``; ``clock`` (default: a new ``Clock``) holds its timings. Returns the final loss.

    ``devices``: what the trainers are given (default: the launcher's ``LOCAL_WORLD_SIZE`` when ``distributed``,
    else 1); more than the processes running makes each trainer start its own (a script run with ``devices=2``).
    """
    clock = clock if clock is not None else Clock(len(batches) * workload.epochs, device)
    if devices is None:
        devices = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if distributed else 1
    if variant.startswith("raw"):
        lightning_order = variant in ("raw_lightning_order", "raw_ema")
        net = _raw(workload, batches, clock, distributed, device, precision, lightning_order, variant == "raw_ema")
    else:
        net = _trainer(variant, workload, batches, clock, devices, device, precision)
    return workload.final_loss(net, batches, device)


def _raw(
    workload: Workload,
    batches: list,
    clock: Clock,
    distributed: bool,
    device: str,
    precision: str,
    lightning_order: bool,
    ema: bool = False,
) -> torch.nn.Module:
    net = workload.seeded_net().to(device)
    average = RawEMA(net) if ema else None
    model = torch.nn.parallel.DistributedDataParallel(net) if distributed else net
    optimizer = torch.optim.SGD(net.parameters(), lr=workload.lr)
    mixed = torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()
    moves = device != "cpu"  # as the trainers: they move each batch on CUDA and hand it on as it is on the CPU
    optimizers = optimizers_of(net, workload.lr) if workload.adversarial else None
    metric = workload.make_metric() if workload.make_metric is not None else None
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    with tempfile.TemporaryDirectory() as root:
        install = RawDefaultInstall(root, net, optimizer, workload.batch_hook) if workload.default_install else None
        for epoch in range(workload.epochs):
            if install is not None:
                install.epoch_start(epoch, epoch * len(batches))
            for step, (inputs, targets) in enumerate(loader, epoch * len(batches)):
                clock.tick(step)
                if moves:
                    inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                if optimizers is not None:  # the user's own step either way: Lightning's order does not apply
                    adversarial_step(net, optimizers, (inputs, targets), torch.Tensor.backward, mixed)
                    continue
                if lightning_order:
                    loss = _step_in_lightning_order(workload, model, optimizer, (inputs, targets), mixed, metric)
                else:
                    optimizer.zero_grad()
                    with mixed:
                        loss, _ = workload.step(model, (inputs, targets), metric)  # what a trainer would log
                    loss.backward()
                    optimizer.step()
                if average is not None:
                    average.update()
                if install is not None:
                    if (step + 1) % LOG_EVERY_N_STEPS == 0:
                        install.rows.append((epoch, step, loss.detach()))
                    if install.on_batch_end is not None:
                        install.on_batch_end(loss, (inputs, targets), step)
            if install is not None:
                install.epoch_end(epoch, step)
    if average is not None:
        average.copy_to_model()
    _check_batches_counted(install.batches if install is not None else None, workload, batches, "raw")
    return net


class RawEMA:
    """The EMA a user writes by hand, for ``raw_ema``: after each optimizer step one ``torch._foreach_lerp_`` of the
    averages towards the parameters (the first step copies them, as the callbacks' first update does), and the
    averages copied into the model at the end. Buffers are left as they are: a lerp would turn the transformer's
    ``-inf`` mask into NaN, and the callbacks' average of a constant buffer is that constant."""

    def __init__(self, net: torch.nn.Module) -> None:
        self.parameters = list(net.parameters())
        self.averages = [parameter.detach().clone() for parameter in self.parameters]
        self.first = True

    @torch.no_grad()
    def update(self) -> None:
        if self.first:
            torch._foreach_copy_(self.averages, self.parameters)
            self.first = False
        else:
            torch._foreach_lerp_(self.averages, self.parameters, 1 - EMA_DECAY)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        torch._foreach_copy_(self.parameters, self.averages)


def _step_in_lightning_order(
    workload: Workload, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: tuple, mixed: Any, metric: Any
) -> torch.Tensor:
    def closure() -> torch.Tensor:
        with mixed:
            loss, _ = workload.step(model, batch, metric)
        optimizer.zero_grad()
        loss.backward()
        return loss

    return optimizer.step(closure)


def _check_batches_counted(counted: int | None, workload: Workload, batches: list, variant: str) -> None:
    """With a batch hook, it must have run once per batch: a loop that skipped it did less work."""
    expected = len(batches) * workload.epochs
    if workload.batch_hook and counted != expected:
        raise RuntimeError(f"{variant}'s on_train_batch_end ran for {counted} batches, not {expected}")


def _trainer(
    variant: str, workload: Workload, batches: list, clock: Clock, devices: int, device: str, precision: str
) -> torch.nn.Module:
    # Both trainers' lean variants turn off what writes or prints (logger, checkpoints, progress output: GPUlayer's
    # log line, Lightning's bar), as the raw loop writes and prints nothing.
    lean = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    if workload.default_install:  # their checkpoint and CSV logger stay on, their progress output stays off
        framework = "gpulayer" if variant.startswith("gpulayer") else "lightning"
        lean = {"enable_progress_bar": False, "callbacks": callbacks(framework, workload.batch_hook)}
    make_logger = None  # the logger made in the fit's folder, where the trainer's default is not wanted
    if variant.startswith("gpulayer"):
        from gpulayer.trainer import Module, SingleDeviceStrategy, Trainer

        options: dict[str, Any] = lean
        if variant == "gpulayer_async_save":
            options = {**lean, "strategy": SingleDeviceStrategy(async_save=True)}
    else:
        from lightning.pytorch import LightningModule as Module
        from lightning.pytorch import Trainer

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # "GPU available: False", tips
        logging.getLogger("lightning.fabric").setLevel(logging.ERROR)  # the tip to enable TF32 on CUDA
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*")  # torch deprecates an isinstance check Lightning makes
        options = {**lean, "enable_model_summary": False} if variant in ("lightning", "lightning_ema") else {}
        if workload.default_install:  # Lightning's default logger is TensorBoard's where tensorboard is installed
            from lightning.pytorch.loggers import CSVLogger as make_logger
    if variant.endswith("_ema"):
        if variant.startswith("gpulayer"):
            from gpulayer.callbacks.weight_averaging import EMAWeightAveraging
        else:
            from lightning.pytorch.callbacks import EMAWeightAveraging
        options = {**options, "callbacks": [EMAWeightAveraging(decay=EMA_DECAY)]}
    steps = itertools.count()  # the fit's step, over its epochs

    class Bench(Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = workload.seeded_net()
            self.automatic_optimization = not workload.adversarial
            self.metric = workload.make_metric() if workload.make_metric is not None else None

        def training_step(self, batch, batch_idx):
            step = next(steps)
            clock.tick(step)
            if workload.adversarial:  # the trainer's autocast, if any, is around the whole step
                loss = adversarial_step(
                    self.net, self.optimizers(), batch, self.manual_backward, contextlib.nullcontext()
                )
                calls = [("loss", loss, {})]
            else:
                loss, calls = workload.step(self.net, batch, self.metric)
            started = time.perf_counter_ns()
            for name, value, options in calls:  # the loss at least, as a real module does
                self.log(name, value, **options)
            clock.logged(step, time.perf_counter_ns() - started, len(calls))
            return loss

        def configure_optimizers(self):
            if workload.adversarial:
                return optimizers_of(self.net, workload.lr)
            if workload.default_install:
                return configure_optimizers(self.parameters(), workload.lr)
            return torch.optim.SGD(self.parameters(), lr=workload.lr)

    model = Bench()
    with tempfile.TemporaryDirectory() as root, _quiet():
        if make_logger is not None:
            options["logger"] = make_logger(root)
        trainer = Trainer(
            accelerator=device,
            devices=devices,
            precision=precision,
            # cuDNN autotuning is process-wide, and GPUlayer turns it on for fits of 1,000 steps or more: off for all,
            # every variant runs the same convolution kernels.
            benchmark=False,
            max_epochs=workload.epochs,
            num_sanity_val_steps=0,
            use_distributed_sampler=False,  # each rank's batches are already its own
            default_root_dir=root,
            **options,
        )
        trainer.fit(model, torch.utils.data.DataLoader(batches, batch_size=None))
    expected = len(batches) * workload.epochs * (2 if workload.adversarial else 1)  # manual: each step() counts
    if trainer.global_step != expected:
        raise RuntimeError(f"{variant} ran {trainer.global_step} steps, not {expected}")
    _check_batches_counted(counted_batches(options.get("callbacks", [])), workload, batches, variant)
    return model.net


@contextlib.contextmanager
def _quiet():
    """Progress bars and log lines go nowhere: their cost is measured, their output is not wanted."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield
