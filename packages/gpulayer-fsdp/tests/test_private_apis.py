"""The private torch APIs gpulayer-fsdp relies on, one test each (ARCHITECTURE.md lists them).

Each test exercises the API on a small real DCP folder, written by one process, in the way GPUlayer uses it. When a
torch release changes one, its test fails naming the API and the module of GPUlayer to update.
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

TORCH = f"torch {torch.__version__}"
SAVED = {
    "model": {"net.weight": torch.arange(6.0).reshape(2, 3)},
    "optimizer_0": {"state": {"net.weight": {"step": torch.tensor(2.0)}}, "param_groups": [{"params": ["net.weight"]}]},
}


@contextlib.contextmanager
def relied_on(api: str, user: str, purpose: str) -> Iterator[None]:
    """Any failure inside becomes one that names ``api``, the GPUlayer module that relies on it, and what for."""
    try:
        yield
    except Exception as error:
        pytest.fail(
            f"{TORCH} no longer has {api} as GPUlayer relies on it, which gpulayer/fsdp/{user} uses to {purpose} "
            f"({type(error).__name__}: {error}); update {user} and ARCHITECTURE.md's table of private APIs"
        )


def _read_whole(folder: Path) -> dict:
    """consolidate.py's reading: every key of the folder into this process, no process group."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    whole: dict = {}
    _load_state_dict(whole, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return whole


@pytest.fixture
def folder(tmp_path) -> Path:
    with pytest.warns(UserWarning, match="single process"):  # no process group: DCP saves as one process
        dcp.save(SAVED, checkpoint_id=tmp_path)
    return tmp_path


# ---- consolidate.py: a sharded checkpoint folder read into one process (Lightning's _load_distributed_checkpoint) ----
def test_load_state_dict(folder):
    api = "torch.distributed.checkpoint.state_dict_loader._load_state_dict(..., no_dist=True)"
    with relied_on(api, "consolidate.py", "read a sharded checkpoint into one process without a process group"):
        whole = _read_whole(folder)
        assert torch.equal(whole["model"]["net.weight"], SAVED["model"]["net.weight"])


def test_empty_state_dict_load_planner(folder):
    api = "torch.distributed.checkpoint.format_utils._EmptyStateDictLoadPlanner"
    with relied_on(api, "consolidate.py", "rebuild a checkpoint's nested dicts from its metadata alone"):
        whole = _read_whole(folder)
        assert whole.keys() == SAVED.keys()
        assert whole["optimizer_0"]["param_groups"] == [{"params": ["net.weight"]}]
        assert torch.equal(whole["optimizer_0"]["state"]["net.weight"]["step"], torch.tensor(2.0))
