"""World size is a placement, not a different model: 2 ranks of batch b train like 1 process of batch 2b, and a
checkpoint written at one world size resumes at the other.

The ranks read fixed, interleaved shards (``use_distributed_sampler=False``, rank r takes samples r, r+2, ...),
so step k of the two ranks together sees exactly the samples that step k of one process with twice the batch
sees, and DDP's mean of the two per-rank mean losses is that process's mean loss.
"""

import pytest

from .conftest import assert_same_weights, train

pytestmark = pytest.mark.multiprocess

COMMON = {"use_distributed_sampler": False, "shuffle": False, "max_epochs": 2, "sync": True}
TWO_RANKS = {**COMMON, "devices": 2, "batch_size": 4}
ONE_PROCESS = {**COMMON, "devices": 1, "batch_size": 8}
FLOAT_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted")
    return {
        "two": train("gpulayer", folder / "two", **TWO_RANKS),
        "one": train("gpulayer", folder / "one", **ONE_PROCESS),
    }


def test_two_ranks_of_batch_b_train_like_one_process_of_batch_2b(uninterrupted):
    two, (one,) = uninterrupted["two"], uninterrupted["one"]
    assert [r["global_step"] for r in two] == [one["global_step"]] * 2 == [16, 16]
    assert sorted(two[0]["seen"][0] + two[1]["seen"][0]) == one["seen"][0] == list(range(8))
    for rank in two:
        assert_same_weights(one["weights"], rank["weights"], atol=FLOAT_TOLERANCE)
    # The synced epoch mean over both ranks is the one process's epoch mean (equal batch sizes).
    assert two[0]["callback_metrics"]["train_loss_sync_epoch"] == pytest.approx(
        one["callback_metrics"]["train_loss_epoch"], rel=1e-5
    )


@pytest.mark.parametrize(("first", "then"), [("two", "one"), ("one", "two")])
def test_a_checkpoint_resumes_at_the_other_world_size(tmp_path, uninterrupted, first, then):
    ckpt = tmp_path / "epoch1.ckpt"
    options = {"two": TWO_RANKS, "one": ONE_PROCESS}
    started = train("gpulayer", tmp_path / "first", **{**options[first], "max_epochs": 1, "save": str(ckpt)})
    assert started[0]["global_step"] == 8 and ckpt.is_file()
    resumed = train("gpulayer", tmp_path / "then", **{**options[then], "ckpt_path": str(ckpt)})
    for rank, record in enumerate(resumed):
        assert (record["global_step"], record["current_epoch"]) == (16, 2)
        assert record["seen"] == uninterrupted[then][rank]["seen"][8:]  # the second epoch only, on the same shard
        assert_same_weights(uninterrupted[then][0]["weights"], record["weights"], atol=FLOAT_TOLERANCE)
