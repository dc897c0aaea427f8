"""Harnesses for multi-process tests: ranks joined by a ``FileStore``, and commands that start their own.

Both kill every process they started when the deadline passes or a rank fails, so a test never hangs and
leaves no process behind. Used by the tests of every gpulayer distribution.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import multiprocessing
import os
import pickle
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

from gpulayer.runtime.placement import Placement

DEFAULT_TIMEOUT_S = 60.0


class RankFailedError(AssertionError):
    """A rank raised, exited or outlived the deadline. The message carries its traceback."""


def run_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = DEFAULT_TIMEOUT_S,
    collective_timeout: float | None = None,
    accelerator: str = "cpu",
) -> list[Any]:
    """Call ``fn(runtime, *args)`` on ``world_size`` ranks and return their results in rank order.

    ``collective_timeout`` (seconds) is the process group's timeout; it defaults to ``timeout``. With
    ``accelerator="cuda"`` rank N uses ``cuda:N`` and NCCL.
    ``fn`` and ``args`` must be picklable (a module-level function).
    """
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="gpulayer-ranks-") as folder:
        store_path = os.path.join(folder, "store")
        ranks = [
            context.Process(
                target=_rank_main,
                args=(
                    rank,
                    world_size,
                    accelerator,
                    store_path,
                    collective_timeout or timeout,
                    results,
                    _by_path(fn),
                    pickle.dumps(args),  # read once ``fn``'s module is loaded: args may hold the test's own classes
                ),
                name=f"rank-{rank}",
            )
            for rank in range(world_size)
        ]
        for process in ranks:
            process.start()
        try:
            return _collect(results, ranks, timeout)
        finally:
            for process in ranks:
                process.kill()
                process.join()
            results.close()


def _collect(results: multiprocessing.Queue, ranks: list, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    outcomes: dict[int, Any] = {}
    while len(outcomes) < len(ranks):
        try:
            rank, ok, value = results.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        except Empty:
            dead = [p.name for p in ranks if p.exitcode not in (None, 0)]
            if dead:
                raise RankFailedError(f"{', '.join(dead)} exited without a result") from None
            if time.monotonic() >= deadline:
                pending = sorted(set(range(len(ranks))) - outcomes.keys())
                raise RankFailedError(f"ranks {pending} did not finish within {timeout} s; all ranks killed") from None
            continue
        if not ok:
            raise RankFailedError(f"rank {rank} raised:\n{value}")
        outcomes[rank] = value
    return [outcomes[rank] for rank in range(len(ranks))]


def _rank_main(rank, world_size, accelerator, store_path, collective_timeout, results, fn, args) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch.distributed as dist

    from gpulayer.runtime.runtime import Runtime

    try:
        fn = _load(fn)
        args = pickle.loads(args)
        placement = Placement(
            world_size=world_size,
            global_rank=rank,
            local_rank=rank,
            local_world_size=world_size,
            source="test harness",
            accelerator=accelerator,
        )
        with Runtime(placement, timeout=collective_timeout, store=dist.FileStore(store_path, world_size)) as runtime:
            results.put((rank, True, fn(runtime, *args)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def _by_path(fn: Callable[..., Any]) -> Any:
    """How a rank finds ``fn``: by module and file, since pytest may import test files under unimportable names."""
    if fn.__module__ == "__main__":
        return fn
    return (fn.__module__, inspect.getfile(fn), fn.__qualname__)


def _load(fn: Any) -> Callable[..., Any]:
    if callable(fn):
        return fn
    module_name, path, qualname = fn
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            _register_parents(module_name, path)
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    for name in qualname.split("."):
        module = getattr(module, name)
    return module


def _register_parents(module_name: str, path: str) -> None:
    """Packages for the folders above ``path`` under the names pytest gave them, so that a test module's relative
    imports (``from .conftest import ...``) resolve in a rank as they did in pytest."""
    parents = module_name.split(".")[:-1]
    folder = os.path.dirname(os.path.abspath(path))
    for depth in range(len(parents), 0, -1):
        name = ".".join(parents[:depth])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [folder]
            sys.modules[name] = package
        folder = os.path.dirname(folder)


def ports_below_the_ephemeral_range(count: int) -> list[int]:
    """``count`` distinct free TCP ports below the range the OS hands out for port 0 and outgoing connections. For a
    program that picks a free port, closes it and binds it again seconds later (Lightning's ``MASTER_PORT``): run
    beside other ranks, it can find the OS has meanwhile given its port to one of their connections (EADDRINUSE)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    ports: list[int] = []
    for port in random.Random().sample(range(10000, low), low - 10000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe, contextlib.suppress(OSError):
            probe.bind(("", port))
            ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports below {low}")


def clean_environment(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables (the test process may itself run under one), with one
    OpenMP thread per process, Python's fault handler on (``run_command`` asks a late command for its stacks), and
    ``extra`` on top: for a command that must start its own job."""
    launcher = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_",
        "TORCHELASTIC",
        "SLURM_",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher) and k != "PYTEST_CURRENT_TEST"}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **extra}


def run_command(
    argv: list[str], *, timeout: float = DEFAULT_TIMEOUT_S, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``argv`` to completion and return it; past ``timeout`` kill it and all its descendants, then fail with
    what they printed: under ``PYTHONFAULTHANDLER=1`` (``clean_environment``) that ends with each one's stacks."""
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid, first=signal.SIGABRT)
        stdout, stderr = process.communicate()
        raise RankFailedError(
            f"{argv} did not finish within {timeout} s; it and its descendants were killed\n{stdout}\n{stderr}"
        ) from None
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def kill_tree(pid: int, *, within: float = 10.0, first: signal.Signals | None = None) -> None:
    """SIGKILL ``pid`` and every process below it (workers may sit in sessions of their own), and return once
    they are gone: a signal is delivered asynchronously, and a loaded machine may take a moment to act on it.
    ``first``: a signal sent before, to one process at a time, each given ``within`` to act on it (SIGABRT: a
    process with Python's fault handler prints its stacks, not mixed with another's; none leaves a core file)."""
    victims = [pid, *descendants(pid)]
    for victim in reversed(victims) if first is not None else ():  # the deepest first: a worker may die with its parent
        with contextlib.suppress(ProcessLookupError, PermissionError):
            resource.prlimit(victim, resource.RLIMIT_CORE, (0, 0))
            os.kill(victim, first)
            _wait_for_end([victim], within)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    _wait_for_end(victims, within)


def _wait_for_end(pids: list[int], within: float) -> None:
    deadline = time.monotonic() + within
    while any(is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid``, read from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def is_alive(pid: int) -> bool:
    """True while ``pid`` is a running process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
