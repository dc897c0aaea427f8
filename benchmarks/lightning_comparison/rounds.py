"""Timed rounds in one placement: ``python rounds.py OUT.json [--quick] [--rounds R] [--workloads ...] [--device D]``.

In one process on the CPU or on one GPU (``--device cuda``, at ``--precision 32-true`` or ``bf16-mixed``), or on
every rank of a DDP job on the CPU (run under ``gpulayer launch``; rank 0 writes OUT.json). For each workload: one
short, untimed warm-up fit per variant (of those the workload runs), then ``rounds`` rounds in which every variant
trains once, in the order of the variants and then in reverse, so that drift in the machine reaches all of them
alike.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from variants import VARIANTS, Clock, train
from workloads import WORKLOADS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    parser.add_argument(
        "--pin", action="store_true", help="under DDP, each rank (and the threads it starts) on a core of its own"
    )
    args = parser.parse_args()
    distributed = "RANK" in os.environ
    if distributed and args.device != "cpu":
        parser.error("--device cuda: DDP rounds run on the CPU (gloo) only")
    if args.device == "cpu" and args.precision != "32-true":
        parser.error(
            f"--precision {args.precision}: the CPU rounds run at 32-true only (bf16 autocast is measured on CUDA)"
        )
    torch.set_num_threads(1)
    if distributed and args.pin:  # before the group exists: gloo's threads inherit the core
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ["LOCAL_RANK"]) % len(cores)]})
    if distributed:
        dist.init_process_group("gloo")  # the launcher's; every variant's DDP joins it
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    chosen = args.variants.split(",")
    results: dict[str, dict] = {}
    setting = {"device": args.device, "precision": args.precision}
    for name in args.workloads.split(","):
        workload = WORKLOADS[name]
        if (distributed and workload.one_process) or (args.device == "cuda" and workload.cpu_only):  # workloads.py
            continue
        steps = workload.steps // 4 if args.quick else workload.steps
        batches = workload.batches(steps, rank, world_size)
        variants = [variant for variant in chosen if workload.runs(variant)]
        for variant in variants:  # warm-up: first-time costs (lazy imports, allocator, autograd) are not timed
            train(variant, workload, batches[: max(10, len(batches) // 4)], distributed, **setting)
        timings: dict[str, dict[str, list[float]]] = {v: {"seconds_per_step": [], "final_loss": []} for v in variants}
        for round_index in range(args.rounds):
            # ABBA: forwards, then backwards, so every variant runs next to the raw loop's twice in two rounds and a
            # steady drift in the machine's speed cancels in the per-round ratios.
            for variant in variants if round_index % 2 == 0 else variants[::-1]:
                clock = Clock(len(batches) * workload.epochs, args.device)
                loss = train(variant, workload, batches, distributed, clock, **setting)
                timings[variant]["seconds_per_step"].append(clock.seconds_per_step())
                timings[variant]["final_loss"].append(loss)
                if clock.log_call_ns:  # the trainers: the time of one self.log call on a step that does not log
                    timings[variant].setdefault("seconds_per_log_call", []).append(clock.seconds_per_log_call())
        steps = len(batches) * workload.epochs  # rounded down to whole epochs
        results[name] = {"steps": steps, "world_size": world_size, **setting, "variants": timings}
    if rank == 0:
        with open(args.out, "w") as out:
            json.dump(results, out, indent=1)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
