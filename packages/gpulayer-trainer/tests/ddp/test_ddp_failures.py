"""A rank that fails ends the whole job quickly, naming itself, and leaves no process behind; a rank that ends
its epoch early (``on_train_batch_start`` returning -1) ends it on every rank. GPUlayer DDP on 2 processes
(gloo), started as a user starts it (``python train_script.py`` relaunches itself under ``gpulayer launch``)."""

import time

import pytest
from torch.utils.data import DistributedSampler

from gpulayer.runtime.testing import is_alive

from .conftest import rank_pids, records, run_script, train

pytestmark = pytest.mark.multiprocess

# A failing job must end within this (the peer of a failed rank is blocked in a collective until it is stopped).
FAILURE_DEADLINE_S = 30
BATCHES_PER_EPOCH = 8  # 64 samples in batches of 4, shared by 2 ranks


def sampled_batches(rank: int, epoch: int) -> list[list[int]]:
    """The batches of sample indices that the injected DistributedSampler gives ``rank`` in ``epoch`` (training
    shuffles, with the script's seed)."""
    sampler = DistributedSampler(range(64), num_replicas=2, rank=rank, shuffle=True, seed=1234)
    sampler.set_epoch(epoch)
    indices = list(sampler)
    return [indices[i : i + 4] for i in range(0, len(indices), 4)]


@pytest.mark.parametrize("fail_rank", [1, 0])
def test_an_exception_on_one_rank_ends_the_job_naming_that_rank(tmp_path, fail_rank):
    started = time.monotonic()
    finished = run_script("gpulayer", tmp_path, timeout=FAILURE_DEADLINE_S, fail_rank=fail_rank, fail_step=3)
    elapsed = time.monotonic() - started
    output = f"{finished.stdout}\n{finished.stderr}"
    assert finished.returncode == 1, output
    assert elapsed < FAILURE_DEADLINE_S
    pids = rank_pids(tmp_path)
    assert sorted(pids) == [0, 1], "every rank should have started and written its pid"
    # The launcher blames the rank that raised, not its peer whose collective broke (or that it stopped).
    blamed = f"gpulayer launch: rank {fail_rank} (local rank {fail_rank}, pid {pids[fail_rank]}) exited with code 1:"
    assert blamed in finished.stderr, output
    assert f"RuntimeError: injected failure on rank {fail_rank} at step 3" in finished.stderr
    assert "Traceback" in finished.stderr and "in training_step" in finished.stderr
    assert not [pid for pid in pids.values() if is_alive(pid)], "a rank outlived the job"
    assert records(tmp_path) == [], "no rank should have finished training"


def test_on_train_batch_start_minus_one_on_one_rank_ends_the_epoch_on_both(tmp_path):
    # Rank 1 alone returns -1 at batch 3 of epoch 0: both ranks train batches 0-2, end the epoch there, and train
    # epoch 1 in full (-1 ends the epoch, not training).
    skip_batch = 3
    ranks = train("gpulayer", tmp_path, skip_rank=1, skip_batch=skip_batch, max_epochs=2)
    assert [record["world_size"] for record in ranks] == [2, 2]
    assert [record["global_step"] for record in ranks] == [skip_batch + BATCHES_PER_EPOCH] * 2
    assert [record["current_epoch"] for record in ranks] == [2, 2]
    assert [record["should_stop"] for record in ranks] == [False, False]
    for rank, record in enumerate(ranks):
        first, second = (sampled_batches(rank, epoch) for epoch in (0, 1))
        assert record["seen"] == first[:skip_batch] + second, f"rank {rank}"
    for name, tensor in ranks[0]["weights"].items():
        assert tensor.equal(ranks[1]["weights"][name]), f"{name} differs between the ranks"
