"""docs/examples/tensorboard_logger.py: a user's TensorBoard logger in under 40 lines writes the run's scalars,
its hyperparameters and an image, read back with tensorboard's EventAccumulator."""

import ast
import re
import sys
from pathlib import Path

import pytest

from gpulayer.runtime.testing import clean_environment, run_command

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "examples" / "tensorboard_logger.py"


def test_the_logger_class_is_under_forty_lines():
    node = next(n for n in ast.parse(SCRIPT.read_text()).body if getattr(n, "name", "") == "TensorBoardLogger")
    assert node.end_lineno - node.lineno + 1 < 40


def test_the_example_writes_scalars_hparams_and_an_image(tmp_path):
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)  # taken: the logger writes version_1
    argv = [sys.executable, str(SCRIPT), "--root-dir", str(tmp_path)]
    finished = run_command(argv, timeout=120, env=clean_environment(), cwd=str(tmp_path))
    assert finished.returncode == 0, finished.stderr
    assert re.search(r"wrote .*version_1; last train_loss_epoch \d", finished.stdout), finished.stdout
    events = EventAccumulator(str(tmp_path / "lightning_logs" / "version_1"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train_loss_step", "train_loss_epoch", "epoch"} <= set(tags["scalars"])
    assert [event.step for event in events.Scalars("train_loss_epoch")] == [7, 15, 23, 31, 39]
    losses = [event.value for event in events.Scalars("train_loss_epoch")]
    assert losses[-1] < losses[0] / 2
    assert tags["images"] == ["weights"] and "hparams/text_summary" in tags["tensors"]
    assert (tmp_path / "checkpoints").exists() is False  # checkpoints go under the logger's version folder
    assert list((tmp_path / "lightning_logs" / "version_1" / "checkpoints").glob("*.ckpt"))
