"""``launch()``: start a callable, script or module on N processes with torchrun's own engine."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any

RDZV_BACKENDS = ("c10d", "static")
# torchrun's default join timeout for the rendezvous (LaunchConfig sets the same when none is given).
RDZV_TIMEOUT_S = 900


class WorkerFailedError(RuntimeError):
    """A worker failed, so the job ended. Names the first failing rank and carries its traceback."""

    def __init__(self, rank: int, local_rank: int, pid: int, exitcode: int, message: str, traceback: str | None):
        self.rank, self.local_rank, self.pid, self.exitcode = rank, local_rank, pid, exitcode
        self.traceback = traceback
        how = f"was killed by signal {_signal_name(-exitcode)}" if exitcode < 0 else f"exited with code {exitcode}"
        text = f"rank {rank} (local rank {local_rank}, pid {pid}) {how}: {message}"
        super().__init__(f"{text}\n{traceback}" if traceback else text)


def launch(
    target: Callable[..., Any] | str,
    *args: Any,
    nproc_per_node: int = 1,
    nnodes: int | str = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_backend: str = "c10d",
    rdzv_id: str | None = None,
    rdzv_conf: dict[str, Any] | None = None,
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    module: bool = False,
    local_addr: str | None = None,
    shutdown_timeout: float | None = None,
) -> dict[int, Any]:
    """Run ``target`` on ``nproc_per_node`` processes here, joined with ``nnodes`` nodes in all.

    ``target`` is a picklable callable (called as ``target(*args)``; its return values come back keyed by
    global rank), or a script path (``module=True``: a module name) run with ``args`` as its command line.
    With one node and no ``rdzv_endpoint`` the rendezvous listens on loopback only. Across nodes, every node
    runs ``launch`` with the same ``rdzv_endpoint`` and ``rdzv_id``. A failing worker ends the job with
    ``WorkerFailedError``; with ``max_restarts`` > 0 the agent restarts the workers first, as torchrun does.
    """
    min_nodes, max_nodes = _check_arguments(
        target, nproc_per_node, nnodes, node_rank, rdzv_endpoint, rdzv_backend, max_restarts, module
    )
    _check_intervals(monitor_interval, shutdown_timeout)
    configs = {**(rdzv_conf or {}), "timeout": _rdzv_timeout(rdzv_conf)}
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from gpulayer.runtime import worker

    shutdown = _shutdown_option(LaunchConfig, shutdown_timeout)

    with ExitStack() as stack:
        # As torchrun: workers default to OMP_NUM_THREADS=1 when several share a node and the user set none.
        stack.enter_context(_worker_defaults({"OMP_NUM_THREADS": "1"} if nproc_per_node > 1 else {}))
        run_id = rdzv_id or "none"
        if rdzv_endpoint is None:  # one node: a private loopback rendezvous, and workers that listen there only
            from gpulayer.runtime.rendezvous import loopback_interface, loopback_store

            interface = loopback_interface()
            stack.enter_context(_worker_defaults({"GLOO_SOCKET_IFNAME": interface} if interface else {}))
            rdzv_endpoint = stack.enter_context(loopback_store(timedelta(seconds=configs["timeout"])))
            rdzv_backend, run_id, configs["rank"] = "static", rdzv_id or uuid.uuid4().hex, 0
        elif rdzv_backend == "static":
            configs["rank"] = node_rank
        config = LaunchConfig(
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            nproc_per_node=nproc_per_node,
            run_id=run_id,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_backend=rdzv_backend,
            rdzv_configs=configs,
            max_restarts=max_restarts,
            monitor_interval=monitor_interval,
            start_method="spawn",
            local_addr=local_addr,
            **shutdown,
        )
        if callable(target):
            entrypoint, entry_args = worker.run_callable, (target, *args)
        else:
            entrypoint = sys.executable
            entry_args = ("-u", "-m", "gpulayer.runtime.worker", *(["-m"] if module else []), target, *map(str, args))
        try:
            return elastic_launch(config, entrypoint)(*entry_args)
        except ChildFailedError as failed:
            raise _worker_failed(failed) from None


def _check_arguments(
    target, nproc_per_node, nnodes, node_rank, rdzv_endpoint, rdzv_backend, max_restarts, module
) -> tuple[int, int]:
    if "RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
        raise RuntimeError(
            "launch() was called inside a process that torchrun or `gpulayer launch` already started "
            f"(RANK={os.environ.get('RANK')}); call the target directly instead of launching again"
        )
    if not callable(target) and not isinstance(target, str):
        raise TypeError(f"target={target!r}: expected a callable, a script path or (module=True) a module name")
    if callable(target) and module:
        raise ValueError("module=True needs target to be a module name, not a callable")
    if isinstance(target, str) and not module and not os.path.isfile(target):
        raise FileNotFoundError(
            f"target={target!r}: no such script; accepted are a callable, the path of a script, or with module=True "
            "a module name"
        )
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node={nproc_per_node!r}: expected a whole number of at least 1")
    min_nodes, max_nodes = _parse_nnodes(nnodes)
    if rdzv_backend not in RDZV_BACKENDS:
        raise ValueError(f"rdzv_backend={rdzv_backend!r}: expected one of {', '.join(map(repr, RDZV_BACKENDS))}")
    if max_nodes > 1 and rdzv_endpoint is None:
        raise ValueError(f"nnodes={nnodes!r} needs rdzv_endpoint='HOST:PORT', the same on every node")
    if not 0 <= node_rank < max_nodes:
        raise ValueError(f"node_rank={node_rank!r}: must be in [0, {max_nodes})")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts!r}: expected a whole number of at least 0")
    return min_nodes, max_nodes


def _check_intervals(monitor_interval: Any, shutdown_timeout: Any) -> None:
    """Checked before the store listens: torch's agent asserts on a bad monitor_interval with no message."""
    if not _is_seconds(monitor_interval) or not monitor_interval > 0:
        raise ValueError(f"monitor_interval={monitor_interval!r}: expected a number of seconds above 0")
    if shutdown_timeout is not None and (not _is_seconds(shutdown_timeout) or not shutdown_timeout >= 0):
        raise ValueError(f"shutdown_timeout={shutdown_timeout!r}: expected None or a number of seconds, at least 0")


