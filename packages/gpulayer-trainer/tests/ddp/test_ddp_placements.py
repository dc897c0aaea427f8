"""One script, three placements: ``python train.py`` with ``devices=2``, two nodes (two ``gpulayer launch``
agents on loopback, one process each, ``num_nodes=2``), and two Slurm tasks. All train to the same weights.
The first also shows that rank 0 alone prints and writes."""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from gpulayer.runtime.testing import clean_environment

from .conftest import DEADLINE_S, SCRIPT, assert_same_weights, records, script_command

OPTIONS = {"max_epochs": 2, "sync": True, "log_every_n_steps": 4}


@pytest.fixture(scope="module")
def on_one_machine(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_machine")
    finished = subprocess.run(
        script_command("gpulayer", root / "out", **OPTIONS, logger=True, checkpoint=True, root=str(root)),
        capture_output=True, text=True, timeout=DEADLINE_S, env=clean_environment(), check=False,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    return root, finished.stdout, records(root / "out")


@pytest.mark.multiprocess
def test_python_train_py_with_devices_2_trains_on_two_ranks_and_rank_zero_alone_writes(on_one_machine):
    root, stdout, ranks = on_one_machine
    assert [(r["world_size"], r["global_step"], r["placed_by"]) for r in ranks] == [(2, 16, "torchrun")] * 2
    assert_same_weights(ranks[0]["weights"], ranks[1]["weights"])
    # One log line per log step (16 steps, every 4th), printed by rank 0 only.
    assert [line.split(" | ")[1] for line in stdout.splitlines() if line.startswith("epoch ")] == [
        "step 4/16", "step 8/16", "step 12/16", "step 16/16",
    ]  # fmt: skip
    # Both ranks name rank 0's version folder, the only one there is; it holds one metrics file and the checkpoint.
    assert ranks[0]["log_dir"] == ranks[1]["log_dir"] == str(root / "lightning_logs" / "version_0")
    assert sorted(p.name for p in (root / "lightning_logs").iterdir()) == ["version_0"]
    version = root / "lightning_logs" / "version_0"
    assert sorted(p.name for p in version.iterdir()) == ["checkpoints", "metrics.csv"]
    assert [p.name for p in (version / "checkpoints").iterdir()] == ["epoch=1-step=16.ckpt"]
    rows = (version / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 + 2 + 2  # header, 4 step rows, 2 validation rows, 2 epoch rows


@pytest.mark.multinode
def test_two_nodes_of_one_process_train_like_two_processes_on_one(tmp_path, on_one_machine, popen_killer):
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=DEADLINE_S))
    agent = [
        sys.executable, "-m", "gpulayer.runtime", "launch", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-endpoint", f"127.0.0.1:{store.port}", "--rdzv-id", "two-nodes", "--local-addr", "127.0.0.1",
    ]  # fmt: skip
    command = agent + script_command("gpulayer", tmp_path, **OPTIONS, devices=1, num_nodes=2)[1:]
    nodes = [_start(command, clean_environment(), popen_killer) for _ in range(2)]
    for node in nodes:
        _, stderr = node.communicate(timeout=DEADLINE_S)
        assert node.returncode == 0, stderr
    ranks = records(tmp_path)
    assert [r["placed_by"] for r in ranks] == ["torchrun", "torchrun"]
    _assert_trained_as_on_one_machine(ranks, on_one_machine)


@pytest.mark.multiprocess
def test_two_slurm_tasks_train_like_two_processes(tmp_path, on_one_machine, popen_killer):
    tasks = []
    for rank in (0, 1):
        env = clean_environment(
            SLURM_NTASKS="2", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_NNODES="1",
            SLURM_TASKS_PER_NODE="2", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost", SLURM_JOB_NAME="train",
        )  # fmt: skip
        command = [sys.executable, os.path.join(os.path.dirname(SCRIPT), "slurm_task.py"), str(tmp_path / "store")]
        tasks.append(_start(command + script_command("gpulayer", tmp_path / "out", **OPTIONS)[1:], env, popen_killer))
    for task in tasks:
        _, stderr = task.communicate(timeout=DEADLINE_S)
        assert task.returncode == 0, stderr
    ranks = records(tmp_path / "out")
    assert [r["placed_by"] for r in ranks] == ["slurm", "slurm"]  # read from SLURM_*, joining the tasks' group
    _assert_trained_as_on_one_machine(ranks, on_one_machine)


def _start(command, env, register):
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    register(process)
    return process


def _assert_trained_as_on_one_machine(ranks, on_one_machine):
    expected = on_one_machine[2]
    assert [r["world_size"] for r in ranks] == [2, 2]
    for record, reference in zip(ranks, expected, strict=True):
        assert (record["global_step"], record["seen"]) == (reference["global_step"], reference["seen"])
        assert record["callback_metrics"] == reference["callback_metrics"]
        assert_same_weights(reference["weights"], record["weights"])
