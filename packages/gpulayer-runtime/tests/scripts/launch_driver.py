"""Calls launch() with callables, as a user's program would; prints the outcome as JSON.

Usage: launch_driver.py report | raise PIDDIR | kill PIDDIR | hang PIDDIR
"""

import json
import os
import signal
import sys
import time

import torch

from gpulayer.runtime import Runtime, WorkerFailedError, launch


def listening_addresses(pid):
    """The local addresses of the TCP sockets that process ``pid`` listens on, read from /proc (Linux)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    addresses.append(local.split(":")[0])
    return addresses


def report(tag):
    with Runtime(accelerator="cpu") as runtime:
        total = runtime.all_reduce(torch.tensor([runtime.global_rank + 1.0])).item()
        return {
            "tag": tag,
            "rank": runtime.global_rank,
            "world_size": runtime.world_size,
            "source": runtime.placement.source,
            "master_addr": runtime.placement.master_addr,
            "sum": total,
            "agent_listens_on": listening_addresses(os.getppid()),
        }


def fail(how, piddir):
    # Before the rendezvous: no rank can fail (and have the agent stop the others) before every pid is written.
    with open(os.path.join(piddir, f"pid{os.environ['RANK']}"), "w") as pid_file:
        pid_file.write(str(os.getpid()))
    with Runtime(accelerator="cpu", timeout=3) as runtime:
        if runtime.global_rank == 1:
            if how == "raise":
                raise ValueError("boom on rank 1")
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            signal.pause()  # "hang": alive but never reaching the collective
        runtime.barrier()  # rank 0 waits here for a peer that never comes


if __name__ == "__main__":
    mode = sys.argv[1]
    start = time.monotonic()
    try:
        if mode == "report":
            outcome = {"results": {str(rank): value for rank, value in launch(report, "hi", nproc_per_node=2).items()}}
        else:
            launch(fail, mode, sys.argv[2], nproc_per_node=2)
            outcome = {"results": None}
    except WorkerFailedError as error:
        outcome = {"error": {"rank": error.rank, "exitcode": error.exitcode, "message": str(error)}}
    outcome["elapsed"] = time.monotonic() - start
    print(json.dumps(outcome))
