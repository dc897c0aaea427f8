"""A training-like script for launch tests: join the job, all-reduce, and write what this rank saw."""

import argparse
import atexit
import json
import os
import signal
import sys

import torch
import torch.distributed as dist

from gpulayer.runtime import Runtime


def break_the_group_then_wait() -> None:
    """A slow exit after the error is recorded: the peers see the group vanish and die while this rank is alive,
    until the agent, having seen them fail, stops it with SIGTERM."""
    dist.destroy_process_group()
    signal.pause()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--fail-rank", type=int)
    parser.add_argument("--kill-rank", type=int)
    parser.add_argument("--linger", action="store_true", help="the failing rank exits only when the agent stops it")
    args = parser.parse_args()
    # Before the rendezvous: no rank can fail (and have the agent stop the others) before every pid is written.
    with open(os.path.join(args.outdir, f"pid{os.environ['RANK']}"), "w") as pid_file:
        pid_file.write(str(os.getpid()))
    with Runtime(accelerator="cpu") as runtime:
        rank = runtime.global_rank
        if rank == args.fail_rank:
            if args.linger:
                atexit.register(break_the_group_then_wait)
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
