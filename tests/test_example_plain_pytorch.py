"""docs/examples/plain_pytorch.py trains alone and under `gpulayer launch`; rank 0 saves what all ranks agreed on."""

import sys
from pathlib import Path

import pytest
import torch

from gpulayer.runtime.testing import clean_environment, run_command

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "docs/examples/plain_pytorch.py"


def _run(*argv, timeout):
    finished = run_command([sys.executable, *argv], timeout=timeout, env=clean_environment(), cwd=str(ROOT))
    assert finished.returncode == 0, finished.stderr
    return finished.stdout


def _final(path):
    final = torch.load(path, weights_only=True)  # plain tensors and numbers: loads without pickled code
    assert sorted(final["model"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert not Path(f"{path}.partial").exists()
    return final


def test_one_process_trains_until_the_target_loss_and_saves_the_weights(tmp_path):
    out = tmp_path / "final.pt"
    stdout = _run(SCRIPT, "--seed", "0", "--accelerator", "cpu", "--out", str(out), timeout=120)
    final = _final(out)
    losses = final["val_losses"]
    assert len(losses) < 30, "the early stop never fired"  # seed 0 reaches the target in about 12 epochs
    assert losses[-1] <= 0.01 < losses[0]
    assert final["seed"] == 0
    assert final["ranks"] == [(0, len(losses), sum(t.double().sum().item() for t in final["model"].values()))]
    assert stdout.count("\nepoch ") == len(losses)
    assert "Placement(rank 0/1" in stdout and f"saved {out}" in stdout


@pytest.mark.multiprocess
def test_two_ranks_share_rank_0s_seed_and_end_with_the_same_weights(tmp_path):
    out = tmp_path / "final.pt"
    # No --seed: rank 0 draws one and broadcasts it.
    launch = ["-m", "gpulayer.runtime", "launch", "--nproc-per-node", "2"]
    stdout = _run(*launch, SCRIPT, "--accelerator", "cpu", "--out", str(out), timeout=240)
    final = _final(out)
    losses = final["val_losses"]
    assert losses[-1] < losses[0] / 3, losses
    # (seed, epochs run, sum of the weights) from each rank, gathered at the end: both match what rank 0 saved.
    weights = sum(tensor.double().sum().item() for tensor in final["model"].values())
    assert final["ranks"] == [(final["seed"], len(losses), weights)] * 2
    # Rank 0 alone prints: one header, one line per epoch.
    assert stdout.count("Placement(") == 1 and "Placement(rank 0/2" in stdout
    assert stdout.count("\nepoch ") == len(losses)


def test_the_allreduce_demo_sums_over_its_one_rank():
    stdout = _run("docs/examples/allreduce_demo.py", timeout=120)
    assert stdout.strip().endswith("from in-process): sum over ranks = 1.0")
