"""Calls of start_processes for test_started.py, one scenario per run; prints one JSON line of what it saw."""

import json
import os
import signal
import sys
import threading
import time

import torch

from gpulayer.runtime import Placement, Runtime, WorkerFailedError
from gpulayer.runtime.started import start_processes, this_worker
from gpulayer.runtime.testing import descendants, is_alive


def rank_sum(offset):
    """Each rank joins the group through the caller's store and all-reduces its rank: every rank returns the sum."""
    with Runtime(Placement.detect(accelerator="cpu")) as runtime:
        total = runtime.all_reduce(torch.tensor([float(runtime.global_rank + offset)]))
        return {
            "rank": runtime.global_rank,
            "world": runtime.world_size,
            "sum": total.item(),
            "source": runtime.placement.source,
        }


def fail_on_rank_1(how):
    """Rank 1 raises or is killed while rank 0 waits for it in a collective."""
    runtime = Runtime(Placement.detect(accelerator="cpu"))
    if runtime.global_rank == 1:
        if how == "raise":
            raise ValueError("boom on rank 1")
        os.kill(os.getpid(), signal.SIGKILL)
    runtime.barrier()


def consequence_first():
    """Rank 0 fails as a broken collective fails and exits; only then does rank 1 raise the error that explains it."""
    worker = this_worker()
    store = worker.store(None)
    if worker.rank == 0:
        store.set("rank0", str(os.getpid()))
        raise torch.distributed.DistNetworkError("Connection closed by peer")
    store.wait(["rank0"])
    peer = int(store.get("rank0"))
    while is_alive(peer):  # rank 0's error is in its pipe once it has exited
        time.sleep(0.01)
    raise ValueError("the real error, on rank 1")


def sockets():
    """The inodes of the sockets this process holds open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def sockets_not_in(before):
    """This worker's sockets, before it connects to anything, that its caller did not hold before the call."""
    return sorted(sockets() - before)


def hold(folder):
    """Report this worker's pid, then wait for good: only its caller's death can end it."""
    with open(os.path.join(folder, f"pid{this_worker().rank}"), "w") as file:
        file.write(str(os.getpid()))
    threading.Event().wait()


def below_here():
    """Processes still below this one, less multiprocessing's resource tracker (a helper that ends with us)."""
    left = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline") as file:
                command = file.read()
        except OSError:
            continue
        if "resource_tracker" not in command:
            left.append(pid)
    return left


def main(scenario, method, *rest):
    seen = {}
    if scenario == "twice":
        seen["calls"] = [start_processes(rank_sum, call, nprocs=2, start_method=method) for call in (0, 10)]
    elif scenario in ("raise", "kill"):
        started = time.monotonic()
        try:
            start_processes(fail_on_rank_1, scenario, nprocs=2, start_method=method)
        except WorkerFailedError as error:
            seen.update(
                rank=error.rank,
                exitcode=error.exitcode,
                message=str(error).splitlines()[0],
                cause=repr(error.__cause__),
                traceback=error.traceback,
                seconds=time.monotonic() - started,
            )
        seen["after"] = start_processes(rank_sum, 0, nprocs=2, start_method=method)  # the process can go on
    elif scenario == "consequence":
        try:
            start_processes(consequence_first, nprocs=2, start_method=method)
        except WorkerFailedError as error:
            seen.update(rank=error.rank, cause=repr(error.__cause__))
    elif scenario == "inherited":
        seen["new_sockets"] = start_processes(sockets_not_in, sockets(), nprocs=2, start_method=method)
    elif scenario == "hold":
        start_processes(hold, rest[0], nprocs=2, start_method=method)
    seen["left"] = below_here()
    print(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:])
