"""launch() and `gpulayer launch` on real processes: results per rank, failures that end the job."""

import json
import sys
from pathlib import Path

import pytest

from gpulayer.runtime import launch
from gpulayer.runtime.testing import is_alive, run_command

pytestmark = pytest.mark.multiprocess

SCRIPTS = Path(__file__).parent / "scripts"
DRIVER = str(SCRIPTS / "launch_driver.py")
RANK_SCRIPT = str(SCRIPTS / "rank_script.py")
# A failing job must end within this, by the promise; the harness kills anything slower.
FAILURE_DEADLINE_S = 30


def _drive(*args):
    finished = run_command([sys.executable, DRIVER, *args], timeout=120)
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout.strip().splitlines()[-1])


def _gpulayer(*args, cwd=None, timeout=120):
    return run_command([sys.executable, "-m", "gpulayer.runtime", *args], timeout=timeout, cwd=cwd)


def _pids(folder):
    return [int(path.read_text()) for path in Path(folder).glob("pid*")]


def test_a_callable_returns_each_ranks_value():
    outcome = _drive("report")
    results = outcome["results"]
    assert sorted(results) == ["0", "1"]
    for rank, seen in results.items():
        # The agent hosts the rendezvous store; on one node it must listen on loopback only (127.0.0.1).
        listens_on = seen.pop("agent_listens_on")
        assert listens_on and set(listens_on) == {"0100007F"}, listens_on
        assert seen == {
            "tag": "hi",
            "rank": int(rank),
            "world_size": 2,
            "source": "torchrun",
            "master_addr": "127.0.0.1",  # the single-node rendezvous listens on loopback
            "sum": 3.0,
        }


@pytest.mark.parametrize(
    ("how", "exitcode", "words"), [("raise", 1, "ValueError: boom on rank 1"), ("kill", -9, "SIGKILL")]
)
def test_a_failing_rank_ends_the_job_naming_it_and_leaves_no_process(tmp_path, how, exitcode, words):
    outcome = _drive(how, str(tmp_path))
    error = outcome["error"]
    assert (error["rank"], error["exitcode"]) == (1, exitcode)
    assert error["message"].startswith("rank 1 (local rank 1, pid ")
    assert words in error["message"]
    if how == "raise":
        assert "Traceback" in error["message"] and "launch_driver.py" in error["message"]
    assert outcome["elapsed"] < FAILURE_DEADLINE_S
    pids = _pids(tmp_path)
    assert len(pids) == 2
    assert not [pid for pid in pids if is_alive(pid)], "a worker outlived the job"


def test_a_hung_rank_surfaces_as_the_collective_timeout_of_its_peer(tmp_path):
    outcome = _drive("hang", str(tmp_path))
    error = outcome["error"]
    assert (error["rank"], error["exitcode"]) == (0, 1)
    assert "CollectiveError: barrier timed out on rank 0, called at " in error["message"]
    assert "launch_driver.py" in error["message"]
    assert outcome["elapsed"] < FAILURE_DEADLINE_S
    assert not [pid for pid in _pids(tmp_path) if is_alive(pid)], "a worker outlived the job"


def test_a_script_runs_on_every_rank_with_its_arguments(tmp_path):
    finished = _gpulayer("launch", "--nproc-per-node", "2", RANK_SCRIPT, str(tmp_path), "--fail-rank", "-1")
    assert finished.returncode == 0, finished.stderr
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["argv"] == [str(tmp_path), "--fail-rank", "-1"]
        assert (seen["rank"], seen["world_size"], seen["local_rank"], seen["source"], seen["sum"]) == (
            rank,
            2,
            rank,
            "torchrun",
            3.0,
        )


def test_a_module_runs_with_dash_m(tmp_path):
    finished = _gpulayer(
        "launch", "--standalone", "--nproc_per_node=2", "-m", "rank_script", str(tmp_path), cwd=SCRIPTS
    )
    assert finished.returncode == 0, finished.stderr
    assert sorted(path.name for path in tmp_path.glob("rank*.json")) == ["rank0.json", "rank1.json"]


def test_a_failing_script_reports_its_rank_and_traceback(tmp_path):
    finished = _gpulayer("launch", "--nproc-per-node", "2", RANK_SCRIPT, str(tmp_path), "--fail-rank", "1")
    assert finished.returncode == 1
    assert "gpulayer launch: rank 1 (local rank 1, pid" in finished.stderr
    assert "ValueError: boom on rank 1" in finished.stderr
    assert "Traceback" in finished.stderr and "rank_script.py" in finished.stderr
    assert not [pid for pid in _pids(tmp_path) if is_alive(pid)]


def test_the_rank_that_raised_is_blamed_even_when_its_peer_dies_first(tmp_path):
    # Rank 1 records its error, then breaks the group and stays alive: rank 0's all-reduce fails and rank 0 exits
    # first, so the agent stops rank 1 with SIGTERM. Its recorded exception, not the exit order, decides the blame.
    finished = _gpulayer("launch", "--nproc-per-node", "2", RANK_SCRIPT, str(tmp_path), "--fail-rank", "1", "--linger")
    assert finished.returncode == 1
    blamed = "gpulayer launch: rank 1 (local rank 1, pid"
    assert blamed in finished.stderr, finished.stderr
    report = finished.stderr[finished.stderr.index(blamed) :]
    assert "was killed by signal SIGTERM: ValueError: boom on rank 1" in report.splitlines()[0], finished.stderr
    assert "CollectiveError: all_reduce failed on rank 0" in finished.stderr, "rank 0 should have died of it first"
    assert not [pid for pid in _pids(tmp_path) if is_alive(pid)]


def test_launch_in_a_placed_process_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="already started"):
        launch(print, nproc_per_node=2)


def test_a_rendezvous_timeout_from_the_command_line_is_accepted(tmp_path):
    finished = _gpulayer("launch", "--nproc-per-node", "2", "--rdzv-conf", "timeout=60", RANK_SCRIPT, str(tmp_path))
    assert finished.returncode == 0, finished.stderr
