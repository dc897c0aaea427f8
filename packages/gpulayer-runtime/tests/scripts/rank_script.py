"""A training-like script for launch tests: join the job, all-reduce, and write what this rank saw."""

import argparse
import json
import os
import signal
import sys

import torch

from gpulayer.runtime import Runtime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--fail-rank", type=int)
    parser.add_argument("--kill-rank", type=int)
    args = parser.parse_args()
    with Runtime(accelerator="cpu") as runtime:
        rank = runtime.global_rank
        with open(os.path.join(args.outdir, f"pid{rank}"), "w") as pid_file:
            pid_file.write(str(os.getpid()))
        if rank == args.fail_rank:
            raise ValueError(f"boom on rank {rank}")
        if rank == args.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        total = runtime.all_reduce(torch.tensor([rank + 1.0])).item()
        seen = {
            "rank": rank,
            "world_size": runtime.world_size,
            "local_rank": runtime.local_rank,
            "node_rank": runtime.node_rank,
            "source": runtime.placement.source,
            "master_addr": runtime.placement.master_addr,
            "sum": total,
            "argv": sys.argv[1:],
        }
    with open(os.path.join(args.outdir, f"rank{rank}.json"), "w") as out:
        json.dump(seen, out)


if __name__ == "__main__":
    main()
