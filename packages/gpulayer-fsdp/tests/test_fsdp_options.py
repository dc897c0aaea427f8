"""The options that change how the model is sharded: a function that shards it, and bf16-mixed precision."""

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

import gpulayer.trainer as gl
from gpulayer.fsdp import FSDPStrategy
from gpulayer.runtime.testing import run_ranks

from .conftest import Block, fit, packed, unpacked

pytestmark = pytest.mark.multiprocess


def _shard_linear_layers(module: nn.Module, mesh) -> None:
    for layer in [m for m in module.modules() if isinstance(m, nn.Linear)]:
        fully_shard(layer, mesh=mesh)


def _options(runtime, folder: str) -> bytes:
    folder, rank = Path(folder), runtime.global_rank
    seen: list[torch.dtype] = []
    own_units: list[int] = []

    def shard_and_count(module: nn.Module, mesh) -> None:
        _shard_linear_layers(module, mesh)
        own_units.append(sum(isinstance(m, FSDPModule) for m in module.modules()))

    class Recording(FSDPStrategy):
        def setup_module(self):
            first = self._sharded_module is None
            super().setup_module()
            if first:
                block = self.lightning_module.blocks[0]
                block.register_forward_pre_hook(lambda m, args: seen.append(m.norm1.weight.dtype))

    class GradientsAfterBatch(gl.Callback):
        """Whether the shards hold a gradient after each batch: only a reduce-scatter gives them one."""

        def __init__(self) -> None:
            self.reduced: list[bool] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.reduced.append(all(p.grad is not None for p in pl_module.parameters()))

    gradients = GradientsAfterBatch()
    accumulated = fit("mlp", FSDPStrategy(), folder / "accumulated", rank=rank, max_epochs=1, callbacks=[gradients])
    return packed(
        {
            "reduced_after_batch": gradients.reduced,
            "accumulated_steps": accumulated["global_step"],
            "ddp": fit("mlp", "ddp", folder / "ddp", rank=rank),
            "shard_model": fit("mlp", FSDPStrategy(shard_model=shard_and_count), folder / "own", rank=rank),
            "ddp_bf16": fit("transformer", "ddp", folder / "ddp-bf16", rank=rank, precision="bf16-mixed"),
            "fsdp_bf16": fit(
                "transformer", Recording(auto_wrap_policy={Block}), folder / "bf16", rank=rank, precision="bf16-mixed"
            ),
            "compute_dtypes": sorted({str(dtype) for dtype in seen}),
            "own_units": own_units,
        }
    )


def test_a_sharding_function_and_bf16_mixed_precision(tmp_path):
    for rank in unpacked(run_ranks(_options, str(tmp_path), timeout=180)):
        # accumulate_grad_batches=2: the batch that does not step leaves the shards without a gradient (no
        # reduce-scatter ran); the stepping batch reduce-scatters.
        assert rank["accumulated_steps"] == 2
        assert rank["reduced_after_batch"] == [False, True, False, True]
        # shard_model: the user's units (the MLP's three Linear layers), the same training as DDP.
        assert rank["own_units"] == [3]
        for name, weight in rank["ddp"]["weights"].items():
            torch.testing.assert_close(rank["shard_model"]["weights"][name], weight, rtol=0, atol=1e-5)
        # bf16-mixed: blocks compute with bf16 parameters; the saved weights stay fp32 and train as DDP's bf16-mixed
        # does, within bf16's precision.
        assert rank["compute_dtypes"] == ["torch.bfloat16"]
        assert all(w.dtype == torch.float32 for w in rank["fsdp_bf16"]["weights"].values())
        torch.testing.assert_close(rank["fsdp_bf16"]["losses"], rank["ddp_bf16"]["losses"], rtol=0, atol=0.05)
