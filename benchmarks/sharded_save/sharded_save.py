"""How long FSDP's checkpoint saves hold up training: full, sharded, and sharded with ``async_save=True``.

``python sharded_save.py [--out DIR]`` spawns 2 gloo CPU ranks (one thread each). For each way to save, and once
without saves, they train a stack of square Linear layers under AdamW and call ``trainer.save_checkpoint`` from a
callback's ``on_train_batch_end`` every ``--every`` steps. Per save and rank it records:

- *blocking*: the time ``save_checkpoint`` takes to return, i.e. how long the training loop stops for it (with
  ``"full"``, rank 1 returns once it has given its shards to the gather; its next step then waits for rank 0);
- *in place*: the time from the call until the checkpoint is whole on disk. The strategy runs the action given to
  ``when_checkpoints_written`` once every save it has in flight is in place (at once for a synchronous save; for an
  asynchronous one, in the thread that finishes it, after every rank wrote and rank 0 put the folder in place), so
  no polling is involved;
- *memory rise*: how far resident memory rose above its level before the call, at its peak (``VmHWM`` after
  writing 5 to ``/proc/self/clear_refs``): up to the return, and up to "in place" (this one also holds the steps
  trained meanwhile).

What the saves cost the run in all, per save (*lost per save*): the fit's time from ``on_train_start`` to ``fit``
returning (which waits for an asynchronous save in flight), less its steps at the median pace of its own steps (both
ranks', the first left out) begun without a write in flight, less the same for the fit without saves (its setup and
teardown), over the saves. Each fit's own pace cancels a change in the shared machine's speed between fits. The
figure holds the blocking, the steps slowed by a write in the background or by a peer still saving, and a wait at
the next save or at the end. Writes ``sharded_save.json`` and ``sharded_save.md``
to ``--out`` (default: a new temporary folder); the checkpoints go to ``--out``'s disk and are removed after each way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.fsdp import FSDPStrategy
from gpulayer.runtime.testing import run_ranks

WAYS = {  # name -> FSDPStrategy's options; None trains without saving
    "no saves": None,
    "full": dict(state_dict_type="full"),
    "sharded": dict(state_dict_type="sharded"),
    "sharded, async": dict(state_dict_type="sharded", async_save=True),
}
BATCH = 4
KIB_PER_MB = 1e6 / 1024


class Stack(gl.Module):
    """``layers`` bias-free ``width x width`` Linear layers (each an FSDP unit) under AdamW: the full state is the
    weights and two moments, 12 bytes per parameter."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))

    def training_step(self, batch, batch_idx):
        return self.layers(batch[0]).square().mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class SaveTimer(gl.Callback):
    """Saves at the chosen steps and times each save, and each step from its batch start to its batch end."""

    def __init__(self, folder: Path, save_steps: set[int]) -> None:
        self.folder, self.save_steps = folder, save_steps
        self.saves: list[dict] = []
        self.steps: list[dict] = []  # wall and CPU seconds, and whether a write was in flight as the step began
        self.train_start = 0.0
        self._writing = False

    def on_train_start(self, trainer, pl_module):
        self.train_start = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._batch_start, self._batch_cpu, self._began_writing = time.perf_counter(), _cpu(), self._writing

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        seconds, cpu = time.perf_counter() - self._batch_start, _cpu() - self._batch_cpu
        self.steps.append({"seconds": seconds, "cpu": cpu, "writing": self._began_writing})
        if trainer.global_step not in self.save_steps:
            return
        Path("/proc/self/clear_refs").write_text("5")
        writes = trainer.is_global_zero or trainer.strategy.saves_on_every_rank
        record = {"step": trainer.global_step, "writes": writes, "rss before": _kib("VmRSS")}
        start = time.perf_counter()
        trainer.save_checkpoint(str(self.folder / f"step={trainer.global_step}.ckpt"))
        record["blocking"] = time.perf_counter() - start
        record["peak to return"] = _kib("VmHWM")
        self.saves.append(record)
        self._writing = True
        trainer.strategy.when_checkpoints_written(lambda: self._in_place(record, start))

    def _in_place(self, record: dict, start: float) -> None:
        """Run by the strategy once the save is whole: for an asynchronous save, in the thread that finished it."""
        record["in place"] = time.perf_counter() - start
        record["peak to in place"] = _kib("VmHWM")
        record["in the background"] = threading.current_thread() is not threading.main_thread()
        self._writing = False


