"""``DDPStrategy(async_save=True)`` on 2 gloo ranks: rank 0 writes the checkpoint callback's files behind training,
the same files with the same contents as a synchronous run; a write that fails on rank 0 fails ``fit`` on both
ranks, each naming the cause or where it is named."""

import pytest
import torch

from gpulayer.trainer.checkpoint import checkpoint_io

from .conftest import records, run_script, train

pytestmark = pytest.mark.multiprocess


def _checkpoints(folder):
    """Each checkpoint file under ``folder``: its weights, optimizer states and counters."""
    found = {}
    for path in sorted(folder.rglob("*.ckpt")):
        checkpoint = checkpoint_io.load(path)
        found[path.relative_to(folder).as_posix()] = (
            checkpoint["state_dict"],
            checkpoint["optimizer_states"],
            checkpoint["global_step"],
            checkpoint["epoch"],
        )
    return found


def _same(expected, actual):
    assert type(expected) is type(actual)
    if isinstance(expected, torch.Tensor):
        assert torch.equal(expected, actual)
    elif isinstance(expected, dict):
        assert expected.keys() == actual.keys()
        for key in expected:
            _same(expected[key], actual[key])
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual)
        for one, other in zip(expected, actual, strict=True):
            _same(one, other)
    else:
        assert expected == actual


def test_rank_zero_writes_behind_training_the_files_a_synchronous_run_writes(tmp_path):
    runs = {}
    for async_save in (False, True):
        out = tmp_path / f"async_{async_save}"
        ranks = train("gpulayer", out, checkpoint=True, max_epochs=3, root=str(out / "root"), async_save=async_save)
        runs[async_save] = (ranks, _checkpoints(out / "root"))
    (sync_ranks, sync_files), (async_ranks, async_files) = runs[False], runs[True]
    assert list(async_files) == list(sync_files) == ["checkpoints/epoch=2-step=24.ckpt"]
    _same(sync_files, async_files)
    for ours, theirs in zip(async_ranks, sync_ranks, strict=True):
        _same(theirs["weights"], ours["weights"])


def test_a_write_that_fails_on_rank_zero_fails_fit_on_both_ranks(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "checkpoints").write_text("a file where the checkpoint folder goes")
    finished = run_script("gpulayer", tmp_path, checkpoint=True, root=str(root), async_save=True)
    output = f"{finished.stdout}\n{finished.stderr}"
    assert finished.returncode == 1, output
    assert "epoch=0-step=8.ckpt" in finished.stderr and "checkpoints" in finished.stderr, output
    assert "failed on global rank 0" in finished.stderr or "[rank0]" in finished.stderr, output
    assert records(tmp_path) == [], "no rank should have finished training"
