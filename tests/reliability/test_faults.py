"""Faults on one rank of a 2-process DDP job (gloo), injected at precise points by ``_faults_script.py``, which
runs as a user runs a script (``python script.py``; ``devices=2`` re-runs it under ``gpulayer launch``).

Each job must end with a non-zero exit, soon, naming the failing rank with its traceback, and leave no process
behind (``jobs.run_job`` records every process of the job and kills it past its deadline).
"""

from __future__ import annotations

import hashlib
import re

import pytest
import torch

from .jobs import SCRIPT, STEPS_PER_EPOCH, Job, run_job

pytestmark = pytest.mark.multiprocess

FAILURE_DEADLINE_S = 30  # the bound from a fault to the end of the job
DESYNC_TIMEOUT_S = 10  # DDPStrategy(timeout=...) of the desync job: generous, as ranks may start seconds apart


def assert_ended_naming(job: Job, rank: int, how: str) -> str:
    """The job failed within the deadline, the launcher blamed ``rank`` (``how`` it ended), and no process is left.
    Returns the launcher's report."""
    report = job.report(rank)
    assert job.exit_status == 1, job.stderr
    assert sorted(job.rank_pids) == [0, 1], "both ranks should have started"
    assert job.seconds_to_exit is not None, "the fault was never injected"
    assert job.seconds_to_exit < FAILURE_DEADLINE_S
    assert report.startswith(f"gpulayer launch: rank {rank} (local rank {rank}, pid {job.rank_pids[rank]}) {how}"), (
        job.stderr
    )
    assert set(job.rank_pids.values()) <= job.processes.keys(), "the ranks should have been seen below the launcher"
    assert job.processes_left == [], f"processes of the job outlived it: {job.processes_left}"
    return report


def test_sigkill_of_a_rank_mid_epoch_ends_the_job_naming_it(tmp_path, outcome):
    job = run_job(tmp_path, fault="sigkill", rank=1, batch=2, max_epochs=1)
    assert_ended_naming(job, 1, "was killed by signal SIGKILL")
    outcome(
        "Faults",
        "SIGKILL of rank 1 mid-epoch (in training_step)",
        exit_status=job.exit_status,
        seconds_to_exit=round(job.seconds_to_exit, 1),
        processes_left=len(job.processes_left),
        processes_seen=len(job.processes),
        names_rank=True,
        data_lost="the steps since the last checkpoint",
        result="the launcher exits 1 naming rank 1 killed by SIGKILL; its peer is stopped and no process is left",
    )


RAISES = {
    "raise_in_training_step": (1, 2, "training_step"),
    "raise_in_validation_step": (1, 1, "validation_step"),
    "raise_in_callback": (1, 2, "on_train_batch_end"),
    # Rank 1 does not write, but builds the checkpoint as rank 0 does (ModelCheckpoint saves at step 4).
    "raise_in_checkpoint_save": (1, 3, "on_save_checkpoint"),
}


@pytest.mark.parametrize("fault", RAISES)
def test_an_exception_on_one_rank_ends_the_job_with_its_traceback(tmp_path, outcome, fault):
    rank, batch, where = RAISES[fault]
    job = run_job(tmp_path, fault=fault, rank=rank, batch=batch, max_epochs=1)
    report = assert_ended_naming(job, rank, "exited with code 1: RuntimeError: injected fault")
    message = f"RuntimeError: injected fault in {where} on rank {rank}"
    assert "Traceback (most recent call last)" in report, job.stderr
    assert f", in {where}\n" in report and message in report, job.stderr
    assert job.seconds_to_rank_exit(rank) is not None, "the raising rank's end was not seen"
    outcome(
        "Faults",
        f"exception on rank {rank} only, in {where}",
        exit_status=job.exit_status,
        seconds_to_exit=round(job.seconds_to_exit, 1),
        rank_seconds_to_exit=round(job.seconds_to_rank_exit(rank), 2),
        processes_left=len(job.processes_left),
        processes_seen=len(job.processes),
        names_rank=True,
        data_lost="the steps since the last checkpoint",
        result=f"the launcher exits 1 naming rank {rank} with its traceback ending in {where}; no process is left",
    )


