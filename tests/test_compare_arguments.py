"""compare.py refuses a bad selection, and --readme outside a full run, before it measures anything."""

import sys
from pathlib import Path

import pytest

from gpulayer.runtime.testing import run_command

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "lightning_comparison" / "compare.py"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["--workloads", "mlp,nope"], "--workloads: unknown 'nope'; accepted: 'mlp', "),
        (["--variants", "gpulayer,lightning"], "--variants gpulayer,lightning: raw must be among them"),
        (["--placements", "2 processes"], "--placements: unknown '2 processes'; accepted: '1 process', "),
        (["--quick", "--readme"], "--readme: the README's table quotes the committed results.json"),
        (["--workloads", "mlp", "--write-baseline"], "--write-baseline: a selection measures part"),
    ],
)
def test_a_bad_command_line_is_refused_before_any_work(tmp_path, arguments, error):
    finished = run_command([sys.executable, str(SCRIPT), *arguments, "--out", str(tmp_path / "out")], timeout=120)
    assert finished.returncode == 2 and error in finished.stderr, finished.stderr
    assert not (tmp_path / "out").exists()
