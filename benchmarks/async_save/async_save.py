"""How long a checkpoint save holds training: GPUlayer with and without ``async_save=True``, Lightning 2.6 with and
without its ``AsyncCheckpointIO`` plugin.

``python async_save.py [--out DIR]`` trains, for each model size (25 M and 100 M parameters: a stack of square Linear
layers under SGD with momentum, so a checkpoint holds the weights twice) and each way, one fit in a process of its
own (so each way's peak memory is its own), on the CPU, with a ``ModelCheckpoint(every_n_train_steps=..., save_top_k=-1)``
saving every ``--every`` steps (GPUlayer's ``save_last=True`` ways also save ``last.ckpt`` at each, the setting of
most templates). Per way it records:

- *held*: per save, the time the checkpoint callback's ``on_train_batch_end`` takes when it saves, i.e. how long
  training stops for the save (for GPUlayer's ``async_save``, the copy of the state and any wait for the previous
  write; for ``AsyncCheckpointIO``, its clone of every tensor);
- *in place*: the time from the save's start until its file exists under its name (both trainers rename a finished
  file into place): at the hook's return when it is there already, else seen at the start of a later step (so
  rounded up to a step) or when ``fit`` returns;
- per step, its time from the batch's start to its end (the save, in a later hook, left out), and whether a write
  was in flight as it began;
- *after the last step*: from the last batch's end to ``fit`` returning (where both trainers wait for the writes in
  flight), and *total*: ``fit``'s whole time;
- memory: the resident set at ``on_train_start`` and the process's peak (``VmHWM``) at the end.

Two fits without saves, one per trainer, give each trainer's own time beyond its steps: *lost per save* is a fit's
time beyond its steps at the median pace of its steps begun without a write in flight, less that of the same
trainer's fit without saves, over the saves (as ``sharded_save.py``). Writes ``results.json`` and ``RESULTS.md`` to
``--out`` (default: a new temporary folder); the checkpoints go to a temporary folder (``TMPDIR`` or ``/tmp``) and are
removed after each way.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from importlib import metadata
from pathlib import Path

SIZES = {"25M": 6, "100M": 24}  # name -> layers of Linear(2048, 2048), each 4.2 M parameters with its bias
WAYS = {  # name -> (trainer, how it saves, save_last); None trains without saves
    "GPUlayer, no saves": ("gpulayer", None, False),
    "GPUlayer": ("gpulayer", "sync", False),
    "GPUlayer, async_save=True": ("gpulayer", "async", False),
    "GPUlayer, save_last=True": ("gpulayer", "sync", True),
    "GPUlayer, async_save=True, save_last=True": ("gpulayer", "async", True),
    "Lightning, no saves": ("lightning", None, False),
    "Lightning": ("lightning", "sync", False),
    "Lightning, AsyncCheckpointIO": ("lightning", "async", False),
}
ASYNC_OVER_SYNC = {
    "GPUlayer, async_save=True": "GPUlayer",
    "GPUlayer, async_save=True, save_last=True": "GPUlayer, save_last=True",
    "Lightning, AsyncCheckpointIO": "Lightning",
}
TARGET = 0.2  # issue 41: GPUlayer's asynchronous save holds training at most 0.2 x its synchronous save, at 100 M
KIB_PER_MB = 1e6 / 1024


def run_way(way: str, width: int, layers: int, batch: int, every: int, saves: int, folder: Path) -> dict:
    """One fit, in this process: ``way``'s trainer saving every ``every`` steps into ``folder``."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    trainer_name, saving, save_last = WAYS[way]
    if trainer_name == "gpulayer":
        import gpulayer.trainer as gl
        from gpulayer.callbacks import ModelCheckpoint

        Trainer, Module, Callback = gl.Trainer, gl.Module, gl.Callback
        options = {"strategy": gl.SingleDeviceStrategy(async_save=saving == "async")}
    else:
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.plugins.io import AsyncCheckpointIO

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # "GPU available: False", tips
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*AsyncCheckpointIO.*")  # experimental
        Trainer, Module, Callback = pl.Trainer, pl.LightningModule, pl.Callback
        options = {"plugins": [AsyncCheckpointIO()]} if saving == "async" else {}
        options["enable_model_summary"] = False

    class Stack(Module):
        """``layers`` ``Linear(width, width)`` under SGD with momentum: a checkpoint holds the weights and the
        momentum buffers, 8 bytes per parameter."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))

        def training_step(self, batch, batch_idx):
            return self.layers(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3, momentum=0.9)

    found: dict = {"saves": [], "steps": []}
    pending: list[tuple[str, float, dict]] = []  # the save whose file is not in place yet: its path, start, record

    def in_place(now: float) -> bool:
        """Whether the pending save's file is there; its time is noted once it is."""
        if pending and os.path.exists(pending[0][0]):
            _, start, record = pending.pop()
            record["in place"] = now - start
        return not pending

    class Clock(Callback):
        def on_train_start(self, trainer, pl_module):
            found["rss at train start, KiB"] = _kib("VmRSS")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._start = time.perf_counter()
            self._writing = not in_place(self._start)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            found["last batch end"] = end = time.perf_counter()
            found["steps"].append({"seconds": end - self._start, "writing": self._writing})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        start = time.perf_counter()
        ModelCheckpoint.on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx)
        end = time.perf_counter()
        if trainer.global_step % every == 0:
            record = {"step": trainer.global_step, "held": end - start}
            found["saves"].append(record)
            in_place(end)  # the previous save's file, if it was not seen yet
            pending[:] = [(str(folder / f"step={trainer.global_step}.ckpt"), start, record)]
            in_place(end)

    if getattr(ModelCheckpoint.on_train_batch_end, "follows_cadence", False):
        on_train_batch_end.follows_cadence = True  # GPUlayer calls it at the batches it plans for saves, as the base's
    TimedCheckpoint = type("TimedCheckpoint", (ModelCheckpoint,), {"on_train_batch_end": on_train_batch_end})

    callbacks = [Clock()]
    if saving is not None:
        saves_to = {"dirpath": folder, "filename": "{step}", "save_last": save_last}
        callbacks.append(TimedCheckpoint(**saves_to, every_n_train_steps=every, save_top_k=-1))
    max_steps = every * (saves + 1) - 1  # the last save's write has all but one interval to go before the end
    data = TensorDataset(torch.randn(max_steps * batch, width, generator=torch.Generator().manual_seed(0)))
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=saving is not None,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=str(folder),
        callbacks=callbacks,
        **options,
    )
    model = Stack()
    # torch's first optimizer imports torch._dynamo (a second here), which importing Lightning has done already:
    # done for both before the clock starts, so the totals hold the fits alone.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    start = time.perf_counter()
    trainer.fit(model, DataLoader(data, batch_size=batch))
    end = time.perf_counter()
    found["total"], found["after the last step"] = end - start, end - found.pop("last batch end")
    in_place(end)
    found["peak, KiB"] = _kib("VmHWM")
    found["checkpoint bytes"] = {path.name: path.stat().st_size for path in sorted(folder.glob("*.ckpt"))}
    found["parameters"] = sum(p.numel() for p in model.parameters())
    return found


