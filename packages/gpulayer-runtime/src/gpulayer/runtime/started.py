"""``start_processes()``: run a call on N processes of this machine that this process starts (fork or spawn), joined
through a store this process hosts, and return rank 0's value.

How a notebook, an Optuna objective or any function called twice gets DDP (Lightning's ``ddp_spawn``,
``ddp_fork`` and ``ddp_notebook``), where re-running the script under ``gpulayer launch`` is impossible. The caller
waits on one pipe and the exit of each worker: the first worker that raises, is killed or exits without its result
ends the call with ``WorkerFailedError`` naming its rank, and the others are ended and reaped first. Workers die with
the caller (``die_with_parent``), so none outlives it.

The workers are started before the store: a forked worker copies the caller whole, and a thread running there (the
store's server) could hold a lock the copy then waits on forever. Each worker learns the store's port over its pipe.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from textwrap import dedent
from typing import Any

from gpulayer.runtime.launch import CONSEQUENCES, WorkerFailedError
from gpulayer.runtime.rendezvous import LOOPBACK, loopback_interface, loopback_store
from gpulayer.runtime.worker import die_with_parent

START_METHODS = ("spawn", "fork")
# How long ended workers get to exit on SIGTERM before SIGKILL.
END_GRACE_S = 3.0
# How long the caller listens on after a failure another rank's may explain (a broken collective): the rank that
# caused it has died or sent its error by then.
SETTLE_S = 2.0
# How long a worker waits for its peers at the store; a peer that never comes is seen by the caller before this.
STORE_TIMEOUT = timedelta(minutes=30)
_MAIN_GUARD = dedent(
    """
    Launching multiple processes with the 'spawn' start method requires that your script guards the main
    function with an `if __name__ == "__main__"` clause. For example:

    def main():
        # Put your code here
        ...

    if __name__ == "__main__":
        main()

    Alternatively, you can run with `strategy="ddp"` to avoid this error.
    """
)  # Lightning 2.6's words (``_check_missing_main_guard`` in lightning/fabric/strategies/launchers/multiprocessing.py)
_calls = itertools.count()  # one store prefix per call: a second call in this process never meets the first's keys
_this_worker: StartedWorker | None = None


@dataclass(frozen=True)
class StartedWorker:
    """Who a started process is: its rank among ``world_size``, and where the caller's store listens."""

    rank: int
    world_size: int
    start_method: str
    store_port: int
    prefix: str

    def store(self, timeout: timedelta | None) -> Any:
        """The caller's store, under this call's prefix."""
        import torch.distributed as dist

        client = dist.TCPStore(
            LOOPBACK, self.store_port, self.world_size, is_master=False, timeout=timeout or STORE_TIMEOUT
        )
        return dist.PrefixStore(self.prefix, client)


def this_worker() -> StartedWorker | None:
    """This process's place when ``start_processes`` started it, else None."""
    return _this_worker


def start_processes(fn: Callable[..., Any], *args: Any, nprocs: int, start_method: str) -> Any:
    """Call ``fn(*args)`` on ``nprocs`` new processes and return rank 0's value (the others' are dropped).

    Each worker finds its rank with ``this_worker()`` (``Placement.detect`` does), and its process group joins the
    store this call hosts. With ``"spawn"``, ``fn`` and ``args`` are pickled here (an error names what cannot be)
    and each worker unpickles its own copy; with ``"fork"`` each inherits them. Values come back pickled, so no
    tensor shares memory with a worker that has ended.
    """
    if start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r}: accepted values are {', '.join(map(repr, START_METHODS))}")
    if start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"start_method={start_method!r} is not available on this platform")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r}: expected a whole number of at least 1")
    if start_method == "spawn" and getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(_MAIN_GUARD)  # this script is being imported by a spawned process: it would start again
    call = pickle.dumps((fn, args)) if start_method == "spawn" else (fn, args)
    context = multiprocessing.get_context(start_method)
    prefix = f"gpulayer/started_{next(_calls)}"
    workers: list[Any] = []
    pipes: list[Any] = []  # each worker's result: its value or its error
    ports: list[Any] = []  # to each worker: the store's port
    try:
        for rank in range(nprocs):
            receiving, sending = context.Pipe(duplex=False)
            port_in, port_out = context.Pipe(duplex=False)
            worker = StartedWorker(rank, nprocs, start_method, 0, prefix)
            process = context.Process(target=_run, args=(worker, port_in, sending, call), name=f"gpulayer-rank-{rank}")
            process.start()
            for end in (sending, port_in):  # the worker holds the only copies: end of file then means it is gone
                end.close()
            workers.append(process)
            pipes.append(receiving)
            ports.append(port_out)
        with loopback_store(STORE_TIMEOUT) as endpoint:
            port = int(endpoint.rsplit(":", 1)[1])
            for port_out in ports:
                with contextlib.suppress(OSError):  # a worker already gone: its end is seen by _wait
                    port_out.send(port)
            try:
                return _wait(workers, pipes)
            finally:
                _end(workers)  # on success they have exited; else they end before the store closes under them
    finally:
        _end(workers)  # those started before a failure to start the rest or the store
        for pipe in pipes + ports:
            pipe.close()


