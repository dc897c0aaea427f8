"""SIGTERM during fit: the step finishes, hpc_ckpt_1.ckpt is written, the process exits 143, and fit(ckpt_path="hpc")
ends with the weights of an uninterrupted run."""

import sys
import time
from pathlib import Path

import torch

from gpulayer.runtime.testing import run_command

SCRIPT = str(Path(__file__).with_name("_preemption_script.py"))


def _run(root: Path, *args: str):
    started = time.monotonic()
    finished = run_command([sys.executable, SCRIPT, str(root), *args], timeout=120)
    return finished, time.monotonic() - started


def test_sigterm_saves_a_checkpoint_exits_143_and_resumes_exactly(tmp_path, outcome):
    uninterrupted, _ = _run(tmp_path / "uninterrupted", "0")
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    stopped, seconds = _run(tmp_path / "preempted", "11")
    assert stopped.returncode == 143, stopped.stderr
    assert (tmp_path / "preempted" / "hpc_ckpt_1.ckpt").is_file()
    assert not (tmp_path / "preempted" / "final.pt").exists()  # fit ended at the SIGTERM
    saved = torch.load(tmp_path / "preempted" / "hpc_ckpt_1.ckpt", weights_only=True)
    assert saved["global_step"] == 11  # the step that was running finished, none after it
    resumed, _ = _run(tmp_path / "preempted", "0", "hpc")
    assert resumed.returncode == 0, resumed.stderr
    expected = torch.load(tmp_path / "uninterrupted" / "final.pt", weights_only=True)
    actual = torch.load(tmp_path / "preempted" / "final.pt", weights_only=True)
    assert actual["global_step"] == expected["global_step"] == 24
    for name, weight in expected["weights"].items():
        torch.testing.assert_close(actual["weights"][name], weight, rtol=0, atol=0)
    outcome(
        "Preemption and restart",
        "SIGTERM to a one-process fit at step 11",
        exit_status=stopped.returncode,
        checkpoint_step=saved["global_step"],
        seconds_to_exit=round(seconds, 1),
        data_lost="none",
        result="hpc_ckpt_1.ckpt written at step 11, exit 143; fit(ckpt_path='hpc') ends with identical weights",
    )