def _kib(field: str, path: str = "/proc/self/status") -> int:
    """A field of ``/proc/self/status`` (or ``/proc/meminfo``), in KiB."""
    return int(next(line.split()[1] for line in Path(path).read_text().splitlines() if line.startswith(field + ":")))


def measure(way: str, args: argparse.Namespace, layers: int, scratch: Path) -> dict:
    """``way`` in a fresh process; its checkpoints removed, and the disk synced, before the next."""
    folder = scratch / "checkpoints"
    child = {"way": way, "width": args.width, "layers": layers, "batch": args.batch, "every": args.every}
    child |= {"saves": args.saves, "threads": args.threads, "folder": str(folder)}
    argv = [sys.executable, __file__, "--child", json.dumps(child)]
    busy, ours, start = _busy_cpu(), _children_cpu(), time.perf_counter()
    finished = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - start
    # The machine's busy CPU time beyond this way's process (the kernel's writeback of its files among it), as cores:
    # what other work on a shared machine took while it ran.
    others = max(0.0, (_busy_cpu() - busy) - (_children_cpu() - ours)) / wall
    shutil.rmtree(folder, ignore_errors=True)
    os.sync()  # no dirty pages of this way's files left to write during the next way
    if finished.returncode != 0:
        sys.exit(f"{way} failed:\n{finished.stdout}\n{finished.stderr}")
    return json.loads(finished.stdout.splitlines()[-1]) | {"other work, cores": others}


