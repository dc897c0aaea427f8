"""README.md's "Why." table is what compare.py writes from the committed results.json (no benchmark runs here)."""

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPARISON = ROOT / "benchmarks" / "lightning_comparison"
sys.path.insert(0, str(COMPARISON))
from figures import ratio  # noqa: E402
from why_table import END, START, block_of, why_block, with_why_block  # noqa: E402

RESULTS = json.loads((COMPARISON / "results.json").read_text())


def test_the_readme_quotes_the_committed_results():
    assert block_of((ROOT / "README.md").read_text()) == why_block(RESULTS), (
        "README.md's why-table differs from benchmarks/lightning_comparison/results.json: run a full comparison with"
        " --readme (compare.py writes both)"
    )


def test_the_default_install_rows_appear_once_the_results_have_them():
    assert "default install" not in why_block({**RESULTS, "placements": {"1 process": {}}})
    results = copy.deepcopy(RESULTS)
    mlp = results["placements"]["1 process"]["mlp"]
    for name, slower in (("default_install", 1.5), ("default_install_batch_hook", 2.0)):
        timed = results["placements"]["1 process"][name] = copy.deepcopy(mlp)
        for variant in ("gpulayer", "lightning"):
            timed["variants"][variant]["seconds_per_step"] = [
                t * slower for t in mlp["variants"][variant]["seconds_per_step"]
            ]
    block = why_block(results)
    assert "| MLP, default install (checkpoints, CSV logger, `StepLR`, LR monitor), 1 process |" in block
    hook_row = next(line for line in block.splitlines() if line.startswith("| the same with a callback's"))
    doubled = ratio(RESULTS, "1 process", "mlp", "gpulayer") * 2.0
    assert f"({doubled:.2f} x raw)" in hook_row, "the batch hook row's GPUlayer time is twice the MLP's"
    assert block.count("x the raw loop in Lightning's order") == 2 and "(target 1.1)" in block


def test_the_block_is_rewritten_between_its_markers_only():
    readme = f"before\n{START}\nold table\n{END}\nafter\n"
    rewritten = with_why_block(readme, RESULTS)
    assert rewritten == f"before\n{START}\n{why_block(RESULTS)}{END}\nafter\n"
    assert with_why_block(rewritten, RESULTS) == rewritten
    with pytest.raises(ValueError, match="why-table"):
        with_why_block("before\nafter\n", RESULTS)
