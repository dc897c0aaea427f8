"""The Runtime on CUDA devices with NCCL (nox -s cuda; skipped without a GPU)."""

import pytest
import torch

from gpulayer.runtime import Placement, Runtime
from gpulayer.runtime.testing import run_ranks

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_one_process_uses_cuda_zero_without_a_process_group():
    with Runtime(accelerator="cuda") as runtime:
        assert (runtime.device, runtime.backend) == (torch.device("cuda", 0), "nccl")
        tensor = torch.ones(2, device=runtime.device)
        assert runtime.all_reduce(tensor, "mean") is tensor
        assert runtime.any(True)


def test_a_local_rank_without_a_device_is_named():
    rank = torch.cuda.device_count()
    placement = Placement(
        world_size=rank + 1, global_rank=rank, local_rank=rank, local_world_size=rank + 1, accelerator="cuda"
    )
    with pytest.raises(RuntimeError, match=f"this process needs cuda:{rank}, but this machine has {rank} CUDA"):
        Runtime(placement)


def _nccl_collectives(runtime):
    rank = runtime.global_rank
    total = runtime.all_reduce(torch.tensor([rank + 1.0], device=runtime.device)).item()
    return total, runtime.any(rank == 1), runtime.all(rank == 1), runtime.broadcast({"from": rank}, src=1)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_collectives_on_two_gpus_with_nccl():
    assert run_ranks(_nccl_collectives, world_size=2, accelerator="cuda") == [(3.0, True, False, {"from": 1})] * 2