def test_the_rank_that_raised_is_blamed_when_its_peer_dies_first(tmp_path, outcome):
    # Rank 1 records its error, then does not exit: rank 0's gradient all-reduce times out, rank 0 dies first, and
    # the agent stops rank 1 with SIGTERM. Rank 1's recorded exception, not the order of exits, decides the blame.
    job = run_job(tmp_path, fault="raise_and_linger", rank=1, batch=2, max_epochs=1, timeout=DESYNC_TIMEOUT_S)
    report = assert_ended_naming(job, 1, "was killed by signal SIGTERM: RuntimeError: injected fault in training_step")
    assert ", in training_step\n" in report, job.stderr
    assert "CollectiveError: DDP's gradient all-reduce timed out on rank 0" in job.stderr, "rank 0 should die first"
    outcome(
        "Faults",
        "exception on rank 1, which exits only when stopped, after its peer timed out and died",
        exit_status=job.exit_status,
        seconds_to_exit=round(job.seconds_to_exit, 1),
        processes_left=len(job.processes_left),
        processes_seen=len(job.processes),
        names_rank=True,
        data_lost="the steps since the last checkpoint",
        result=(
            "rank 0's all-reduce times out and rank 0 dies first, then the agent stops rank 1 with SIGTERM; the "
            "launcher still names rank 1 and its RuntimeError with the traceback ending in training_step, from its "
            "error record"
        ),
    )


def test_a_peer_lost_during_manual_backward_is_named_as_a_collective_error(tmp_path, outcome):
    # The case above under manual optimization: rank 0 waits in the gradient all-reduce of its manual_backward.
    job = run_job(
        tmp_path, fault="raise_and_linger", rank=1, batch=2, max_epochs=1, timeout=DESYNC_TIMEOUT_S, manual=True
    )
    assert_ended_naming(job, 1, "was killed by signal SIGTERM: RuntimeError: injected fault in training_step")
    named = (
        "CollectiveError: DDP's gradient all-reduce timed out on rank 0, called at manual_backward() in training_step"
    )
    assert f"{named}(batch_idx=2)" in job.stderr, job.stderr
    outcome(
        "Faults",
        "manual optimization: exception on rank 1, which exits only when stopped, while its peer is in manual_backward",
        exit_status=job.exit_status,
        seconds_to_exit=round(job.seconds_to_exit, 1),
        processes_left=len(job.processes_left),
        processes_seen=len(job.processes),
        names_rank=True,
        data_lost="the steps since the last checkpoint",
        result=(
            "rank 0's gradient all-reduce in manual_backward times out and rank 0 dies with a CollectiveError naming "
            "it and training_step(batch_idx=2); the agent stops rank 1, which the launcher names"
        ),
    )


@pytest.fixture(scope="module")
def desync(tmp_path_factory) -> Job:
    """Rank 1 enters a barrier in training_step that rank 0 skips (rank 0 goes on to DDP's gradient all-reduce)."""
    out = tmp_path_factory.mktemp("desync")
    return run_job(out, fault="desync", rank=1, batch=2, max_epochs=1, timeout=DESYNC_TIMEOUT_S)


def _desync_line() -> int:
    for number, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if "# DESYNC_LINE" in line:
            return number
    raise AssertionError(f"{SCRIPT} has no line marked DESYNC_LINE")


