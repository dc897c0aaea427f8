"""Under ddp_fork and ddp_spawn a rank killed or raising mid-fit ends the call at once with an error naming it, the
other rank is ended, no process is left, and the same process then fits again."""

import json
import signal
import sys
from pathlib import Path

import pytest

from gpulayer.runtime.testing import clean_environment, is_alive, run_command

pytestmark = pytest.mark.multiprocess

SCRIPT = str(Path(__file__).with_name("started_failures_script.py"))
# A failing call must end within this: the other rank waits in a collective whose timeout is 30 minutes.
FAILURE_DEADLINE_S = 20


def test_a_rank_killed_or_raising_mid_fit_ends_the_call_naming_it_and_the_process_fits_again(tmp_path):
    finished = run_command([sys.executable, SCRIPT, str(tmp_path)], timeout=120, env=clean_environment())
    assert finished.returncode == 0, finished.stderr
    seen = json.loads(finished.stdout.strip().splitlines()[-1])
    killed, raised = seen["killed"], seen["raised"]
    assert (killed["rank"], killed["exitcode"], killed["cause"]) == (1, -signal.SIGKILL, None)
    assert (raised["rank"], raised["exitcode"]) == (1, 1)
    assert raised["cause"] == "RuntimeError: injected failure on rank 1 at batch 1"
    for failed in (killed, raised):
        assert failed["status"] == "interrupted"
        assert failed["seconds"] < FAILURE_DEADLINE_S
    assert seen["after"] == {"global_step": 16, "status": "finished"}
    assert seen["left"] == []
    assert not [pid for pid in seen["pids"].values() if is_alive(pid)]
