"""SIGTERM during fit: the step finishes, hpc_ckpt_1.ckpt is written, the process exits 143, and fit(ckpt_path="hpc")
ends with the weights of an uninterrupted run; in one process, and in a 2-rank DDP job under ``gpulayer launch``.
And a job that torch's agent restarts resumes from its last checkpoint by itself."""

import sys
from pathlib import Path

import pytest
import torch

from gpulayer.runtime.testing import run_command

from .jobs import STEPS_PER_EPOCH, run_job

SCRIPT = str(Path(__file__).with_name("_preemption_script.py"))


def _run(root: Path, *args: str):
    return run_command([sys.executable, SCRIPT, str(root), *args], timeout=120)


def test_sigterm_saves_a_checkpoint_exits_143_and_resumes_exactly(tmp_path, outcome):
    uninterrupted = _run(tmp_path / "uninterrupted", "0")
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    stopped = _run(tmp_path / "preempted", "11")
    assert stopped.returncode == 143, stopped.stderr
    assert (tmp_path / "preempted" / "hpc_ckpt_1.ckpt").is_file()
    assert not (tmp_path / "preempted" / "final.pt").exists()  # fit ended at the SIGTERM
    saved = torch.load(tmp_path / "preempted" / "hpc_ckpt_1.ckpt", weights_only=True)
    assert saved["global_step"] == 11  # the step that was running finished, none after it
    resumed = _run(tmp_path / "preempted", "0", "hpc")
    assert resumed.returncode == 0, resumed.stderr
    expected = torch.load(tmp_path / "uninterrupted" / "final.pt", weights_only=True)
    actual = torch.load(tmp_path / "preempted" / "final.pt", weights_only=True)
    assert actual["global_step"] == expected["global_step"] == 24
    for name, weight in expected["weights"].items():
        torch.testing.assert_close(actual["weights"][name], weight, rtol=0, atol=0)
    outcome(
        "Preemption and restart",
        "SIGTERM to a one-process fit at step 11",
        exit_status=stopped.returncode,
        checkpoint_step=saved["global_step"],
        data_lost="none",
        result="hpc_ckpt_1.ckpt written at step 11, exit 143; fit(ckpt_path='hpc') ends with identical weights",
    )


def _final_weights(out: Path) -> list[dict]:
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    """The 2-rank DDP job of ``_faults_script.py`` run to its end (2 epochs, 8 steps), for the others to equal."""
    out = tmp_path_factory.mktemp("uninterrupted")
    job = run_job(out, max_epochs=2)
    assert job.exit_status == 0, job.stderr
    return _final_weights(out)


def _assert_same_run(records: list[dict], expected: list[dict]) -> None:
    for record, reference in zip(records, expected, strict=True):
        assert record["global_step"] == reference["global_step"] == 2 * STEPS_PER_EPOCH
        for name, weight in reference["weights"].items():
            torch.testing.assert_close(record["weights"][name], weight, rtol=0, atol=0, msg=name)


@pytest.mark.multiprocess
def test_sigterm_to_a_ddp_launcher_saves_on_every_rank_exits_143_and_resumes_exactly(tmp_path, outcome, uninterrupted):
    # Rank 1 sends SIGTERM to the launcher during step 2; torch's agent passes it to both ranks, which agree on
    # it at the epoch's last batch (their next sync point), save hpc_ckpt_1.ckpt there and exit 143.
    job = run_job(tmp_path, launcher=["--nproc-per-node", "2"], fault="sigterm", rank=1, batch=1, max_epochs=2)
    assert job.exit_status == 143, job.stderr
    assert "gpulayer launch: received SIGTERM" in job.stderr, job.stderr
    assert job.processes_left == []
    saved = torch.load(tmp_path / "hpc_ckpt_1.ckpt", weights_only=True)
    assert saved["global_step"] == STEPS_PER_EPOCH
    assert not (tmp_path / "rank0.pt").exists()  # fit ended at the SIGTERM on every rank
    resumed = run_job(tmp_path, ckpt_path="hpc", max_epochs=2)
    assert resumed.exit_status == 0, resumed.stderr
    records = _final_weights(tmp_path)
    assert [r["started_at_step"] for r in records] == [[STEPS_PER_EPOCH]] * 2
    _assert_same_run(records, uninterrupted)
    outcome(
        "Preemption and restart",
        "SIGTERM to the launcher of a 2-rank DDP job during step 2",
        exit_status=job.exit_status,
        seconds_to_exit=round(job.seconds_to_exit, 1),
        processes_left=len(job.processes_left),
        checkpoint_step=saved["global_step"],
        data_lost="none",
        result=(
            "the agent passes SIGTERM to both ranks, which finish their steps to the next sync point (the epoch's "
            f"end, step {saved['global_step']}), save hpc_ckpt_1.ckpt and exit 143; the launcher exits 143; "
            "fit(ckpt_path='hpc') ends with the uninterrupted run's weights, bit for bit"
        ),
    )


@pytest.mark.multiprocess
def test_a_restarted_job_resumes_from_its_last_checkpoint_by_itself(tmp_path, outcome, uninterrupted):
    # Rank 1 raises during step 6 of the first run only; last.ckpt was saved at step 4.
    job = run_job(
        tmp_path, launcher=["--nproc-per-node", "2", "--max-restarts", "1"], fault="crash_once", epoch=1, batch=1
    )
    assert job.exit_status == 0, job.stderr
    assert job.processes_left == []
    records = _final_weights(tmp_path)
    assert [r["started_at_step"] for r in records] == [[STEPS_PER_EPOCH]] * 2  # the restarted ranks' fit
    _assert_same_run(records, uninterrupted)
    outcome(
        "Preemption and restart",
        "gpulayer launch --max-restarts 1, rank 1 crashing once during step 6",
        exit_status=job.exit_status,
        processes_left=len(job.processes_left),
        data_lost="none: steps 5 and 6 are trained again",
        result=(
            "torch's agent restarts both ranks; without a ckpt_path in the script, fit resumes from last.ckpt "
            f"(step {STEPS_PER_EPOCH}) and ends with the uninterrupted run's weights, bit for bit"
        ),
    )