def test_a_desync_ends_the_job_within_the_timeout_naming_the_collective(desync, outcome):
    job = desync
    assert job.exit_status == 1, job.stderr
    assert job.seconds_to_exit is not None, "the fault was never injected"
    # The collective timeout, not anything sooner or much later, ends the job.
    assert DESYNC_TIMEOUT_S - 0.5 < job.seconds_to_exit < DESYNC_TIMEOUT_S + 20, job.seconds_to_exit
    blamed = [rank for rank in (0, 1) if job.report(rank).startswith(f"gpulayer launch: rank {rank} ")]
    assert len(blamed) == 1, job.stderr
    # Each rank names the collective it waited in and where: rank 1 the barrier the script called, rank 0 DDP's
    # gradient all-reduce in the backward of the batch it was training. Whether a rank's own timeout ends its wait
    # or the closed connection of a peer that timed out a moment before and left is a race between the two ranks'
    # clocks (a flake hunt saw both); the launcher names a rank whose collective timed out either way.
    call_site = re.escape(f"{SCRIPT}:{_desync_line()} in training_step")
    barrier = f"CollectiveError: barrier (timed out|failed) on rank 1, called at {call_site}"
    assert re.search(barrier, job.stderr), job.stderr
    ddp = r"CollectiveError: DDP's gradient all-reduce (timed out|failed) on rank 0, called at loss\.backward\(\) after"
    assert re.search(ddp, job.stderr), job.stderr
    assert f"timed out on rank {blamed[0]}, called at " in job.report(blamed[0]).splitlines()[0], job.stderr
    assert job.processes_left == [], f"processes of the job outlived it: {job.processes_left}"
    outcome(
        "Faults",
        "desync: rank 1 enters a barrier that rank 0 skips",
        exit_status=job.exit_status,
        seconds_to_exit=round(job.seconds_to_exit, 1),
        collective_timeout_s=DESYNC_TIMEOUT_S,
        processes_left=len(job.processes_left),
        processes_seen=len(job.processes),
        names_rank=True,
        blamed_rank=blamed[0],
        data_lost="the steps since the last checkpoint",
        result=(
            f"the job ends {job.seconds_to_exit - DESYNC_TIMEOUT_S:.1f} s after the collective timeout; rank 1 names "
            "the barrier and its line in training_step, rank 0 DDP's gradient all-reduce in the backward after "
            f"training_step(batch_idx=2); the launcher reports rank {blamed[0]}'s"
        ),
    )


def test_a_process_killed_while_writing_a_checkpoint_leaves_the_previous_one_to_resume_from(tmp_path, outcome):
    # Rank 0 (the writer) saves last.ckpt at step 4, then dies halfway through writing it again at step 8.
    job = run_job(tmp_path, fault="kill_during_save", rank=0, max_epochs=2)
    assert_ended_naming(job, 0, "was killed by signal SIGKILL")
    folder = tmp_path / "checkpoints"
    partial = sorted(folder.glob(".tmp-*"))
    assert len(partial) == 1, "the kill should have landed while the temporary file was being written"
    assert sorted(folder.glob("*.ckpt")) == [folder / "last.ckpt"], "no *.ckpt pattern finds the temporary file"
    last = folder / "last.ckpt"
    assert hashlib.sha256(last.read_bytes()).hexdigest() == (tmp_path / "before_kill.sha256").read_text()
    assert torch.load(last, weights_only=True)["global_step"] == STEPS_PER_EPOCH

    resumed = run_job(tmp_path, ckpt_path="last", max_epochs=2)
    assert resumed.exit_status == 0, resumed.stderr
    assert resumed.processes_left == []
    records = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert [r["started_at_step"] for r in records] == [[STEPS_PER_EPOCH]] * 2, "should resume from last.ckpt"
    assert [r["global_step"] for r in records] == [2 * STEPS_PER_EPOCH] * 2
    assert torch.load(last, weights_only=True)["global_step"] == 2 * STEPS_PER_EPOCH
    assert sorted(folder.glob(".tmp-*")) == [], "the resumed run's first save removes the dead writer's file"
    outcome(
        "Faults",
        "SIGKILL of rank 0 while writing a checkpoint",
        exit_status=job.exit_status,
        seconds_to_exit=round(job.seconds_to_exit, 1),
        processes_left=len(job.processes_left),
        processes_seen=len(job.processes),
        names_rank=True,
        data_lost="none: last.ckpt (step 4) is intact byte for byte; the steps after it are trained again",
        leftover_files=[path.name for path in partial],
        result=(
            "the launcher exits 1 naming rank 0; last.ckpt is the previous save, loads, and the run resumes from it "
            "to the end; the half-written temporary file (.tmp-*.ckpt.partial, which no *.ckpt pattern finds) stays "
            "in the checkpoint folder until the resumed run's first save, which removes it (its writer's lock died "
            "with it)"
        ),
    )
