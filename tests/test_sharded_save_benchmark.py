"""The sharded-save benchmark runs end to end on a tiny model (``--quick``) and writes figures that hold together."""

import json
import sys
from pathlib import Path

import pytest

from gpulayer.runtime.testing import clean_environment, run_command

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "sharded_save" / "sharded_save.py"


@pytest.mark.multiprocess
def test_the_sharded_save_benchmark_times_every_save_of_every_way(tmp_path):
    pytest.importorskip("gpulayer.fsdp")
    argv = [sys.executable, str(SCRIPT), "--quick", "--timeout", "60", "--out", str(tmp_path)]
    finished = run_command(argv, timeout=90, env=clean_environment(CUDA_VISIBLE_DEVICES=""))
    assert finished.returncode == 0, finished.stderr
    result = json.loads((tmp_path / "sharded_save.json").read_text())
    ways, full_state = result["ways"], result["model"]["full state bytes"]
    assert list(ways) == ["no saves", "full", "sharded", "sharded, async"]
    assert "rank 0" not in ways["no saves"]
    for name in ("full", "sharded", "sharded, async"):
        way = ways[name]
        # Every save is on disk (the full state, weights and AdamW's moments, at the least) and was timed on both ranks.
        assert len(way["checkpoint bytes"]) == result["saves per way"], name
        assert all(size >= full_state for size in way["checkpoint bytes"]), (name, way["checkpoint bytes"])
        assert isinstance(way["lost per save, seconds"], float), name
        for rank in ("rank 0", "rank 1"):
            saves = way[rank]["each"]
            assert [save["step"] for save in saves] == [2, 4], (name, rank)
            assert all(0 < save["blocking"] <= save["in place"] for save in saves), (name, rank, saves)
            assert way[rank]["memory rise to return, MB"]["max"] >= 0
        # A synchronous save is in place when it returns. (Whether an asynchronous one is still being written when
        # it returns depends on timing, so it is not asserted.)
        if name != "sharded, async":
            assert not any(save["in the background"] for rank in ("rank 0", "rank 1") for save in way[rank]["each"])
    assert not (set(tmp_path.iterdir()) - {tmp_path / "sharded_save.json", tmp_path / "sharded_save.md"})
    table = (tmp_path / "sharded_save.md").read_text()
    assert "| sharded, async | 1 |" in table and "| no saves |" in table
