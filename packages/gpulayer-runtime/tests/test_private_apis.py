"""The private API gpulayer-runtime relies on, pinned (ARCHITECTURE.md lists it with the trainer's)."""

import sys

from gpulayer.runtime.testing import clean_environment, run_command

# What worker.end_now does: the atexit handlers, then an exit without the interpreter's teardown.
ENDS_NOW = """
import atexit, os, sys
atexit.register(print, "registered first")
atexit.register(print, "registered second")
atexit._run_exitfuncs()
print("after the handlers")
sys.stdout.flush()
os._exit(0)
"""


def test_run_exitfuncs():
    done = run_command([sys.executable, "-c", ENDS_NOW], env=clean_environment(), timeout=60)
    # In a child interpreter: run here, it would run (and clear) pytest's and torch's own exit handlers.
    assert (done.returncode, done.stdout.splitlines()) == (
        0,
        ["registered second", "registered first", "after the handlers"],
    ), (
        f"Python {sys.version.split()[0]} no longer has atexit._run_exitfuncs as GPUlayer relies on it (running "
        "every atexit handler, last registered first), which gpulayer/runtime/worker.py's end_now calls before "
        f"os._exit; update worker.py and ARCHITECTURE.md's table of private APIs\n{done.stderr}"
    )
