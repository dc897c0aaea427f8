"""The harness itself: a failing or hung rank fails the test within its deadline and leaves no process."""

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from gpulayer.runtime.testing import (
    RankFailedError,
    clean_environment,
    is_alive,
    ports_below_the_ephemeral_range,
    run_command,
    run_ranks,
)

pytestmark = pytest.mark.multiprocess


def _write_pid_then(runtime, folder, what):
    Path(folder, f"pid{runtime.global_rank}").write_text(str(os.getpid()))
    if runtime.global_rank == 1 and what == "raise":
        raise KeyError("rank 1 failed on purpose")
    if what == "hang":
        signal.pause()  # never returns: only the harness's deadline ends this rank
    return runtime.global_rank


class Seven:
    """A class of this test module: a rank can unpickle it only once the module's package is known there."""

    value = 7


def _value_of(runtime, cls):
    return cls.value


def _pids(folder):
    return [int(path.read_text()) for path in Path(folder).glob("pid*")]


def test_a_raising_rank_fails_with_its_traceback(tmp_path):
    with pytest.raises(RankFailedError, match=r"(?s)rank 1 raised:.*KeyError: 'rank 1 failed on purpose'"):
        run_ranks(_write_pid_then, str(tmp_path), "raise", world_size=2)
    assert not [pid for pid in _pids(tmp_path) if is_alive(pid)]


def test_arguments_may_hold_the_test_modules_own_classes():
    # pytest's importlib mode names this module after its folders, which a rank cannot import by that name
    assert run_ranks(_value_of, Seven) == [7, 7]


def test_hung_ranks_are_killed_at_the_deadline(tmp_path):
    # The deadline counts from the spawn: it must leave a loaded 2-core machine time to start two ranks
    # (import torch, join the group) before they hang, or they are killed before writing their pids.
    start = time.monotonic()
    with pytest.raises(RankFailedError, match=r"ranks \[0, 1\] did not finish within 20 s"):
        run_ranks(_write_pid_then, str(tmp_path), "hang", world_size=2, timeout=20)
    assert time.monotonic() - start < 45
    assert len(_pids(tmp_path)) == 2
    assert not [pid for pid in _pids(tmp_path) if is_alive(pid)]


def test_a_command_past_its_deadline_is_killed_with_its_descendants(tmp_path):
    pid_file = tmp_path / "grandchild"
    parent = (
        "import subprocess, sys, signal; "
        "child = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); signal.pause()"
    )
    with pytest.raises(RankFailedError, match="did not finish within 5 s"):
        run_command([sys.executable, "-c", parent], timeout=5)
    assert not is_alive(int(pid_file.read_text()))


def test_a_late_command_and_its_descendants_print_their_stacks_one_by_one_before_they_are_killed():
    # What a hang in CI leaves to read: where each process of the tree waited.
    parent = (  # it waits on its own, not for its child: the child's end (stacks first) must not end it
        "import signal, subprocess, sys\n"
        "def start_child_then_wait():\n"
        "    subprocess.Popen([sys.executable, '-c', 'import signal\\ndef wait_in_child(): signal.pause()\\n"
        "wait_in_child()'])\n"
        "    signal.pause()\n"
        "start_child_then_wait()\n"
    )
    with pytest.raises(RankFailedError, match="did not finish within 5 s") as raised:
        run_command([sys.executable, "-c", parent], timeout=5, env=clean_environment())
    stacks = str(raised.value).split("Fatal Python error: Aborted")[1:]
    assert len(stacks) == 2
    assert "in wait_in_child" in stacks[0] and "in start_child_then_wait" not in stacks[0]  # the child first, whole
    assert "in start_child_then_wait" in stacks[1]


def test_ports_below_the_ephemeral_range_are_distinct_free_and_never_the_oss_own():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = ports_below_the_ephemeral_range(3)
    assert len(set(ports)) == 3 and all(10000 <= port < low for port in ports)
    for port in ports:
        with socket.socket() as server:
            server.bind(("", port))
