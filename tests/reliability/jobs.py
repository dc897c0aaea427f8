"""Jobs of ``_faults_script.py`` run as a user runs them (``python script.py``, or under ``gpulayer launch`` with
flags), killed with their whole process tree past ``JOB_DEADLINE_S``, with every process they started recorded
(pid and start time, so that a reused pid is not taken for a survivor) to be checked once the job has ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpulayer.runtime.testing import clean_environment, descendants, is_alive, kill_tree

SCRIPT = Path(__file__).with_name("_faults_script.py")
JOB_DEADLINE_S = 90  # a job still running then is killed with its whole process tree, and its test fails
STEPS_PER_EPOCH = 4  # the script's 32 samples in batches of 4 on 2 ranks; it saves last.ckpt every 4 steps


@dataclass
class Job:
    exit_status: int
    stderr: str
    seconds_to_exit: float | None  # from the fault (the time the script wrote just before it) to the launcher's exit
    processes: dict[int, str]  # every process of the job seen while it ran: pid -> start time
    rank_pids: dict[int, int]
    rank_exit_times: dict[int, float]  # global rank -> when its process was first seen ended (time.time())
    fault_time: float | None

    def seconds_to_rank_exit(self, rank: int) -> float | None:
        """From the fault to the end of ``rank``'s process (within the polling interval), if both were seen."""
        if self.fault_time is None or rank not in self.rank_exit_times:
            return None
        return self.rank_exit_times[rank] - self.fault_time

    @property
    def processes_left(self) -> list[int]:
        return [pid for pid, started in self.processes.items() if is_alive(pid) and _start_time(pid) == started]

    def report(self, rank: int) -> str:
        """What the launcher printed about the job's failure, blaming ``rank`` (empty if it blamed another)."""
        headline = f"gpulayer launch: rank {rank} (local rank {rank}, pid {self.rank_pids.get(rank)}) "
        return headline + self.stderr.partition(headline)[2] if headline in self.stderr else ""


def run_job(out: Path, launcher: list[str] | None = None, **options: object) -> Job:
    """Run the script to its end (killing its tree past the deadline) while recording every process it starts.
    ``launcher``: ``gpulayer launch`` flags to start it with, instead of ``python script.py`` (devices=2)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable] if launcher is None else [sys.executable, "-m", "gpulayer.runtime", "launch", *launcher]
    argv = [*command, str(SCRIPT), str(out), *(f"{key}={value!r}" for key, value in options.items())]
    with open(out / "stdout.txt", "w") as stdout, open(out / "stderr.txt", "w") as stderr:
        process = subprocess.Popen(argv, stdout=stdout, stderr=stderr, env=clean_environment(), start_new_session=True)
    seen: dict[int, str] = {}
    rank_pids: dict[int, int] = {}
    rank_exits: dict[int, float] = {}
    deadline = time.monotonic() + JOB_DEADLINE_S
    try:
        while True:
            for pid in (process.pid, *descendants(process.pid)):
                if pid not in seen and (started := _start_time(pid)) is not None:
                    seen[pid] = started
            rank_pids.update(_rank_pids(out, rank_pids))
            for rank, pid in rank_pids.items():
                if rank not in rank_exits and not _running(pid):
                    rank_exits[rank] = time.time()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.05)
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{argv} ran past {JOB_DEADLINE_S} s; killed\n{_read(out / 'stderr.txt')}")
    finally:
        if process.poll() is None:
            kill_tree(process.pid)
            process.wait()
            for pid, started in seen.items():  # ranks the launcher's death orphaned
                if _start_time(pid) == started:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
    exited = time.time()
    fault = out / "fault_time"
    fault_time = float(fault.read_text()) if fault.exists() else None
    return Job(
        exit_status=process.returncode,
        stderr=_read(out / "stderr.txt"),
        seconds_to_exit=exited - fault_time if fault_time is not None else None,
        processes=seen,
        rank_pids=rank_pids | _rank_pids(out, rank_pids),
        rank_exit_times=rank_exits,
        fault_time=fault_time,
    )


def _rank_pids(out: Path, known: dict[int, int]) -> dict[int, int]:
    """The pids the ranks wrote (``OUT/pid<R>``) that are not yet in ``known``; a file still being written waits."""
    found = {}
    for path in out.glob("pid*"):
        rank = int(path.name.removeprefix("pid"))
        if rank not in known and (text := path.read_text()):
            found[rank] = int(text)
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (ended, not yet reaped by the agent) has ended."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), or None once it is gone."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None once ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
