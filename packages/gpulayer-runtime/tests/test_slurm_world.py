"""Two local processes with the variables `srun -n 2` sets form one world of 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer.runtime.testing import run_command

pytestmark = pytest.mark.multiprocess

SCRIPT = str(Path(__file__).parent / "scripts" / "slurm_rank.py")


def _slurm_task(rank, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env.update(
        SLURM_NTASKS="2",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NODEID="0",
        SLURM_NNODES="1",
        SLURM_TASKS_PER_NODE="2",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_NAME="train",
        OMP_NUM_THREADS="1",
    )
    return [sys.executable, SCRIPT, str(tmp_path / "store"), str(tmp_path / f"rank{rank}.json")], env


def test_two_slurm_tasks_form_a_world_of_two(tmp_path):
    # Both tasks run at once, as srun starts them; the first runs under the harness's deadline and kill.
    argv1, env1 = _slurm_task(1, tmp_path)
    second = subprocess.Popen(argv1, env=env1, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        argv0, env0 = _slurm_task(0, tmp_path)
        first = run_command(argv0, env=env0, timeout=60)
        _second_out, second_err = second.communicate(timeout=60)
    finally:
        second.kill()
        second.wait()
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second_err
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["placement"] == (
            f"Placement(rank {rank}/2, local {rank}/2, node 0/1, cpu, gloo, localhost:19242, from slurm, run 4242)"
        )
        assert (seen["rank"], seen["sum"], seen["gathered"]) == (rank, 3.0, [0, 1])