def _busy_cpu() -> float:
    """Seconds of CPU time the machine spent busy (all cores, since boot): ``/proc/stat``'s first line."""
    user, nice, system, _idle, _iowait, irq, softirq = Path("/proc/stat").read_text().split()[1:8]
    return sum(int(ticks) for ticks in (user, nice, system, irq, softirq)) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def summarize(found: dict, saves: int) -> dict:
    """Per way: medians and spreads; each trainer's lost per save against its fit without saves."""
    ways = {}
    for name, run in found.items():
        trainer_name, saving, save_last = WAYS[name]
        quiet = [step["seconds"] for step in run["steps"][1:] if not step["writing"]]
        busy = [step["seconds"] for step in run["steps"] if step["writing"]]
        way = {
            "trainer": trainer_name,
            "saving": saving,
            "step, median": statistics.median(quiet),
            "step with a write in flight, median": statistics.median(busy) if busy else None,
            "steps with a write in flight": len(busy),
            "total": run["total"],
            "after the last step": run["after the last step"],
            "beyond its steps": run["total"] - len(run["steps"]) * statistics.median(quiet),
            "rss at train start, MB": run["rss at train start, KiB"] / KIB_PER_MB,
            "peak, MB": run["peak, KiB"] / KIB_PER_MB,
            "other work, cores": run["other work, cores"],
            "run": run,
        }
        if saving is not None:
            # Every save timed, and its file on disk whole (the weights and the momentum buffers, 4 bytes each).
            files = run["checkpoint bytes"]  # and last.ckpt, with save_last
            assert len(run["saves"]) == saves == len(files) - save_last, (name, files)
            assert min(run["checkpoint bytes"].values()) >= 8 * run["parameters"], (name, run["checkpoint bytes"])
            held = [save["held"] for save in run["saves"]]
            placed = [save.get("in place") for save in run["saves"]]
            way["held"] = _spread(held)
            way["in place"] = _spread(placed) if None not in placed else None
            baseline = ways[f"{'GPUlayer' if trainer_name == 'gpulayer' else 'Lightning'}, no saves"]
            way["lost per save"] = (way["beyond its steps"] - baseline["beyond its steps"]) / saves
            way["checkpoint MB"] = statistics.median(run["checkpoint bytes"].values()) / 1e6
        if name in ASYNC_OVER_SYNC:
            way["held over sync's"] = way["held"]["median"] / ways[ASYNC_OVER_SYNC[name]]["held"]["median"]
        ways[name] = way
    return ways


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "each": values}


def _machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor() or "unknown",
    )
    versions = {name: metadata.version(name) for name in ("torch", "lightning", "gpulayer-trainer")}
    memory = _kib("MemTotal", "/proc/meminfo") * 1024 / 1e9
    return {
        "cores": os.cpu_count() or 0,
        "cpu": cpu,
        "memory GB": round(memory, 1),
        "python": platform.python_version(),
    } | versions


def _disk(folder: Path) -> str:
    """The device and file system that hold ``folder`` (the longest mount point above it)."""
    resolved, best = str(folder.resolve()), ("?", "/", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        device, mount, kind = line.split()[:3]
        if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[1]):
            best = (device, mount, kind)
    return f"{best[0]} ({best[2]}) at {best[1]}"


