"""Which failed rank the launcher names, from the error records torch's own error handler writes.

The multi-process tests in test_launch.py and tests/reliability/test_faults.py force the races end to end; these
fix the order in which the records were written, which a run under load cannot.
"""

import os

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ErrorHandler, ProcessFailure

from gpulayer.runtime import CollectiveError
from gpulayer.runtime.launch import _worker_failed

BARRIER_TIMED_OUT = CollectiveError(
    "barrier", "train.py:7 in training_step", 1, RuntimeError("Timed out waiting 10000ms for recv operation")
)
ALL_REDUCE_CLOSED = CollectiveError(
    "DDP's gradient all-reduce", "loss.backward()", 0, RuntimeError("[gloo] Connection closed by peer")
)


def _failures(tmp_path, monkeypatch, errors):
    """One failed rank per error, each with the error record torch writes, in the order given (oldest first)."""
    failures = {}
    for index, (rank, error) in enumerate(errors):
        path = tmp_path / f"error-{rank}.json"
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
        try:
            raise error
        except Exception as raised:  # record_exception reads the traceback being handled, as in a worker
            ErrorHandler().record_exception(raised)
        os.utime(path, ns=(index * 1_000_000, index * 1_000_000))  # written in this order, whatever the clock says
        failures[rank] = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=1, error_file=str(path))
    return ChildFailedError("train.py", failures)


def test_a_collective_that_timed_out_is_blamed_before_one_its_peer_closed_even_when_recorded_later(
    tmp_path, monkeypatch
):
    # The hunt's race: rank 1's barrier timed out and rank 1 left; rank 0's all-reduce broke on the closed
    # connection, and rank 0 wrote its record first.
    failed = _failures(tmp_path, monkeypatch, [(0, ALL_REDUCE_CLOSED), (1, BARRIER_TIMED_OUT)])
    error = _worker_failed(failed)
    assert error.rank == 1, str(error)
    assert "CollectiveError: barrier timed out on rank 1" in str(error)
    assert "(1 other rank(s) failed as well)" in str(error)


def test_between_two_timeouts_the_earliest_record_is_blamed(tmp_path, monkeypatch):
    all_reduce_timed_out = CollectiveError("all_reduce", "train.py:9 in main", 0, RuntimeError("Timed out waiting"))
    failed = _failures(tmp_path, monkeypatch, [(1, BARRIER_TIMED_OUT), (0, all_reduce_timed_out)])
    assert _worker_failed(failed).rank == 1


def test_an_exception_of_the_users_outranks_a_timeout_recorded_before_it(tmp_path, monkeypatch):
    failed = _failures(tmp_path, monkeypatch, [(1, BARRIER_TIMED_OUT), (0, ValueError("boom on rank 0"))])
    error = _worker_failed(failed)
    assert error.rank == 0 and "ValueError: boom on rank 0" in str(error)
