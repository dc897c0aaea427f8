"""One Slurm task, as `srun` starts it: detect the placement from SLURM_* and all-reduce with the others.

Usage: slurm_rank.py STORE_PATH OUT_PATH. The tasks meet through a FileStore at STORE_PATH (see the test).
"""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from gpulayer.runtime import Placement, Runtime


def main() -> None:
    store_path, out_path = sys.argv[1:]
    placement = Placement.detect(accelerator="cpu")
    with Runtime(
        placement, timeout=timedelta(seconds=60), store=dist.FileStore(store_path, placement.world_size)
    ) as runtime:
        total = runtime.all_reduce(torch.tensor([float(runtime.global_rank + 1)])).item()
        gathered = runtime.all_gather(runtime.global_rank)
    with open(out_path, "w") as out:
        json.dump(
            {"placement": repr(placement), "rank": placement.global_rank, "sum": total, "gathered": gathered}, out
        )


if __name__ == "__main__":
    main()
