"""The prefetch benchmark runs end to end and checks that both settings did the same work (a short run)."""

import json
import sys
from pathlib import Path

from gpulayer.runtime.testing import run_command

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "prefetch" / "prefetch_speedup.py"


def test_the_prefetch_benchmark_writes_its_figures(tmp_path):
    argv = [sys.executable, str(SCRIPT), "--steps", "12", "--rounds", "1", "--out", str(tmp_path)]
    finished = run_command(argv, timeout=120)
    assert finished.returncode == 0, finished.stderr
    result = json.loads((tmp_path / "prefetch.json").read_text())
    assert set(result["ms_per_step"]) == {"prefetch=False", "prefetch=True"} and result["speed_up"] > 0
    assert "Speed-up:" in (tmp_path / "prefetch.md").read_text()