def _shutdown_option(config_class: type, shutdown_timeout: float | None) -> dict[str, int]:
    """``shutdown_timeout`` for torch's ``LaunchConfig``; left out when not given (torch 2.11, for one, lacks it)."""
    if shutdown_timeout is None:
        return {}
    if "shutdown_timeout" not in {field.name for field in dataclasses.fields(config_class)}:
        import torch

        raise ValueError(
            f"shutdown_timeout={shutdown_timeout!r}: torch {torch.__version__}'s elastic agent has no shutdown "
            "timeout; leave it None (the agent's own default), or install a torch that has one"
        )
    return {"shutdown_timeout": int(shutdown_timeout)}


def _is_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rdzv_timeout(rdzv_conf: dict[str, Any] | None) -> int:
    """The rendezvous join timeout in whole seconds; the command line passes it as text."""
    value = (rdzv_conf or {}).get("timeout", RDZV_TIMEOUT_S)
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        seconds = 0
    if isinstance(value, bool) or seconds < 1:
        raise ValueError(f"rdzv_conf timeout={value!r}: expected a whole number of seconds, at least 1")
    return seconds


def _parse_nnodes(nnodes: int | str) -> tuple[int, int]:
    """``2`` or ``"2"`` (fixed), or ``"1:4"`` (elastic, min:max), as torchrun's --nnodes."""
    try:
        low, _, high = str(nnodes).partition(":")
        min_nodes, max_nodes = int(low), int(high or low)
    except ValueError:
        min_nodes = max_nodes = 0
    if isinstance(nnodes, bool) or not 1 <= min_nodes <= max_nodes:
        raise ValueError(f"nnodes={nnodes!r}: expected a whole number of at least 1, or 'MIN:MAX'")
    return min_nodes, max_nodes


@contextmanager
def _worker_defaults(defaults: dict[str, str]) -> Iterator[None]:
    """Environment variables the workers inherit while the job runs, each unless the user set it already."""
    added = {name: value for name, value in defaults.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _worker_failed(failed: Any) -> WorkerFailedError:
    """The root cause among the failed workers, whatever order they exited in.

    A rank's error record (the file torch's ``record`` writes before the interpreter exits) outranks its exit code:
    the rank that raised may still be exiting when a peer, whose collective broke because of it, has already died
    and the agent has stopped the raiser with SIGTERM. So: a recorded exception of the user's first; then a death no
    record explains (SIGKILL, an exit code); then a recorded consequence (a failed collective names the call that
    could not complete), a collective that timed out before one that broke because its peer left (the rank that
    timed out leaves at once, so its peer's record can be written first); last a rank the agent stopped with SIGTERM
    before it recorded anything. Among equals, the earliest.
    """
    failures = [(rank, failure, *_message_and_traceback(failure)) for rank, failure in failed.failures.items()]
    rank, failure, message, traceback = min(
        failures, key=lambda f: (_blame_order(f[1], f[2]), f[1].timestamp, _error_file_time(f[1]), f[0])
    )
    if len(failures) > 1:
        message += f" ({len(failures) - 1} other rank(s) failed as well)"
    return WorkerFailedError(rank, failure.local_rank, failure.pid, failure.exitcode, message, traceback)


# Errors a rank raises because another rank failed first (see collectives.CollectiveError).
CONSEQUENCES = ("CollectiveError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError")


def _blame_order(failure: Any, message: str) -> int:
    from gpulayer.runtime.collectives import timed_out_in_record  # torch is loaded by now: a job failed

    recorded = isinstance(failure.message, dict)
    if recorded:
        if not message.startswith(CONSEQUENCES):
            return 0
        return 2 if timed_out_in_record(message) else 3
    return 4 if failure.exitcode == -signal.SIGTERM else 1


def _message_and_traceback(failure: Any) -> tuple[str, str | None]:
    data = failure.message
    if isinstance(data, dict):  # written by torch's error handler: the exception and the worker's traceback
        return str(data.get("message", "")), data.get("extraInfo", {}).get("py_callstack")
    return str(data), None


def _error_file_time(failure: Any) -> int:
    try:
        return os.stat(failure.error_file).st_mtime_ns
    except OSError:
        return 0


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
