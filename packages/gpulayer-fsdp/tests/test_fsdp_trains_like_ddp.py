"""FSDP on 2 ranks trains exactly like DDP on 2 ranks (losses per step and full weights to 1e-5), with gradient
accumulation and clipping by norm on, and holds at most 0.55 of DDP's parameter and optimizer bytes per rank.

The MLP without clipping, on plain SGD, is the check for torch issue 162338 (FSDP2 on gloo summing gradients
instead of averaging them): clipping would scale a doubled gradient back, SGD without it would not."""

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from gpulayer.fsdp import FSDPStrategy
from gpulayer.runtime.testing import run_ranks

from .conftest import Block, fit, loader, make_model, packed, unpacked

pytestmark = pytest.mark.multiprocess

TOLERANCE = 1e-5
MEMORY_TARGET = 0.55


def _both(runtime, kind: str, folder: str, strategy_options: dict, trainer_options: dict) -> bytes:
    from pathlib import Path

    rank = runtime.global_rank
    root = Path(folder) / kind  # one folder: global rank 0 writes, every rank reads
    ddp = fit(kind, "ddp", root / "ddp", rank=rank, **trainer_options)
    fsdp = fit(kind, FSDPStrategy(**strategy_options), root / "fsdp", rank=rank, **trainer_options)
    return packed({"ddp": ddp, "fsdp": fsdp})


@pytest.mark.parametrize(
    ("kind", "strategy_options", "trainer_options"),
    [
        ("mlp", {}, {"gradient_clip_val": None}),
        ("mlp", {}, {}),
        ("transformer", {"auto_wrap_policy": {Block}}, {}),
        ("transformer_sgd", {"reshard_after_forward": False}, {"gradient_clip_val": 0.1}),
    ],
    ids=["mlp-sgd-unclipped", "mlp-sgd-clipped", "transformer-adamw-blocks", "transformer-sgd-kept-after-forward"],
)
def test_fsdp_trains_like_ddp(tmp_path, kind, strategy_options, trainer_options):
    ranks = unpacked(run_ranks(_both, kind, str(tmp_path), strategy_options, trainer_options, timeout=120))
    for record in ranks:
        ddp, fsdp = record["ddp"], record["fsdp"]
        assert fsdp["global_step"] == ddp["global_step"] == 4  # 2 epochs of 4 batches, 2 batches per step
        assert len(fsdp["losses"]) == len(ddp["losses"]) == 8
        torch.testing.assert_close(fsdp["losses"], ddp["losses"], rtol=0, atol=TOLERANCE)
        assert fsdp["val_loss"] == pytest.approx(ddp["val_loss"], abs=TOLERANCE)
    ddp, fsdp = ranks[0]["ddp"], ranks[0]["fsdp"]  # the files rank 0 wrote
    assert ddp["weights"].keys() == fsdp["weights"].keys()
    for name, weight in ddp["weights"].items():
        torch.testing.assert_close(fsdp["weights"][name], weight, rtol=0, atol=TOLERANCE, msg=name)
    worst = max((fsdp["weights"][n] - w).abs().max().item() for n, w in ddp["weights"].items())
    print(f"{kind}: largest weight difference FSDP - DDP {worst:.2e}")
    for index, state in ddp["optimizer"]["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(fsdp["optimizer"]["state"][index][key], value, rtol=0, atol=TOLERANCE)
    assert any((fsdp["weights"][n] - make_model(kind).state_dict()[n]).abs().max() > 1e-3 for n in ddp["weights"])


def test_manual_optimization_under_fsdp_trains_like_ddp(tmp_path):
    manual = {"accumulate_grad_batches": 1, "gradient_clip_val": None}  # the Trainer's own: refused under manual
    ranks = unpacked(run_ranks(_both, "mlp_manual", str(tmp_path), {}, manual, timeout=120))
    for record in ranks:
        ddp, fsdp = record["ddp"], record["fsdp"]
        assert fsdp["global_step"] == ddp["global_step"] == 16  # 8 batches, two optimizer steps each
        torch.testing.assert_close(fsdp["losses"], ddp["losses"], rtol=0, atol=TOLERANCE)
    ddp, fsdp = ranks[0]["ddp"], ranks[0]["fsdp"]
    for name, weight in ddp["weights"].items():
        torch.testing.assert_close(fsdp["weights"][name], weight, rtol=0, atol=TOLERANCE, msg=name)


def _bytes(runtime, fsdp: bool) -> dict:
    """Parameter plus optimizer-state bytes this rank holds after one step, and how the model was sharded."""
    import gpulayer.trainer as gl

    model = make_model("transformer")
    strategy = FSDPStrategy(auto_wrap_policy={Block}) if fsdp else "ddp"
    trainer = gl.Trainer(devices=2, strategy=strategy, max_steps=1, logger=False, enable_checkpointing=False)
    trainer.fit(model, loader("transformer", runtime.global_rank, 2))

    def local(tensor: torch.Tensor) -> int:
        tensor = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        return tensor.numel() * tensor.element_size()

    optimizer = trainer.optimizers[0]
    state = [value for s in optimizer.state.values() for value in s.values() if value.dim() > 0]
    return {
        "bytes": sum(local(p) for p in model.parameters()) + sum(local(t) for t in state),
        "units": sum(isinstance(m, FSDPModule) for m in model.modules()),
        "sharded": all(isinstance(p, DTensor) for p in model.parameters()),
    }


def test_each_rank_holds_about_half_of_ddps_parameter_and_optimizer_bytes():
    ddp = run_ranks(_bytes, False, timeout=120)
    fsdp = run_ranks(_bytes, True, timeout=120)
    for rank in (0, 1):
        ratio = fsdp[rank]["bytes"] / ddp[rank]["bytes"]
        print(f"rank {rank}: FSDP {fsdp[rank]['bytes']} B, DDP {ddp[rank]['bytes']} B, ratio {ratio:.3f}")
        assert ratio <= MEMORY_TARGET
        assert fsdp[rank]["sharded"] and fsdp[rank]["units"] == 2  # the two blocks; the root is not in the module
