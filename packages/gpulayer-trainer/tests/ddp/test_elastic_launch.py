"""An elastic job loses a node mid-epoch and trains each sample of every epoch once.

``gpulayer launch --nnodes 1:2 --nproc-per-node 2 --max-restarts 1``: two agents on loopback (simulated nodes)
train on 4 ranks; in step 5 of epoch 0 (6 steps an epoch on 4 ranks) one node's agent is killed with its workers.
The other agent restarts its 2 workers, which resume from the step-3 checkpoint on 2 ranks and finish. The same
checkpoint resumed on 3 workers, and on 1, trains each sample once too.
"""

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from gpulayer.runtime.testing import clean_environment, run_command

from .elastic_script import EPOCHS, SAMPLES

pytestmark = pytest.mark.multinode

SCRIPT = str(Path(__file__).with_name("elastic_script.py"))
DEADLINE_S = 180
LAUNCH = [sys.executable, "-m", "gpulayer.runtime", "launch"]
# A node is lost after 2 missed 1-second heartbeats; the restarted round waits 8 s for more nodes. The two agents,
# started together, join the first round within those 8 s, so it completes as the second arrives, with both.
RDZV_CONF = "last_call_timeout=8,keep_alive_interval=1,keep_alive_max_attempt=2"


def _trained(out: Path, attempt: int, before_step: float = float("inf")) -> list[dict]:
    """Every rank's steps of ``attempt`` below ``before_step``."""
    steps = [
        json.loads(line) for path in out.glob(f"steps-{attempt}-*.jsonl") for line in path.read_text().splitlines()
    ]
    return [step for step in steps if step["step"] < before_step]


def _starts(out: Path, attempt: int) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(out.glob(f"start-{attempt}-*.json"))]


def _indices_by_epoch(steps: list[dict]) -> dict[int, list[int]]:
    epochs: dict[int, list[int]] = {}
    for step in steps:
        epochs.setdefault(step["epoch"], []).extend(step["indices"])
    return {epoch: sorted(indices) for epoch, indices in sorted(epochs.items())}


def test_a_job_that_loses_a_node_mid_epoch_goes_on_with_2_workers_and_trains_each_sample_once(tmp_path, popen_killer):
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=DEADLINE_S))
    agent = [
        *LAUNCH, "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
        "--rdzv-endpoint", f"127.0.0.1:{store.port}", "--rdzv-id", "elastic", "--rdzv-conf", RDZV_CONF,
        "--local-addr", "127.0.0.1", SCRIPT, str(tmp_path), "kill_step=4",
    ]  # fmt: skip
    nodes = []
    for _ in range(2):
        nodes.append(subprocess.Popen(agent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=clean_environment(), start_new_session=True))  # fmt: skip
        popen_killer(nodes[-1])
    outputs = [node.communicate(timeout=DEADLINE_S) for node in nodes]
    assert sorted(node.returncode for node in nodes) == [-9, 0], outputs  # one node lost, the other finished
    assert [start["world_size"] for start in _starts(tmp_path, 0)] == [4] * 4
    restarted = _starts(tmp_path, 1)
    assert [(start["world_size"], start["step"]) for start in restarted] == [(2, 3)] * 2
    checkpoint = restarted[0]["ckpt_path"]
    assert Path(checkpoint).name == "epoch=0-step=3.ckpt"
    before = _trained(tmp_path, 0, before_step=3)  # the steps the checkpoint holds
    each_once = {epoch: list(range(SAMPLES)) for epoch in range(EPOCHS)}
    assert _indices_by_epoch(before + _trained(tmp_path, 1)) == each_once
    assert max(step["step"] for step in _trained(tmp_path, 1)) + 1 == 3 + 6 + 12  # 2 ranks: 12 steps an epoch
    for workers in (3, 1):
        out = tmp_path / f"on-{workers}"
        command = [*LAUNCH, "--nproc-per-node", str(workers), SCRIPT, str(out), f"ckpt_path={checkpoint}"]
        finished = run_command(command, timeout=DEADLINE_S, env=clean_environment())
        assert finished.returncode == 0, finished.stderr
        assert _indices_by_epoch(before + _trained(out, 0)) == each_once
