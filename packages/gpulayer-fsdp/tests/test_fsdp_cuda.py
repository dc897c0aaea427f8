"""On two CUDA GPUs (nox -s cuda; skipped otherwise): DDP and FSDP2 on NCCL train like the same job on gloo.

The SGD transformer is compared, not AdamW: Adam's update of a parameter whose gradient is near zero follows the
gradient's sign, which the GPU's kernels may round the other way."""

from pathlib import Path

import pytest
import torch

from gpulayer.fsdp import FSDPStrategy
from gpulayer.runtime.testing import run_ranks

from .conftest import Block, fit, packed, unpacked

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]

TOLERANCE = 1e-3  # 4 SGD steps on CUDA kernels (SDPA, cuBLAS) against the CPU's


def _train(runtime, accelerator: str, strategy: str, folder: str) -> bytes:
    chosen = FSDPStrategy(auto_wrap_policy={Block}) if strategy == "fsdp" else "ddp"
    root = Path(folder) / accelerator / strategy
    record = fit("transformer_sgd", chosen, root, rank=runtime.global_rank, accelerator=accelerator)
    weights = {name: weight.cpu() for name, weight in record["weights"].items()}
    return packed({"losses": record["losses"], "global_step": record["global_step"], "weights": weights})


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_nccl_trains_like_gloo(tmp_path, strategy):
    gloo = unpacked(run_ranks(_train, "cpu", strategy, str(tmp_path), timeout=180))
    nccl = unpacked(run_ranks(_train, "cuda", strategy, str(tmp_path), accelerator="cuda", timeout=180))
    for on_cpu, on_gpu in zip(gloo, nccl, strict=True):
        assert on_gpu["global_step"] == on_cpu["global_step"] == 4
        assert on_gpu["losses"] == pytest.approx(on_cpu["losses"], abs=TOLERANCE)
    for name, weight in gloo[0]["weights"].items():
        torch.testing.assert_close(nccl[0]["weights"][name], weight, rtol=0, atol=TOLERANCE, msg=name)