def markdown(result: dict) -> str:
    machine, settings = result["machine"], result["settings"]
    lines = [
        "# Checkpoint saves behind training: how long each save holds training",
        "",
        f"{result['date']}: `python benchmarks/async_save/async_save.py {' '.join(result['argv'])}`. "
        f"{machine['cores']} cores ({machine['cpu']}), {machine['memory GB']} GB, checkpoints on {result['disk']}; "
        f"Python {machine['python']}, torch {machine['torch']}, Lightning {machine['lightning']}, gpulayer-trainer "
        f"{machine['gpulayer-trainer']}. Load average (1 min) {result['load before'][0]:.2f} before the run. "
        f"{settings['threads']} intra-op thread(s) for training; batch "
        f"{settings['batch']}; a save every {settings['every']} steps, {settings['saves']} per way, and "
        f"{settings['every'] - 1} steps after the last one. Each way in a process of its own.",
    ]
    for size, found in result["sizes"].items():
        model = found["model"]
        lines += [
            "",
            f"## {size}: {model['layers']} x Linear({model['width']}, {model['width']}), "
            f"{model['parameters'] / 1e6:.1f} M parameters, checkpoint {found['checkpoint MB']:.0f} MB",
            "",
            "| way | held per save | / sync's | in place | step | step, write in flight | after the last step "
            "| total | lost per save | RSS at start | peak RSS | other work |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, way in found["ways"].items():
            ratio = way.get("held over sync's")
            cells = [
                _triple(way["held"]) if "held" in way else "",
                "" if ratio is None else f"{ratio:.2f}",
                _triple(way["in place"]) if way.get("in place") else "",
                f"{way['step, median']:.3f}",
                _seconds(way["step with a write in flight, median"], ".3f"),
                f"{way['after the last step']:.2f}",
                f"{way['total']:.2f}",
                _seconds(way.get("lost per save")),
                f"{way['rss at train start, MB']:.0f} MB",
                f"{way['peak, MB']:.0f} MB",
                f"{way['other work, cores']:.2f}",
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    target = result.get("target")
    lines += [
        "",
        "Seconds. *held per save*: the checkpoint callback's `on_train_batch_end` at a save, median (min to max) over "
        "the saves; */ sync's*: its median over the same trainer's synchronous median. *in place*: from the save's "
        "start until its file exists (seen at the hook's return, else at a later step's start). *step*: median of the "
        "steps begun without a write in flight (the first left out), batch start to batch end; *step, write in "
        "flight*: of the steps begun with one. *after the last step*: the last batch's end to `fit` returning (the "
        "writes in flight are waited for there). *lost per save*: the fit's time beyond its steps at the median "
        "pace, less that of the same trainer's fit without saves, over the saves. *RSS at start*: at "
        "`on_train_start`; *peak RSS*: `VmHWM` at the end of the process. *other work*: the machine's busy CPU time while the way "
        "ran beyond its own process's, in cores (the kernel's writeback of the way's files counts there too): near 0 "
        "on an idle machine.",
    ]
    if target is not None:
        verdict = "met" if target["met"] else "not met"
        lines += [
            "",
            f"**Target** (issue 41): GPUlayer's `async_save=True` holds training at most {TARGET} x its synchronous "
            f"save at 100 M parameters: {target['ratio']:.3f} x ({target['async']:.3f} s against "
            f"{target['sync']:.3f} s), {verdict}.",
        ]
    # Paragraphs wrapped at 120 characters, as the repository's Markdown; table rows kept whole.
    return (
        "\n".join(line if line.startswith("|") else textwrap.fill(line, 120, break_on_hyphens=False) for line in lines)
        + "\n"
    )


def _triple(spread: dict[str, float]) -> str:
    return f"{spread['median']:.3f} ({spread['min']:.3f} to {spread['max']:.3f})"


def _seconds(value: float | None, spec: str = ".2f") -> str:
    return "" if value is None else f"{value:{spec}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048, help="each Linear layer's width (default 2048)")
    parser.add_argument("--batch", type=int, default=16, help="rows per batch (default 16)")
    parser.add_argument("--every", type=int, default=20, help="steps between saves (default 20)")
    parser.add_argument("--saves", type=int, default=4, help="saves per way (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads for training (default 1)")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--trainers", default="gpulayer,lightning", help="whose ways run: gpulayer[,lightning]")
    parser.add_argument("--quick", action="store_true", help="a tiny model and 2 saves: a smoke run of seconds")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before a way's process is killed")
    parser.add_argument("--out", type=Path, default=None, help="where the results go (default: a new temporary folder)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one way's fit, in the process the parent started
    args = parser.parse_args()
    if args.child is not None:
        child = json.loads(args.child)
        import torch

        torch.set_num_threads(child.pop("threads"))
        folder = Path(child.pop("folder"))
        print(json.dumps(run_way(folder=folder, **child)))
        return
    sizes = {"tiny": 2} if args.quick else {name: SIZES[name] for name in args.sizes.split(",") if name}
    if args.quick:
        args.width, args.every, args.saves = 64, 2, 2
    unknown = set(args.sizes.split(",")) - set(SIZES)
    if unknown and not args.quick:
        parser.error(f"--sizes {args.sizes}: unknown {', '.join(sorted(unknown))}; accepted: {', '.join(SIZES)}")
    for name, least in (("width", 1), ("batch", 1), ("every", 2), ("saves", 2), ("threads", 1)):
        if getattr(args, name) < least:
            parser.error(f"--{name} {getattr(args, name)}: accepted values are {least} or more")
    if not {"gpulayer"} <= set(args.trainers.split(",")) <= {"gpulayer", "lightning"}:
        parser.error(f"--trainers {args.trainers}: accepted values are gpulayer and gpulayer,lightning")
    out = args.out or Path(tempfile.mkdtemp(prefix="async-save-"))
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "argv": sys.argv[1:],
        "machine": _machine(),
        "load before": os.getloadavg(),
        "settings": {name: getattr(args, name) for name in ("width", "batch", "every", "saves", "threads")},
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="async-save-checkpoints-") as scratch:
        result["disk"] = _disk(Path(scratch))
        for size, layers in sizes.items():
            found = {}
            for way in (name for name, (trainer, *_) in WAYS.items() if trainer in args.trainers.split(",")):
                print(f"{size}: {way}", flush=True)
                found[way] = measure(way, args, layers, Path(scratch))
            ways = summarize(found, args.saves)
            parameters = found["GPUlayer"]["parameters"]
            result["sizes"][size] = {
                "model": {"width": args.width, "layers": layers, "parameters": parameters},
                "checkpoint MB": ways["GPUlayer"]["checkpoint MB"],
                "ways": ways,
            }
    result["load after"] = os.getloadavg()
    if "100M" in result["sizes"]:
        ways = result["sizes"]["100M"]["ways"]
        ratio = ways["GPUlayer, async_save=True"]["held over sync's"]
        result["target"] = {
            "ratio": ratio,
            "async": ways["GPUlayer, async_save=True"]["held"]["median"],
            "sync": ways["GPUlayer"]["held"]["median"],
            "met": ratio <= TARGET,
        }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "RESULTS.md").write_text(markdown(result))
    print(markdown(result))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
