"""Per-step overhead of GPUlayer's Trainer and of Lightning's, against a hand-written PyTorch loop, on one CPU thread.

    nox -s bench -- --quick                  # under a minute; without --quick, a few minutes
    python benchmarks/overhead.py [--quick] [--steps N] [--rounds R] [--json results.json]

The model is so small (32 -> 32 -> 1, batch 16) that a step costs almost nothing, so what each trainer adds per
step is what gets measured. Every variant trains the same initial weights on the same batches with SGD for the same
number of steps; the script fails when a variant's final loss differs from the raw loop's (it did other work).
"""

import argparse
import contextlib
import io
import json
import logging
import math
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH_SIZE = 16
WIDTH = 32
LR = 0.01
SEED = 0
LOSS_TOLERANCE = 1e-5


def make_net() -> nn.Module:
    torch.manual_seed(SEED)  # the same initial weights in every variant
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))


def make_data(steps: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(SEED)
    x = torch.randn(steps * BATCH_SIZE, WIDTH, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(steps * BATCH_SIZE, 1, generator=generator)
    return TensorDataset(x, y)


def make_loader(data: TensorDataset) -> DataLoader:
    """The same batches in the same order for every variant, cut in advance so loading costs next to nothing."""
    x, y = data.tensors
    batches = list(zip(x.split(BATCH_SIZE), y.split(BATCH_SIZE), strict=True))
    return DataLoader(batches, batch_size=None)


def final_loss(net: nn.Module, data: TensorDataset) -> float:
    """The trained model's loss on all the data: equal losses mean the variants did the same updates."""
    x, y = data.tensors
    with torch.no_grad():
        return F.mse_loss(net(x), y).item()


def run_raw(data: TensorDataset, steps: int) -> tuple[float, float]:
    """(seconds, final loss) of the loop a PyTorch user writes by hand."""
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    loader = make_loader(data)
    start = time.perf_counter()
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    return seconds, final_loss(net, data)


def module_class(base: type) -> type:
    """The raw loop's model, loss and optimizer as a LightningModule-style class on ``base``."""

    class MLP(base):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.mse_loss(self.net(x), y)
            self.log("loss", loss)  # as a real module does; neither trainer has a logger to write it to
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    return MLP


def trainer_runner(name: str) -> Callable[[TensorDataset, int], tuple[float, float]]:
    """A runner like ``run_raw`` that trains with ``name``'s Trainer; imported here so either may be absent."""
    if name == "gpulayer":
        from gpulayer.trainer import Module, Trainer

        options = {"logger": False}  # as Lightning's row: neither trainer writes metrics.csv here
    else:
        from lightning.pytorch import LightningModule as Module
        from lightning.pytorch import Trainer

        options = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # "GPU available: False", tips
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*")  # torch deprecates an isinstance check Lightning makes
    model_class = module_class(Module)

    def run(data: TensorDataset, steps: int) -> tuple[float, float]:
        model = model_class()
        loader = make_loader(data)
        with tempfile.TemporaryDirectory() as root_dir:
            trainer = Trainer(
                accelerator="cpu",
                devices=1,
                max_epochs=1,
                max_steps=steps,
                num_sanity_val_steps=0,
                log_every_n_steps=50,
                enable_checkpointing=False,
                default_root_dir=root_dir,
                **options,
            )
            # GPUlayer's log line every 50 steps would flood the table; it is still formatted and written.
            with contextlib.redirect_stdout(io.StringIO()):
                start = time.perf_counter()
                trainer.fit(model, train_dataloaders=loader)
                seconds = time.perf_counter() - start
        if trainer.global_step != steps:
            sys.exit(f"{name} ran {trainer.global_step} steps, not {steps}")
        return seconds, final_loss(model.net, data)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds: under a minute")
    parser.add_argument("--steps", type=int, help="steps per fit (default 5000, 1000 with --quick)")
    parser.add_argument("--rounds", type=int, help="timed fits per variant (default 9, 5 with --quick)")
    parser.add_argument("--variants", default="gpulayer,lightning", help="trainers to compare with the raw loop")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if unknown := set(args.variants.split(",")) - {"gpulayer", "lightning"}:
        parser.error(f"--variants: unknown {sorted(unknown)}; choose from gpulayer, lightning")
    steps = args.steps or (1000 if args.quick else 5000)
    rounds = args.rounds or (5 if args.quick else 9)

    torch.set_num_threads(1)  # one thread: steady timings, and a model this small gains nothing from more
    runners = {"raw": run_raw} | {name: trainer_runner(name) for name in args.variants.split(",")}
    data = make_data(steps)
    times: dict[str, list[float]] = {name: [] for name in runners}
    losses: dict[str, float] = {}
    for round_index in range(rounds + 1):  # round 0 warms up (imports, allocator, first-call caches); not timed
        names = list(runners)
        names = names[round_index % len(names) :] + names[: round_index % len(names)]  # rotate who goes first
        for name in names:
            seconds, loss = runners[name](data, steps)
            losses[name] = loss
            if round_index > 0:
                times[name].append(seconds / steps)
        for name, loss in losses.items():
            if not math.isclose(loss, losses["raw"], rel_tol=LOSS_TOLERANCE, abs_tol=LOSS_TOLERANCE):
                sys.exit(f"{name}'s final loss {loss!r} is not the raw loop's {losses['raw']!r}: not the same work")

    raw = statistics.median(times["raw"])
    results = {
        name: {
            "us_per_step": statistics.median(per_step) * 1e6,
            "us_per_step_rounds": [t * 1e6 for t in per_step],
            "ratio_to_raw": statistics.median(per_step) / raw,
            "final_loss": losses[name],
        }
        for name, per_step in times.items()
    }
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name, distribution in (("gpulayer", "gpulayer-trainer"), ("lightning", "lightning")):
        if name in runners:
            versions[distribution] = version(distribution)
    print(f"{steps} steps x {rounds} rounds, batch {BATCH_SIZE}, MLP {WIDTH}-{WIDTH}-1, SGD, 1 CPU thread")
    print(", ".join(f"{key} {value}" for key, value in versions.items()), "\n")
    print("| variant | µs/step (median) | ratio to raw | overhead µs/step | final loss |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, result in results.items():
        overhead = result["us_per_step"] - raw * 1e6
        print(
            f"| {name} | {result['us_per_step']:.1f} | {result['ratio_to_raw']:.2f} | {overhead:.1f} "
            f"| {result['final_loss']:.6f} |"
        )
    if args.json:
        config = {"steps": steps, "rounds": rounds, "batch_size": BATCH_SIZE, "width": WIDTH, "lr": LR}
        with open(args.json, "w") as file:
            json.dump({"config": config, "versions": versions, "results": results}, file, indent=2)


if __name__ == "__main__":
    main()
