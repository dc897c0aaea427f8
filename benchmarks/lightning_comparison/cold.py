"""One cold start: ``python cold.py WORKLOAD VARIANT STEPS STARTED_AT [DEVICES]`` prints a JSON line.

``STARTED_AT`` is the parent's ``time.time()`` just before it started this process, so ``first_step_s`` counts
the interpreter's start, the imports, building the model and the trainer, and the first step. Also measured:
``import torch`` and the framework's import on top of it, and the peak resident memory of the whole fit.

With ``DEVICES`` (a trainer variant only) the trainer is given ``devices=DEVICES`` on the CPU and starts its
processes as a user's script would: GPUlayer runs the script again under ``gpulayer launch``, Lightning's DDP
strategy runs it again for each other rank. Rank 0 prints the line; ``first_step_s`` is rank 0's.
"""

import time

_start = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

_torch_imported = time.perf_counter()


def main() -> None:
    workload_name, variant, steps, started_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    devices = int(sys.argv[5]) if len(sys.argv) > 5 else None
    before = time.perf_counter()
    if variant == "gpulayer":
        import gpulayer.trainer  # noqa: F401
    elif variant.startswith("lightning"):
        import lightning.pytorch  # noqa: F401
    framework_import = time.perf_counter() - before
    torch.set_num_threads(1)
    from variants import FirstStepClock, train
    from workloads import WORKLOADS

    workload = WORKLOADS[workload_name]
    clock = FirstStepClock(steps)
    distributed = devices is not None
    loss = train(variant, workload, workload.batches(steps), distributed=distributed, clock=clock, devices=devices)
    if distributed and os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) != "0":
        return
    print(
        json.dumps(
            {
                "import_torch_s": _torch_imported - _start,
                "import_framework_s": framework_import,
                "first_step_s": clock.marks[0] - started_at,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "final_loss": loss,
            }
        )
    )


if __name__ == "__main__":
    main()
