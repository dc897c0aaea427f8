"""docs/examples/gan.py trains its GAN under manual optimization in one process and on two ranks, and draws it."""

import re
import sys
from pathlib import Path

import pytest

from gpulayer.runtime.testing import clean_environment, run_command

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "docs/examples/gan.py"
BATCHES_PER_EPOCH = 32  # 4096 points in batches of 128


def _run(tmp_path, *flags):
    argv = [sys.executable, SCRIPT, "--accelerator", "cpu", "--root-dir", str(tmp_path), *flags]
    finished = run_command(argv, timeout=240, env=clean_environment(), cwd=str(ROOT))
    assert finished.returncode == 0, finished.stderr
    found = re.search(
        r"global_step (\d+) on (\d) rank\(s\): (\S+) of generated points .*, (\d) of 8 modes", finished.stdout
    )
    assert found, finished.stdout
    assert (tmp_path / "samples.png").stat().st_size > 10_000
    return int(found[1]), int(found[2]), float(found[3]), int(found[4])


def test_one_process_learns_most_modes_of_the_ring(tmp_path):
    global_step, ranks, share, modes = _run(tmp_path)
    assert (global_step, ranks) == (30 * BATCHES_PER_EPOCH * 2, 1)  # two optimizer steps a batch
    # An untrained generator puts none of its points near a mode.
    assert share > 0.3 and modes >= 5


@pytest.mark.multiprocess
def test_two_ranks_train_it_too(tmp_path):
    global_step, ranks, share, modes = _run(tmp_path, "--devices", "2")
    assert (global_step, ranks) == (30 * BATCHES_PER_EPOCH // 2 * 2, 2)
    assert share > 0.2 and modes >= 4
