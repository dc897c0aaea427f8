"""Decisions that end work, taken on one rank, end it on every rank at the same step: GPUlayer DDP on 2 processes
(gloo), started as a user starts it (``python train_script.py`` relaunches itself under ``gpulayer launch``).

The loop combines ``should_stop`` across ranks only at sync points: every ``log_every_n_steps`` optimizer
steps, the last batch of an epoch, after validation and at the epoch end (see ``sync_decisions.py``). A stop set
between them takes effect at the next one, so these tests predict the exact step from that rule.

The script's default data: 64 samples in batches of 4, shared by 2 ranks, is 8 batches per rank and epoch.
"""

import math

import pytest

from .conftest import records, run_script, train

pytestmark = pytest.mark.multiprocess

BATCHES_PER_EPOCH = 8


def next_sync_point(steps_done: int, log_every_n_steps: int) -> int:
    """The ``global_step`` after the first sync point at or past ``steps_done`` optimizer steps (no accumulation)."""
    log_step = math.ceil(steps_done / log_every_n_steps) * log_every_n_steps
    epoch_end = math.ceil(steps_done / BATCHES_PER_EPOCH) * BATCHES_PER_EPOCH
    return min(log_step, epoch_end)


def is_sync_point(global_step: int, log_every_n_steps: int) -> bool:
    return global_step % log_every_n_steps == 0 or global_step % BATCHES_PER_EPOCH == 0


def assert_ranks_agree(ranks: list[dict]) -> None:
    """Both ranks recorded, stopped at the same place and, as DDP keeps them, hold the same weights."""
    assert [record["world_size"] for record in ranks] == [2, 2], "expected a record from each of 2 ranks"
    first, second = ranks
    assert (first["global_step"], first["current_epoch"]) == (second["global_step"], second["current_epoch"])
    assert len(first["seen"]) == len(second["seen"]) == first["global_step"]
    assert first["should_stop"] == second["should_stop"]
    for name, tensor in first["weights"].items():
        assert tensor.equal(second["weights"][name]), f"{name} differs between the ranks"


def test_should_stop_on_one_rank_stops_both_at_the_next_sync_point(tmp_path):
    # Rank 1 alone sets should_stop in training_step at global_step 4, i.e. during the 5th step. Steps 5 and 6
    # follow on both ranks; the 6th is a log step (6 % 3 == 0), the first sync point, where both stop. Stopping
    # at 5 would be acting on an unagreed value; at 8 (the epoch's end), missing the log-step sync point.
    stop_step, every = 4, 3
    ranks = train("gpulayer", tmp_path, stop_rank=1, stop_step=stop_step, log_every_n_steps=every, max_epochs=2)
    assert_ranks_agree(ranks)
    expected = next_sync_point(stop_step + 1, every)
    assert expected == 6
    assert [record["global_step"] for record in ranks] == [expected, expected]
    assert expected < 2 * BATCHES_PER_EPOCH  # an uninterrupted run takes 16 steps
    assert [record["should_stop"] for record in ranks] == [True, True]
    # The stopped epoch counts as processed (Lightning's rule), and its stop validated first on both ranks.
    assert [record["current_epoch"] for record in ranks] == [1, 1]
    assert all("val_loss" in record["callback_metrics"] for record in ranks)


def test_early_stopping_on_one_rank_stops_both_in_the_same_epoch(tmp_path):
    # "watched" keeps improving on rank 0 (10, 9, 8, ...) and gets worse on rank 1 after epoch 0 (10, 29, ...);
    # with patience=0, rank 1 alone wants to stop at the end of epoch 1, and EarlyStopping makes it unanimous.
    max_epochs = 5
    ranks = train("gpulayer", tmp_path, early_stopping_rank=1, max_epochs=max_epochs)
    assert_ranks_agree(ranks)
    assert [record["current_epoch"] for record in ranks] == [2, 2]
    assert [record["global_step"] for record in ranks] == [2 * BATCHES_PER_EPOCH] * 2
    assert ranks[0]["current_epoch"] < max_epochs
    assert [record["should_stop"] for record in ranks] == [True, True]
    # Each rank kept its own metric: rank 0's was still improving when it stopped.
    assert [record["callback_metrics"]["watched"] for record in ranks] == [9.0, 29.0]


def test_max_time_stops_both_ranks_at_the_same_sync_point(tmp_path):
    # Each step busy-waits 0.25 s, so each rank's Timer has fired by its 4th step (1 s of training) at the
    # latest, on its own clock; the ranks then stop together at the next sync point: step 6 (or 3, if a slow
    # start made a Timer fire by step 3). Without max_time the run would take 3 epochs, 24 steps.
    max_time, step_seconds, every, max_epochs = 1.0, 0.25, 3, 3
    ranks = train(
        "gpulayer",
        tmp_path,
        max_time=max_time,
        step_seconds=step_seconds,
        log_every_n_steps=every,
        max_epochs=max_epochs,
    )
    assert_ranks_agree(ranks)
    stopped_at = ranks[0]["global_step"]
    latest = next_sync_point(math.ceil(max_time / step_seconds), every)
    assert latest == 6
    assert 0 < stopped_at <= latest < max_epochs * BATCHES_PER_EPOCH
    assert is_sync_point(stopped_at, every), f"stopped after step {stopped_at}, which is not a sync point"
    assert [record["should_stop"] for record in ranks] == [True, True]


def test_uneven_shards_run_the_shorter_ranks_batches_and_warn(tmp_path):
    # Without the distributed sampler, rank 0 reads 32 samples (8 batches) and rank 1 two batches fewer (6):
    # both must run 6 per epoch, or rank 0's 7th step would wait forever for rank 1's gradients.
    finished = run_script("gpulayer", tmp_path, use_distributed_sampler=False, uneven=2, max_epochs=2, shuffle=False)
    assert finished.returncode == 0, f"{finished.stdout}\n{finished.stderr}"
    assert "the ranks have different numbers of train batches ([[8], [6]], by rank); every rank runs [6]" in (
        finished.stderr
    )
    ranks = records(tmp_path)
    assert_ranks_agree(ranks)
    assert [record["global_step"] for record in ranks] == [12, 12]
    assert [record["current_epoch"] for record in ranks] == [2, 2]
    assert [record["should_stop"] for record in ranks] == [False, False]
    # Each rank trained on its own shard's first 6 batches, twice (unshuffled).
    for rank, record in enumerate(ranks):
        shard = list(range(rank, 64, 2))
        first_epoch = [shard[i : i + 4] for i in range(0, 24, 4)]
        assert record["seen"] == first_epoch * 2, f"rank {rank}"