def _cpu() -> float:
    """This process's CPU seconds, user and system, over all its threads (the writer's among them)."""
    return sum(os.times()[:2])


def _kib(field: str, path: str = "/proc/self/status") -> int:
    """A field of ``/proc/self/status`` (or ``/proc/meminfo``), in KiB."""
    return int(next(line.split()[1] for line in Path(path).read_text().splitlines() if line.startswith(field + ":")))


def _rank(runtime, folder: str, width: int, layers: int, saves: int, every: int) -> dict:
    """A short untimed fit (first allocations, the process groups' first collectives), then every way in turn."""
    torch.set_num_threads(1)
    save_steps = {every * (i + 1) for i in range(saves)}
    max_steps = every * (saves + 1)  # as many steps after the last save as between two saves
    generator = torch.Generator().manual_seed(runtime.global_rank)
    data = TensorDataset(torch.randn(max_steps * BATCH, width, generator=generator))
    _fit(SaveTimer(Path(folder) / "warm-up", set()), {}, Stack(width, layers), data, 2)
    found = {}
    for name, options in WAYS.items():
        way_folder = Path(folder) / name.replace(", ", "-")
        timer = SaveTimer(way_folder, save_steps if options else set())
        fit_seconds = _fit(timer, options or {}, Stack(width, layers), data, max_steps)
        found[name] = {
            "saves": timer.saves,
            "steps": timer.steps,
            "fit": fit_seconds,
            "checkpoints": _checkpoints(way_folder),
        }
        runtime.barrier()  # every rank is done with the folder
        if runtime.is_global_zero:
            shutil.rmtree(way_folder, ignore_errors=True)
    return found


def _fit(timer: SaveTimer, options: dict, model: Stack, data: TensorDataset, max_steps: int) -> float:
    """Seconds from ``on_train_start`` to ``fit`` returning."""
    trainer = gl.Trainer(
        devices=2,
        strategy=FSDPStrategy(**options),
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        log_every_n_steps=0,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        default_root_dir=str(timer.folder),
        callbacks=[timer],
    )
    trainer.fit(model, DataLoader(data, batch_size=BATCH))
    return time.perf_counter() - timer.train_start


def _checkpoints(folder: Path) -> dict[str, int]:
    """Each checkpoint saved in ``folder`` and its bytes on disk (a folder's files summed)."""
    sizes = {}
    for path in sorted(folder.glob("*.ckpt")) if folder.is_dir() else []:
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        sizes[path.name] = sum(p.stat().st_size for p in files)
    return sizes


def summarize(ranks: list[dict], width: int, layers: int, saves: int, every: int) -> dict:
    """Medians and maxima over the saves, per way and rank; memory in MB (10^6 bytes)."""
    parameters = width * width * layers
    ways = {}
    for name in WAYS:
        quiet = [step for rank in ranks for step in rank[name]["steps"][1:] if not step["writing"]]
        busy = [step for rank in ranks for step in rank[name]["steps"] if step["writing"]]
        way = {"fit seconds": [rank[name]["fit"] for rank in ranks], "steps": [rank[name]["steps"] for rank in ranks]}
        for which, steps in (("", quiet), (" with a write in flight", busy)):
            for measure in ("seconds", "cpu"):
                values = [step[measure] for step in steps]
                way[f"step {measure}{which}, median"] = statistics.median(values) if values else None
        steps_per_fit = len(ranks[0][name]["steps"])
        way["beyond its steps"] = statistics.mean(way["fit seconds"]) - steps_per_fit * way["step seconds, median"]
        if name != "no saves":
            way["lost per save, seconds"] = (way["beyond its steps"] - ways["no saves"]["beyond its steps"]) / saves
            way["checkpoint bytes"] = sorted(ranks[0][name]["checkpoints"].values())
            for rank, found in enumerate(ranks):
                records = found[name]["saves"]
                way[f"rank {rank}"] = {
                    "blocking": _spread([r["blocking"] for r in records]),
                    "in place": _spread([r["in place"] for r in records]),
                    "memory rise to return, MB": _spread(
                        [(r["peak to return"] - r["rss before"]) / KIB_PER_MB for r in records]
                    ),
                    "memory rise to in place, MB": _spread(
                        [(r["peak to in place"] - r["rss before"]) / KIB_PER_MB for r in records]
                    ),
                    "each": records,
                }
        ways[name] = way
    return {
        "machine": _machine(),
        "torch": torch.__version__,
        "model": {"width": width, "layers": layers, "parameters": parameters, "full state bytes": 12 * parameters},
        "saves per way": saves,
        "steps between saves": every,
        "batch": BATCH,
        "ways": ways,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "max": max(values)}


