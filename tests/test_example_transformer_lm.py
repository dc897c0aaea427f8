"""docs/examples/transformer_lm.py trains, keeps the two best checkpoints, follows its learning-rate schedule and
learns: a few optimizer steps of the real script, checked through the files it leaves."""

import csv
import math
import re
import sys
from pathlib import Path

import pytest

from gpulayer.runtime.testing import clean_environment, run_command

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "docs/examples/transformer_lm.py"
PEAK_LR, MIN_LR_RATIO = 1e-2, 0.1  # TransformerLM's defaults
MAX_STEPS, WARMUP_STEPS = 8, 2
ACCUMULATE = 4  # the script's default: validating every 8 batches is every 2 optimizer steps


def _train(tmp_path, *flags, timeout=120):
    argv = [sys.executable, SCRIPT, "--root-dir", str(tmp_path), "--accelerator", "cpu", "--seed", "0"]
    argv += ["--max-steps", str(MAX_STEPS), "--warmup-steps", str(WARMUP_STEPS)]
    argv += ["--val-check-interval", str(2 * ACCUMULATE), "--log-every-n-steps", "1", *flags]
    finished = run_command(argv, timeout=timeout, env=clean_environment(), cwd=str(ROOT))
    assert finished.returncode == 0, finished.stderr
    return finished.stdout


def _check(tmp_path, stdout):
    version = tmp_path / "lightning_logs" / "version_0"
    with open(version / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    val = [(int(row["step"]), float(row["val_loss"])) for row in rows if row["val_loss"]]
    train = [float(row["train_loss"]) for row in rows if row["train_loss"]]
    # LearningRateMonitor writes a row on each batch of an accumulation window (as Lightning does): one value a step.
    lr = dict(sorted({int(row["step"]): float(row["lr-AdamW"]) for row in rows if row["lr-AdamW"]}.items()))

    # Validation every 2 optimizer steps, and the loss fell well below a uniform guess over the 28 characters.
    assert [step for step, _ in val] == [1, 3, 5, 7]
    assert val[0][1] < math.log(28)
    assert val[-1][1] < 0.9 * val[0][1]
    assert train[-1] < train[0] - 0.5

    # The schedule moved once per optimizer step: linear warmup to the peak, then cosine down to its floor, which
    # it reaches on the last step (stepped once per batch, it would peak at step 0 and sit at the floor).
    assert list(lr) == list(range(MAX_STEPS))
    values = list(lr.values())
    assert values[:WARMUP_STEPS] == pytest.approx([PEAK_LR * (step + 1) / WARMUP_STEPS for step in range(WARMUP_STEPS)])
    assert all(values[step] > values[step + 1] for step in range(WARMUP_STEPS - 1, MAX_STEPS - 1))
    assert values[-1] == pytest.approx(PEAK_LR * MIN_LR_RATIO)

    # Exactly the two best validations kept (save_top_k=2), plus last.ckpt.
    files = {path.name for path in (version / "checkpoints").iterdir()}
    assert "last.ckpt" in files and len(files) == 3, files
    top_k = files - {"last.ckpt"}
    kept = sorted(float(re.fullmatch(r"step=\d+-val_loss=(\d+\.\d{4})\.ckpt", name).group(1)) for name in top_k)
    assert kept == sorted(round(loss, 4) for _, loss in sorted(val, key=lambda v: v[1])[:2])

    # The summary names the best of them and samples from it.
    best_path = re.search(r"^best checkpoint: (.+)$", stdout, re.M).group(1)
    assert Path(best_path).parent == version / "checkpoints" and Path(best_path).exists()
    assert float(re.search(r"^best val_loss: (\S+)", stdout, re.M).group(1)) == round(min(v for _, v in val), 4)
    assert re.search(r"^greedy sample: '\\n.{20,}'$", stdout, re.M)


def test_a_few_steps_keep_the_two_best_checkpoints_follow_the_schedule_and_lower_the_loss(tmp_path):
    _check(tmp_path, _train(tmp_path))


@pytest.mark.multiprocess
def test_two_processes_train_as_ddp_and_rank_zero_alone_reports(tmp_path):
    stdout = _train(tmp_path, "--devices", "2", timeout=240)
    assert stdout.count("best checkpoint:") == 1
    _check(tmp_path, stdout)
