"""docs/examples/datamodule.py runs the DataModule lifecycle on one process and on two (DDP the Trainer starts)."""

import re
import sys
from pathlib import Path

import pytest
import torch

from gpulayer.runtime.testing import clean_environment, run_command

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "docs/examples/datamodule.py"
LIFECYCLE = ", ".join(f"prepare_data, setup({stage}), teardown({stage})" for stage in ("fit", "test", "predict"))
TEST_SAMPLES = 600  # 15% of the 4000 samples in blobs.pt
CHANCE = 0.25  # four classes


def _run(tmp_path, *flags, timeout):
    argv = [sys.executable, SCRIPT, "--data-dir", str(tmp_path / "data"), "--root-dir", str(tmp_path / "root")]
    finished = run_command(
        [*argv, "--accelerator", "cpu", *flags], timeout=timeout, env=clean_environment(), cwd=str(ROOT)
    )
    assert finished.returncode == 0, finished.stderr
    return finished.stdout


def _check(tmp_path, stdout, world_size):
    # prepare_data ran before each of fit, test and predict, but wrote the file once, on one rank.
    assert stdout.count("prepare_data: wrote") == 1
    data = torch.load(tmp_path / "data" / "blobs.pt")
    assert f"hooks on rank 0: {LIFECYCLE}\n" in stdout
    assert stdout.count("hooks on rank 0") == 1  # rank 0 alone prints
    test_acc = float(re.search(rf"test accuracy (\S+) on {world_size} rank\(s\)", stdout).group(1))
    assert test_acc > 3 * CHANCE
    # Every test sample predicted once, whichever rank predicted it, and mostly right.
    predictions = torch.load(tmp_path / "root" / "lightning_logs" / "version_0" / "predictions.pt")
    assert len(predictions["index"]) == TEST_SAMPLES == len(predictions["index"].unique())
    right = (predictions["class"] == data["labels"][predictions["index"]]).float().mean().item()
    assert right > 3 * CHANCE
    assert list((tmp_path / "root" / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt"))


def test_one_process_prepares_the_data_once_and_runs_every_stage(tmp_path):
    stdout = _run(tmp_path, "--max-epochs", "2", timeout=120)
    _check(tmp_path, stdout, world_size=1)


@pytest.mark.multiprocess
def test_two_processes_prepare_the_data_once_and_predict_every_sample_once(tmp_path):
    stdout = _run(tmp_path, "--max-epochs", "2", "--devices", "2", timeout=240)
    _check(tmp_path, stdout, world_size=2)