def _machine() -> dict[str, str | int]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor() or "unknown",
    )
    memory = _kib("MemTotal", "/proc/meminfo")
    return {"cores": os.cpu_count() or 0, "cpu": cpu, "memory GB": round(memory * 1024 / 1e9, 1)}


def _disk(folder: Path) -> str:
    """The device and file system that hold ``folder`` (the longest mount point above it)."""
    resolved, best = str(folder.resolve()), ("?", "/", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        device, mount, kind = line.split()[:3]
        if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[1]):
            best = (device, mount, kind)
    return f"{best[0]} ({best[2]}) at {best[1]}"


def markdown(result: dict) -> str:
    model, machine = result["model"], result["machine"]
    lines = [
        "# FSDP checkpoint saves: how long they hold up training",
        "",
        f"{machine['cores']} cores ({machine['cpu']}), {machine['memory GB']} GB, disk {result['disk']}; torch "
        f"{result['torch']}; 2 gloo ranks, one thread each. Model: {model['layers']} x Linear({model['width']}, "
        f"{model['width']}) under AdamW, {model['parameters'] / 1e6:.1f} M parameters, full state "
        f"{model['full state bytes'] / 1e6:.0f} MB. {result['saves per way']} saves per way, one every "
        f"{result['steps between saves']} steps (batch {result['batch']} per rank). Seconds, median / max over the "
        "saves; memory rise on rank 0 in MB.",
        "",
        "| way | rank | blocking | in place | memory rise to return | memory rise to in place |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, way in result["ways"].items():
        for rank in (0, 1):
            found = way.get(f"rank {rank}")
            if found is None:
                continue
            in_place = _pair(found["in place"]) if found["each"][0]["writes"] else "(writes nothing)"
            memory = (
                [_pair(found["memory rise to return, MB"], ".0f"), _pair(found["memory rise to in place, MB"], ".0f")]
                if rank == 0
                else ["", ""]
            )
            lines.append(f"| {name} | {rank} | {_pair(found['blocking'])} | {in_place} | " + " | ".join(memory) + " |")
    lines += [
        "",
        "Steps: median seconds, wall and the process's CPU (all its threads), of the steps begun without a write in "
        "flight (the first left out) and with one.",
        "",
        "| way | step | CPU | step, write in flight | CPU, write in flight | lost per save |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, way in result["ways"].items():
        figures = [
            way[f"step {measure}{which}, median"]
            for which in ("", " with a write in flight")
            for measure in ("seconds", "cpu")
        ]
        figures.append(way.get("lost per save, seconds"))
        lines.append(f"| {name} | " + " | ".join("" if f is None else f"{f:.2f}" for f in figures) + " |")
    return "\n".join(lines) + "\n"


def _pair(spread: dict[str, float], spec: str = ".2f") -> str:
    return f"{spread['median']:{spec}} / {spread['max']:{spec}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096, help="each Linear layer's width (default 4096)")
    parser.add_argument("--layers", type=int, default=4, help="how many Linear layers (default 4: 67 M parameters)")
    parser.add_argument("--saves", type=int, default=3, help="saves per way (default 3)")
    parser.add_argument("--every", type=int, default=2, help="steps between saves (default 2)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and 2 saves: a smoke run of a few seconds")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before the ranks are killed")
    parser.add_argument("--out", type=Path, default=None, help="where the results go (default: a new temporary folder)")
    args = parser.parse_args()
    if args.quick:
        args.width, args.layers, args.saves, args.every = 64, 2, 2, 2
    for name in ("width", "layers", "saves", "every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: accepted values are 1 or more")
    out = args.out or Path(tempfile.mkdtemp(prefix="sharded-save-"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="checkpoints-", dir=out) as folder:
        ranks = run_ranks(_rank, folder, args.width, args.layers, args.saves, args.every, timeout=args.timeout)
        result = summarize(ranks, args.width, args.layers, args.saves, args.every)
        result["disk"] = _disk(Path(folder))
    (out / "sharded_save.json").write_text(json.dumps(result, indent=1))
    (out / "sharded_save.md").write_text(markdown(result))
    print(markdown(result))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