def _wait(workers: list[Any], pipes: list[Any]) -> Any:
    """Rank 0's value once every worker has sent its own and exited; a failure raises, naming its root cause."""
    values: dict[int, Any] = {}
    failures: list[_Failure] = []
    watched = {**{pipe: rank for rank, pipe in enumerate(pipes)}, **{w.sentinel: r for r, w in enumerate(workers)}}
    settled_at = math.inf
    while watched and not (failures and (_root(failures).order < _CONSEQUENCE or time.monotonic() >= settled_at)):
        timeout = None if not failures else max(0.0, settled_at - time.monotonic())
        for ready in multiprocessing.connection.wait(list(watched), timeout):
            if ready not in watched:  # its pipe, already read when its exit was seen first
                continue
            rank = watched.pop(ready)
            worker = workers[rank]
            if ready is worker.sentinel:
                worker.join()
                if watched.pop(pipes[rank], None) is not None:  # what it sent just before exiting
                    _receive(pipes[rank], rank, worker, values, failures)
                finished = rank in values and worker.exitcode == 0
                if not finished and not any(failure.error.rank == rank for failure in failures):
                    how = "it ended without its result; the other workers were ended"
                    error = WorkerFailedError(rank, rank, worker.pid, worker.exitcode, how, None)
                    failures.append(_Failure(_DIED, len(failures), error, None))
            else:
                _receive(ready, rank, worker, values, failures)
        if failures and settled_at == math.inf:
            settled_at = time.monotonic() + SETTLE_S
    if failures:
        root = _root(failures)
        raise root.error from root.cause
    return values[0]


def _receive(pipe: Any, rank: int, worker: Any, values: dict[int, Any], failures: list[_Failure]) -> None:
    """A worker's one message, if it sent one: its value, or its error."""
    if not pipe.poll():
        return
    try:
        kind, value, cause = pickle.loads(pipe.recv_bytes())
    except EOFError:  # it exited without a word
        return
    if kind == "value":
        values[rank] = value
        return
    error = WorkerFailedError(rank, rank, worker.pid, 1, "it raised; the other workers were ended", value)
    raised = value.strip().splitlines()[-1].split(":", 1)[0].rsplit(".", 1)[-1]  # the exception's class name
    failures.append(_Failure(_CONSEQUENCE if raised in CONSEQUENCES else _RAISED, len(failures), error, cause))


@dataclass(frozen=True)
class _Failure:
    order: int  # _RAISED, _DIED or _CONSEQUENCE
    seen: int
    error: WorkerFailedError
    cause: BaseException | None


# The root cause among failed ranks, as ``gpulayer launch`` ranks them (ADR 0016): an exception of the user's, then a
# death nothing explains (a signal, an exit), then an error that another rank's failure causes (a broken collective).
_RAISED, _DIED, _CONSEQUENCE = range(3)


def _root(failures: list[_Failure]) -> _Failure:
    return min(failures, key=lambda failure: (failure.order, failure.seen))


def _end(workers: list[Any]) -> None:
    """SIGTERM every live worker, SIGKILL what is left after ``END_GRACE_S``, and reap them all."""
    for process in workers:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + END_GRACE_S
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def _run(worker: StartedWorker, port: Any, pipe: Any, call: Any) -> None:
    """A started process: the store's port, its place, Lightning's thread and address settings, the call, and its
    value or error."""
    global _this_worker
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook's interrupt reaches the caller, which ends the workers
    try:
        worker = _this_worker = replace(worker, store_port=port.recv())
        port.close()
        _set_environment(worker)
        fn, args = pickle.loads(call) if isinstance(call, bytes) else call
        value = fn(*args)
        _barrier()  # every rank has finished before any reports: none leaves a peer inside a collective
        pipe.send_bytes(pickle.dumps(("value", value if worker.rank == 0 else None, None)))
    except BaseException as error:  # every failure goes to the caller, which names this rank
        with contextlib.suppress(Exception):
            pipe.send_bytes(pickle.dumps(("error", traceback.format_exc(), _picklable(error))))
        _exit(pipe, 1)
    _exit(pipe, 0)


def _exit(pipe: Any, status: int) -> None:
    """End without the interpreter's teardown (a spawned process would run it): a finished gloo group can abort
    there (see ``clean_exit``), and a forked process must not run the atexit handlers it inherited."""
    pipe.close()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _set_environment(worker: StartedWorker) -> None:
    """As Lightning's started workers: ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``, and without
    ``OMP_NUM_THREADS`` the machine's CPUs shared out (``_set_num_threads_if_needed``); gloo on loopback."""
    import torch

    os.environ.update(LOCAL_RANK=str(worker.rank), MASTER_ADDR=LOOPBACK, MASTER_PORT=str(worker.store_port))
    if "OMP_NUM_THREADS" not in os.environ:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cpus // worker.world_size)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
    interface = loopback_interface()
    if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = interface


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _picklable(error: BaseException) -> BaseException | None:
    """``error`` when it survives pickling (it becomes the cause of the caller's error), else None."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # an error that cannot travel is told by its traceback alone
        return None
    return error
