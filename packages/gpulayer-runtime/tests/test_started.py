"""start_processes(): ranks this process starts by fork or spawn, joined through its store; a failing or killed rank
ends the call with an error naming it, and no process outlives the call or its caller."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulayer.runtime.started import start_processes
from gpulayer.runtime.testing import clean_environment, is_alive, kill_tree, run_command

SCRIPT = str(Path(__file__).parent / "scripts" / "started_calls.py")
DEADLINE_S = 90
# A killed rank's call must end within this (its peer waits in a collective with a 30-minute timeout).
FAILURE_DEADLINE_S = 20


def _run(*args):
    finished = run_command([sys.executable, SCRIPT, *args], timeout=DEADLINE_S, env=clean_environment())
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout.strip().splitlines()[-1])


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_two_calls_in_one_process_each_form_a_world_through_the_callers_store(method):
    seen = _run("twice", method)
    assert seen["calls"] == [
        {"rank": 0, "world": 2, "sum": 1.0, "source": f"{method} (start_processes)"},
        {"rank": 0, "world": 2, "sum": 21.0, "source": f"{method} (start_processes)"},
    ]
    assert seen["left"] == []


@pytest.mark.multiprocess
def test_ranks_are_forked_before_the_callers_store_exists_so_they_copy_none_of_it():
    # A forked rank copies the caller whole: had the store's server thread been running, it could have held a lock
    # the copy then waited on forever (a run in CI hung so). Its sockets would be in the copy too.
    seen = _run("inherited", "fork")
    assert seen["new_sockets"] == []
    assert seen["left"] == []


@pytest.mark.multiprocess
@pytest.mark.parametrize(("method", "how"), [("fork", "raise"), ("spawn", "kill")])
def test_a_rank_that_raises_or_is_killed_ends_the_call_naming_it(method, how):
    seen = _run(how, method)
    assert seen["rank"] == 1
    assert seen["seconds"] < FAILURE_DEADLINE_S
    if how == "raise":
        assert seen["exitcode"] == 1
        assert seen["cause"] == "ValueError('boom on rank 1')"
        assert "ValueError: boom on rank 1" in seen["traceback"]
        assert seen["message"].startswith("rank 1 (local rank 1, pid ") and seen["message"].endswith(
            "it raised; the other workers were ended"
        )
    else:
        assert seen["exitcode"] == -signal.SIGKILL
        assert "was killed by signal SIGKILL: it ended without its result" in seen["message"]
    assert seen["after"]["sum"] == 1.0
    assert seen["left"] == []


@pytest.mark.multiprocess
def test_the_rank_whose_error_broke_a_collective_is_named_though_its_peer_reported_first():
    seen = _run("consequence", "fork")
    assert (seen["rank"], seen["cause"]) == (1, "ValueError('the real error, on rank 1')")
    assert seen["left"] == []


@pytest.mark.multiprocess
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_no_rank_outlives_a_caller_that_is_killed(method, tmp_path):
    caller = subprocess.Popen(
        [sys.executable, SCRIPT, "hold", method, str(tmp_path)], env=clean_environment(), start_new_session=True
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline and caller.poll() is None:
            time.sleep(0.05)  # polling for the ranks' files, with a deadline
        ranks = [int(path.read_text()) for path in tmp_path.glob("pid*")]
        assert len(ranks) == 2, "the ranks never reported"
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait()
        deadline = time.monotonic() + FAILURE_DEADLINE_S
        while any(is_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in ranks if is_alive(pid)] == []
    finally:
        for pid in [caller.pid, *(int(path.read_text()) for path in tmp_path.glob("pid*"))]:
            kill_tree(pid)
        caller.wait()


@pytest.mark.multiprocess
def test_spawn_from_a_script_without_a_main_guard_fails_with_lightnings_advice(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from gpulayer.runtime.started import start_processes\nstart_processes(print, nprocs=1, start_method='spawn')\n"
    )
    finished = run_command([sys.executable, str(script)], timeout=DEADLINE_S, env=clean_environment())
    assert finished.returncode == 1
    assert (
        'requires that your script guards the main\nfunction with an `if __name__ == "__main__"` clause'
        in finished.stderr
    )
    assert "WorkerFailedError: rank 0 (local rank 0, pid " in finished.stderr


def test_bad_arguments_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="start_method='forkserver': accepted values are 'spawn', 'fork'"):
        start_processes(print, nprocs=2, start_method="forkserver")
    with pytest.raises(ValueError, match="nprocs=0: expected a whole number of at least 1"):
        start_processes(print, nprocs=0, start_method="fork")
