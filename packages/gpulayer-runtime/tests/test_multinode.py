"""Two `gpulayer launch` agents, each a simulated node on loopback, form one world through c10d."""

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from gpulayer.runtime.testing import kill_tree

pytestmark = pytest.mark.multinode

RANK_SCRIPT = str(Path(__file__).parent / "scripts" / "rank_script.py")
DEADLINE_S = 120


def test_two_nodes_form_one_world_and_all_reduce(tmp_path):
    # The rendezvous store lives in this test, at a port the store itself picked; both agents join it.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=DEADLINE_S))
    agent = [
        sys.executable, "-m", "gpulayer.runtime", "launch",
        "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-endpoint", f"127.0.0.1:{store.port}", "--rdzv-id", "multinode-test", "--local-addr", "127.0.0.1",
        RANK_SCRIPT, str(tmp_path),
    ]  # fmt: skip
    nodes = [
        subprocess.Popen(agent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        for _ in range(2)
    ]
    try:
        outputs = [node.communicate(timeout=DEADLINE_S) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:  # still running past the deadline: end it and its workers
                kill_tree(node.pid)
                node.wait()
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [s["world_size"] for s in seen] == [2, 2]
    assert sorted(s["node_rank"] for s in seen) == [0, 1]
    assert [s["local_rank"] for s in seen] == [0, 0]
    assert [s["sum"] for s in seen] == [3.0, 3.0]
    assert {s["source"] for s in seen} == {"torchrun"}
