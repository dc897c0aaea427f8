"""GPUlayer against a raw PyTorch loop and Lightning 2.6, side by side: ``python compare.py [options]``.

    nox -s bench                     # the full set: under 10 minutes on 2 cores; writes RESULTS.md, results.json,
                                     # chart.png here and checks the baseline (tolerance 10%)
    nox -s bench -- --quick          # under 2 minutes: the raw loop, GPUlayer and Lightning only
    nox -s bench_guard               # what CI runs: --quick, results in a temporary folder, tolerance 100%
    nox -s bench -- --guard 0.10 --readme    # a full run that also rewrites README.md's why-table
    python compare.py --workloads default_install,default_install_batch_hook,mlp --placements "1 process" \
        --rounds 8                   # a focused run: only these, interleaved, in a temporary folder

Runs ``rounds.py`` in one process and as DDP on 2 processes (gloo, under ``gpulayer launch``), then, where CUDA
is available (and without ``--no-cuda``), in one process on one GPU at ``32-true`` and at ``bf16-mixed``; and
``cold.py`` three times per workload and variant (once, for the MLP only, with ``--quick``) for start-up time,
import time and peak memory. Fails when a variant's final loss differs from the raw loop's (it did other work), or,
with ``--guard``, when GPUlayer's time per step over the raw loop's has grown past the committed baseline by more
than the tolerance (ratios the baseline does not hold, such as the GPU's on a baseline from a CPU machine, are not
guarded). A selection (``--workloads``, ``--variants``, ``--placements``) runs the rounds of those only, without
cold starts, and may not write the baseline or the README.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from figures import different_work, gpulayer_ratios
from report import chart, report
from variants import VARIANTS
from why_table import with_why_block
from workloads import EMA_VARIANTS, WORKLOADS

HERE = Path(__file__).resolve().parent
README = HERE.parent.parent / "README.md"
# --quick, the guard's run, stays under 2 minutes: GPUlayer, the raw loop it is guarded against, and Lightning, on
# every workload but the default-install ones (full runs and selections only).
QUICK_VARIANTS = ("raw", "gpulayer", "lightning")
QUICK_WORKLOADS = ("mlp", "transformer", "cnn", "gan", "log_heavy")
COLD_WORKLOADS = ("mlp", "transformer", "cnn")  # start-up does not depend on the model: the others repeat the MLP's
COLD_DDP_VARIANTS = ("gpulayer", "lightning")  # a raw loop cannot start its own processes


@dataclass(frozen=True)
class Placement:
    """Where one set of rounds runs."""

    processes: int
    device: str = "cpu"
    precision: str = "32-true"


PLACEMENTS = {"1 process": Placement(1), "DDP, 2 processes": Placement(2)}
CUDA_PLACEMENTS = {"1 GPU, 32-true": Placement(1, "cuda"), "1 GPU, bf16-mixed": Placement(1, "cuda", "bf16-mixed")}
DEADLINE_S = 900


def main() -> None:
    args = _arguments()
    started = time.monotonic()
    results = {
        "machine": _machine(cuda=args.cuda_skipped is None),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "quick": args.quick,
        "cuda_skipped": args.cuda_skipped,
        "selection": args.selection,
        "placements": {name: _rounds(name, args) for name in args.placements},
        "cold": None if args.selection else _cold_starts(args.quick),
        "cold_two_devices": None if args.quick or args.selection else _cold_starts_on_two_devices(),
    }
    results["seconds"] = round(time.monotonic() - started)
    problems = different_work(results)
    ratios = gpulayer_ratios(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "RESULTS.md").write_text(report(results))
    chart(results, args.out / "chart.png")
    print((args.out / "RESULTS.md").read_text())
    print(f"written to {args.out}")
    if args.write_baseline:
        (HERE / "baseline.json").write_text(json.dumps(ratios, indent=1, sort_keys=True) + "\n")
    if args.readme:
        README.write_text(with_why_block(README.read_text(), results))
    if args.guard is not None:
        problems += _regressions(ratios, json.loads((HERE / "baseline.json").read_text()), args.guard)
    if problems:
        sys.exit("\n".join(problems))


def _arguments() -> argparse.Namespace:
    """The command line, checked before any work: a selection's names, and what only a full run may write."""
    parser = _parser()
    args = parser.parse_args()
    args.cuda_skipped = _cuda_skipped(args.no_cuda)
    available = PLACEMENTS if args.cuda_skipped else {**PLACEMENTS, **CUDA_PLACEMENTS}
    selection = _selection(parser, args, available)
    args.selection = selection or None
    args.workloads = tuple(selection.get("workloads", QUICK_WORKLOADS if args.quick else WORKLOADS))
    args.variants = tuple(selection.get("variants", QUICK_VARIANTS if args.quick else VARIANTS))
    args.placements = selection.get("placements", list(available))
    if "raw" not in args.variants:
        parser.error(
            f"--variants {','.join(args.variants)}: raw must be among them (every final loss is checked against"
            " the raw loop's)"
        )
    if set(args.variants) & set(EMA_VARIANTS) and "raw_ema" not in args.variants:
        parser.error(
            f"--variants {','.join(args.variants)}: raw_ema must be among them (the EMA variants' final losses are"
            " checked against its)"
        )
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: accepted are 1 or more")
    if args.readme and (args.quick or selection or (args.out is not None and args.out.resolve() != HERE)):
        parser.error(
            "--readme: the README's table quotes the committed results.json, so only a full run (no --quick, no"
            " selection, no --out) rewrites it"
        )
    if args.write_baseline and selection:
        parser.error("--write-baseline: a selection measures part of what the baseline holds; run the full set")
    args.out = (args.out or (Path(tempfile.mkdtemp(prefix="compare-")) if selection else HERE)).resolve()
    args.out.mkdir(parents=True, exist_ok=True)  # resolved: the rounds run in this folder
    return args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a quarter of the steps, 4 rounds, 1 cold start (MLP); raw, gpulayer and lightning only, and no"
        " default-install workloads (a selection's names replace these)",
    )
    parser.add_argument(
        "--out", type=Path, help="folder for RESULTS.md, results.json, chart.png (default: here; a selection's: a new"
        " temporary folder)"
    )  # fmt: skip
    parser.add_argument("--guard", type=float, help="fail if a GPUlayer/raw ratio exceeds baseline * (1 + GUARD)")
    parser.add_argument("--write-baseline", action="store_true", help="save this run's ratios as the baseline")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's why-table from this full run")
    parser.add_argument("--no-cuda", action="store_true", help="skip the GPU rows even where CUDA is available")
    parser.add_argument("--rounds", type=int, help="rounds per placement (default 6, 4 on DDP and GPUs; --quick 4, 2)")
    selection = parser.add_argument_group("a selection: a focused run, rounds only (no cold starts)")
    selection.add_argument("--workloads", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    selection.add_argument("--variants", help=f"comma-separated, raw among them, of {', '.join(VARIANTS)}")
    placements = ", ".join(map(repr, [*PLACEMENTS, *CUDA_PLACEMENTS]))
    selection.add_argument("--placements", nargs="+", metavar="NAME", help=f"one or more of {placements}")
    return parser


def _selection(parser: argparse.ArgumentParser, args: argparse.Namespace, available: dict) -> dict[str, list[str]]:
    """The names a focused run was given, each checked; empty for a full run."""
    given = {
        "workloads": args.workloads.split(",") if args.workloads else None,
        "variants": args.variants.split(",") if args.variants else None,
        "placements": args.placements,
    }
    accepted = {"workloads": WORKLOADS, "variants": VARIANTS, "placements": available}
    for key, names in given.items():
        unknown = [name for name in names or [] if name not in accepted[key]]
        if unknown:
            gpu = f" (GPU rows: {args.cuda_skipped})" if key == "placements" and args.cuda_skipped else ""
            names = ", ".join(map(repr, accepted[key]))
            parser.error(f"--{key}: unknown {', '.join(map(repr, unknown))}; accepted: {names}{gpu}")
    return {key: names for key, names in given.items() if names}


def _cuda_skipped(no_cuda: bool) -> str | None:
    """Why the GPU rows do not run, or ``None`` when they do."""
    import torch

    if not torch.cuda.is_available():
        return "no GPU on this machine"
    return "--no-cuda" if no_cuda else None


def _rounds(name: str, args: argparse.Namespace) -> dict:
    placement = {**PLACEMENTS, **CUDA_PLACEMENTS}[name]
    target = args.out / f"rounds-{placement.processes}-{placement.device}-{placement.precision}.json"
    long_run = placement.processes == 1 and placement.device == "cpu"
    count = args.rounds or ((4 if long_run else 2) if args.quick else (6 if long_run else 4))  # --quick: 2 minutes
    rounds = ["--rounds", str(count), *(["--quick"] if args.quick else [])]
    rounds += ["--workloads", ",".join(args.workloads), "--variants", ",".join(args.variants)]
    setting = ["--device", placement.device, "--precision", placement.precision]
    command = [sys.executable, str(HERE / "rounds.py"), str(target), *rounds, *setting]
    if placement.processes > 1:
        command = [
            sys.executable,
            "-m",
            "gpulayer.runtime",
            "launch",
            "--nproc-per-node",
            str(placement.processes),
            *command[1:],
        ]
    subprocess.run(command, check=True, timeout=DEADLINE_S, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=HERE)
    data = json.loads(target.read_text())
    target.unlink()
    return data


def _cold_starts(quick: bool) -> dict:
    # Start-up does not depend on the order of a step or an EMA: the raw loop starts once, in its usual order.
    chosen = QUICK_VARIANTS if quick else VARIANTS
    variants = [variant for variant in chosen if variant != "raw_lightning_order" and variant not in EMA_VARIANTS]
    runs: dict[str, dict[str, list[dict]]] = {}
    for workload in COLD_WORKLOADS[:1] if quick else COLD_WORKLOADS:
        runs[workload] = {variant: [] for variant in variants if WORKLOADS[workload].runs(variant)}
        for _ in range(1 if quick else 3):
            for variant in runs[workload]:
                runs[workload][variant].append(_cold_start(workload, variant))
    return runs


def _cold_starts_on_two_devices() -> dict[str, list[dict]]:
    """``devices=2`` given to each trainer in a plain ``python`` script, which starts the second process itself."""
    runs: dict[str, list[dict]] = {variant: [] for variant in COLD_DDP_VARIANTS}
    for _ in range(3):
        for variant in COLD_DDP_VARIANTS:
            runs[variant].append(_cold_start("mlp", variant, "2"))
    return runs


def _cold_start(workload: str, variant: str, *devices: str) -> dict:
    command = [sys.executable, str(HERE / "cold.py"), workload, variant, "20", repr(time.time()), *devices]
    finished = subprocess.run(
        command, check=True, timeout=DEADLINE_S, capture_output=True, text=True, cwd=HERE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return json.loads(finished.stdout.splitlines()[-1])


def _regressions(ratios: dict[str, float], baseline: dict[str, float], tolerance: float) -> list[str]:
    problems = []
    for key, ratio in ratios.items():
        if key not in baseline:
            print(f"guard {key}: GPUlayer/raw {ratio:.3f}, no baseline: not guarded")
            continue
        allowed = baseline[key] * (1 + tolerance)
        verdict = "REGRESSION" if ratio > allowed else "ok"
        print(f"guard {key}: GPUlayer/raw {ratio:.3f}, baseline {baseline[key]:.3f}, allowed {allowed:.3f}: {verdict}")
        if ratio > allowed:
            problems.append(
                f"regression in {key}: GPUlayer/raw {ratio:.3f} > {allowed:.3f} (baseline {baseline[key]:.3f})"
            )
    return problems


def _machine(cuda: bool) -> dict:
    import torch

    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "gpulayer-trainer": version("gpulayer-trainer"),
        "lightning": version("lightning"),
        "threads per process": 1,
    }
    if cuda:
        machine |= {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda, "driver": _driver_version()}
    return machine


def _driver_version() -> str:
    """The NVIDIA driver's version from ``nvidia-smi``; ``"unknown"`` where it is missing or fails."""
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        versions = subprocess.run(query, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return versions[0] if versions else "unknown"


if __name__ == "__main__":
    main()
