"""How a launched worker ends: it records and reports a failure, cleans up as Python does at exit (threads, atexit
handlers, open files), then ends without the interpreter's teardown; ``sys.exit`` keeps Python's own exit."""

import json
import sys

from gpulayer.runtime.testing import clean_environment, run_command

TORN_DOWN = """
import atexit, os, sys, threading

class TornDown:
    def __del__(self, write=os.write):  # os.write bound now: the teardown may have cleared the module
        write(1, b"module teardown ran\\n")

os.kept_till_teardown = TornDown()  # held by a module: only the interpreter's teardown finalizes it
"""
FAILING = (
    TORN_DOWN
    + """
error_file = os.environ["TORCHELASTIC_ERROR_FILE"]
atexit.register(lambda: print("atexit ran; recorded before:", os.path.exists(error_file), flush=True))
reported = threading.Event()
report = sys.excepthook
sys.excepthook = lambda *error: (reported.set(), report(*error))
late = threading.Thread(target=lambda: (reported.wait(), print("thread finished", flush=True)))  # after the report
late.start()
print("partial line without a newline", end="")
raise ValueError("boom in the script")
"""
)


def test_a_failed_script_is_recorded_reported_and_ended_without_the_interpreters_teardown(tmp_path):
    script, error_file = tmp_path / "failing.py", tmp_path / "error.json"
    script.write_text(FAILING)
    env = clean_environment(TORCHELASTIC_ERROR_FILE=str(error_file))
    done = run_command([sys.executable, "-m", "gpulayer.runtime.worker", str(script)], env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" in done.stderr and "ValueError: boom in the script" in done.stderr
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["message"] == "ValueError: boom in the script"
    lines = done.stdout.splitlines()
    # As at any exit: non-daemon threads are waited for, then atexit handlers run, and output is flushed.
    assert lines == ["partial line without a newlinethread finished", "atexit ran; recorded before: True"], lines
    assert "module teardown ran" not in done.stdout


def test_a_finished_script_ends_with_status_0_its_open_files_flushed_and_no_teardown(tmp_path):
    script, written = tmp_path / "finishing.py", tmp_path / "unclosed.txt"
    script.write_text(
        TORN_DOWN
        + f"results = open({str(written)!r}, 'w')\n"
        + "results.write('written, never closed')  # left in the buffer: the end must flush it\n"
        + "atexit.register(lambda: print('atexit ran', flush=True))\n"
    )
    env = clean_environment(TORCHELASTIC_ERROR_FILE=str(tmp_path / "error.json"))
    done = run_command([sys.executable, "-m", "gpulayer.runtime.worker", str(script)], env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["atexit ran"]
    assert written.read_text() == "written, never closed"
    assert not (tmp_path / "error.json").exists()


def test_a_script_that_exits_by_itself_keeps_its_status_and_the_full_teardown(tmp_path):
    script = tmp_path / "exiting.py"
    script.write_text(TORN_DOWN + "sys.exit(3)\n")
    env = clean_environment(TORCHELASTIC_ERROR_FILE=str(tmp_path / "error.json"))
    done = run_command([sys.executable, "-m", "gpulayer.runtime.worker", str(script)], env=env, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "module teardown ran" in done.stdout
    assert not (tmp_path / "error.json").exists()
