"""A process closes its group at exit only when it ends cleanly: checked on real interpreter exits."""

import subprocess
import sys

import pytest

REGISTER = """
import sys
from gpulayer.runtime import clean_exit
clean_exit.close_at_clean_exit(lambda: print("closed", flush=True))
"""


@pytest.mark.parametrize(
    ("ending", "closed"),
    [
        ("pass", True),
        ("sys.exit(0)", True),
        ("raise ValueError('boom')", False),
        ("clean_exit.mark_failed()", False),
    ],
)
def test_close_runs_at_exit_unless_the_process_failed(ending, closed):
    done = subprocess.run([sys.executable, "-c", REGISTER + ending], capture_output=True, text=True, timeout=60)
    assert ("closed" in done.stdout) is closed, done.stderr
    assert (done.returncode == 0) is (ending != "raise ValueError('boom')")


def test_the_previous_excepthook_still_reports_the_error():
    done = subprocess.run(
        [sys.executable, "-c", REGISTER + "raise ValueError('boom')"], capture_output=True, text=True, timeout=60
    )
    assert "ValueError: boom" in done.stderr
