"""Optuna's Lightning DDP example, small (``started_optuna_script.py``): a study on SQLite storage whose objective fits
with ``strategy="ddp_spawn"``, 2 CPU ranks, and optuna-integration's ``PyTorchLightningPruningCallback`` (Lightning's
class, taken as is by GPUlayer's Trainer). Run by Lightning 2.6 and by GPUlayer at once, each a user's script in its
own process tree: the same trials, parameters, values, intermediate values and pruning."""

from __future__ import annotations

import importlib.util
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpulayer.runtime.testing import clean_environment, ports_below_the_ephemeral_range, run_command

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).with_name("started_optuna_script.py")
DEADLINE_S = 300  # each run is killed with its whole process tree past this


@pytest.fixture(autouse=True)
def _optional_packages() -> None:
    """Skip (without importing them here: the scripts do) where the example's packages are missing."""
    for name in ("lightning", "optuna", "optuna_integration", "sklearn"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"Optuna's Lightning DDP example needs {name}, which is not installed")


def test_optunas_lightning_ddp_example_gives_the_same_study(tmp_path):
    # Lightning's port taken by GPUlayer's ranks' connections in the meantime: see test_started_strategies.py.
    (lightning_port,) = ports_below_the_ephemeral_range(1)

    def run(framework: str):
        argv = [sys.executable, str(SCRIPT), framework, str(tmp_path / framework)]
        port = {"MASTER_PORT": str(lightning_port)} if framework == "lightning" else {}
        return run_command(argv, timeout=DEADLINE_S, env=clean_environment(**port))

    with ThreadPoolExecutor(2) as pool:
        finished = dict(zip(("lightning", "gpulayer"), pool.map(run, ("lightning", "gpulayer")), strict=True))
    records = {}
    for framework, done in finished.items():
        record = tmp_path / framework / "record.json"
        assert done.returncode == 0 and record.exists(), f"{framework} failed:\n{done.stdout[-4000:]}\n{done.stderr}"
        records[framework] = json.loads(record.read_text())
    theirs, ours = records["lightning"], records["gpulayer"]

    assert [t["state"] for t in theirs["trials"]] == ["COMPLETE", "PRUNED"]
    assert len(ours["trials"]) == len(theirs["trials"])
    for expected, actual in zip(theirs["trials"], ours["trials"], strict=True):
        assert (actual["number"], actual["state"], actual["params"]) == (
            expected["number"],
            expected["state"],
            expected["params"],
        )
        assert actual["value"] == pytest.approx(expected["value"], rel=1e-6, abs=1e-9)
        assert actual["intermediate_values"].keys() == expected["intermediate_values"].keys()
        for step, value in expected["intermediate_values"].items():
            assert actual["intermediate_values"][step] == pytest.approx(value, rel=1e-6, abs=1e-9), step
        # What rank 0 of the started ranks stored for the caller's check_pruned: the DDP branch of the callback ran.
        assert actual["system_attrs"].keys() == expected["system_attrs"].keys()
        assert actual["system_attrs"].get("ddp_pl:pruned") == expected["system_attrs"].get("ddp_pl:pruned")
        assert actual["system_attrs"].get("ddp_pl:epoch") == expected["system_attrs"].get("ddp_pl:epoch")
    # The second trial pruned once it reported epoch 1, by the callback's DDP branch, in both.
    pruned = ours["trials"][1]
    assert list(pruned["intermediate_values"]) == ["0", "1"]
    assert pruned["system_attrs"]["ddp_pl:pruned"] is True and pruned["system_attrs"]["ddp_pl:epoch"] == 1
    assert list(ours["trials"][0]["intermediate_values"]) == ["0", "1", "2"]
    assert ours["callback_metrics"] == theirs["callback_metrics"] == [["hp_metric", "val_acc"]] * 2
