"""Every collective at world size 2 on real gloo processes."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from gpulayer.runtime import CollectiveError
from gpulayer.runtime.testing import run_ranks

pytestmark = pytest.mark.multiprocess


def _every_collective(runtime):
    rank = runtime.global_rank
    results = {}
    for op in ("sum", "mean", "max", "min"):
        results[op] = runtime.all_reduce(torch.tensor([rank + 1.0, 10.0 * rank]), op).tolist()
    results["gather_tensor"] = [t.tolist() for t in runtime.all_gather(torch.tensor([rank, rank * 2]))]
    results["gather_object"] = runtime.all_gather({"rank": rank})
    results["broadcast_tensor"] = runtime.broadcast(torch.tensor([rank * 7]), src=1).tolist()
    results["broadcast_object"] = runtime.broadcast(f"from {rank}", src=1)
    runtime.barrier()
    results["any_one"] = runtime.any(rank == 1)
    results["all_one"] = runtime.all(rank == 0)
    results["any_none"] = runtime.any(False)
    results["all_every"] = runtime.all(True)
    results["zero"] = runtime.is_global_zero
    return results


def test_every_collective_on_two_ranks():
    rank0, rank1 = run_ranks(_every_collective, world_size=2)
    assert rank0["sum"] == rank1["sum"] == [3.0, 10.0]
    assert rank0["mean"] == rank1["mean"] == [1.5, 5.0]
    assert rank0["max"] == rank1["max"] == [2.0, 10.0]
    assert rank0["min"] == rank1["min"] == [1.0, 0.0]
    assert rank0["gather_tensor"] == rank1["gather_tensor"] == [[0, 0], [1, 2]]
    assert rank0["gather_object"] == rank1["gather_object"] == [{"rank": 0}, {"rank": 1}]
    assert rank0["broadcast_tensor"] == rank1["broadcast_tensor"] == [7]
    assert rank0["broadcast_object"] == rank1["broadcast_object"] == "from 1"
    # any/all where exactly one rank says True: the answer is the same on both ranks.
    for rank in (rank0, rank1):
        assert (rank["any_one"], rank["all_one"], rank["any_none"], rank["all_every"]) == (True, False, False, True)
    assert (rank0["zero"], rank1["zero"]) == (True, False)


def _rank0_enters_a_collective_that_rank1_skips(runtime, done_path):
    done = dist.FileStore(done_path, 2)
    if runtime.global_rank == 1:
        done.wait(["rank0 finished"], timedelta(seconds=60))  # stay alive until rank 0 has seen its error
        return None
    try:
        runtime.all_reduce(torch.ones(1))  # the collective rank 1 never calls
    except CollectiveError as error:
        return (error.collective, error.timed_out, error.rank, error.call_site, str(error))
    finally:
        done.set("rank0 finished", "1")
    return None


def test_a_collective_that_one_rank_skips_times_out_naming_it_and_its_call_site(tmp_path):
    outcome, _ = run_ranks(
        _rank0_enters_a_collective_that_rank1_skips, str(tmp_path / "done"), world_size=2, collective_timeout=2
    )
    assert outcome is not None, "rank 0 did not get a CollectiveError"
    collective, timed_out, rank, call_site, message = outcome
    assert (collective, timed_out, rank) == ("all_reduce", True, 0)
    assert call_site.endswith(
        f"test_collectives.py:{_line_of('runtime.all_reduce(torch.ones(1))')} in _rank0_enters_a_collective_that_rank1_skips"
    )
    assert message.startswith("all_reduce timed out on rank 0, called at ")
    assert "another rank did not reach this collective" in message


def _line_of(text):
    with open(__file__) as source:
        return next(number for number, line in enumerate(source, 1) if text in line and "_line_of" not in line)
