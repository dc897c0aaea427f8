"""Full-state checkpoints: one written under FSDP, DDP or one process resumes under any of them (and under FSDP at
another world size), and the continued run ends with the weights of an uninterrupted one."""

from pathlib import Path

import pytest
import torch

import gpulayer.trainer as gl
from gpulayer.fsdp import FSDPStrategy
from gpulayer.runtime.testing import run_ranks

from .conftest import Block, fit, loader, make_model, packed, unpacked

pytestmark = pytest.mark.multiprocess

TOLERANCE = 1e-5
# SGD with momentum: its buffers are optimizer state that must survive the round trip. (AdamW would turn the
# rounding noise between one process and two ranks on the attention's key bias, whose true gradient is zero, into
# whole steps.)
KIND = "transformer_momentum"


def _fsdp() -> FSDPStrategy:
    return FSDPStrategy(auto_wrap_policy={Block})


def _two_ranks(runtime, folder: str) -> bytes:
    folder, rank = Path(folder), runtime.global_rank
    fit(KIND, _fsdp(), folder / "fsdp-first", rank=rank, max_epochs=1, save=str(folder / "fsdp.ckpt"))
    fit(KIND, "ddp", folder / "ddp-first", rank=rank, max_epochs=1, save=str(folder / "ddp.ckpt"))
    resumed = {
        f"{first} -> {then}": fit(
            KIND, strategy, folder / f"{first}-{then}", rank=rank, ckpt_path=str(folder / f"{first}.ckpt")
        )
        for first, then, strategy in (
            ("fsdp", "ddp", "ddp"),
            ("fsdp", "fsdp", _fsdp()),
            ("ddp", "fsdp", _fsdp()),
            ("one", "fsdp", _fsdp()),
        )
    }
    return packed({"uninterrupted": fit(KIND, _fsdp(), folder / "uninterrupted", rank=rank), **resumed})


def _four_ranks(runtime, folder: str) -> bytes:
    """The two-rank FSDP checkpoint, resumed by four ranks of half the batch."""
    rank = runtime.global_rank
    ckpt = str(Path(folder) / "fsdp.ckpt")
    return packed(fit(KIND, _fsdp(), Path(folder) / "fsdp-four", rank=rank, world_size=4, ckpt_path=ckpt))


def test_checkpoints_resume_across_fsdp_ddp_and_one_process(tmp_path):
    fit(KIND, "auto", tmp_path / "one-first", world_size=1, max_epochs=1, save=str(tmp_path / "one.ckpt"))
    ranks = unpacked(run_ranks(_two_ranks, str(tmp_path), timeout=240))
    expected = ranks[0]["uninterrupted"]
    assert expected["global_step"] == 4
    results = {name: ranks[0][name] for name in ranks[0] if name != "uninterrupted"}
    results["fsdp -> one process"] = fit(
        KIND, "auto", tmp_path / "fsdp-one", world_size=1, ckpt_path=str(tmp_path / "fsdp.ckpt")
    )
    results["fsdp -> fsdp, 4 ranks"] = unpacked(run_ranks(_four_ranks, str(tmp_path), world_size=4, timeout=240))[0]
    for name, resumed in results.items():
        assert resumed["global_step"] == 4, name
        for key, weight in expected["weights"].items():
            torch.testing.assert_close(resumed["weights"][key], weight, rtol=0, atol=TOLERANCE, msg=f"{name}: {key}")
        for index, state in expected["optimizer"]["state"].items():
            for key, value in state.items():
                actual = resumed["optimizer"]["state"][index][key]
                torch.testing.assert_close(actual, value, rtol=0, atol=TOLERANCE, msg=f"{name}: {index}.{key}")
        worst = max((resumed["weights"][k] - w).abs().max().item() for k, w in expected["weights"].items())
        print(f"{name}: largest weight difference from the uninterrupted FSDP run {worst:.2e}")


def _evaluate_after_fit(runtime) -> bytes:
    """validate and test on the module fit left sharded, and a fresh module sharded by validate itself."""

    class Evaluated(type(make_model(KIND))):
        def test_step(self, batch, batch_idx):
            self.validation_step(batch, batch_idx)

    rank = runtime.global_rank
    results = {}
    for name, strategy in (("ddp", "ddp"), ("fsdp", _fsdp())):
        torch.manual_seed(0)
        model = Evaluated()
        trainer = gl.Trainer(devices=2, strategy=strategy, max_steps=2, logger=False, enable_checkpointing=False)
        trainer.fit(model, loader(KIND, rank, 2))
        after_fit = trainer.validate(model, loader(KIND, rank, 2), verbose=False)
        tested = trainer.test(model, loader(KIND, rank, 2), verbose=False)
        torch.manual_seed(0)
        fresh = gl.Trainer(devices=2, strategy=strategy, logger=False).validate(
            Evaluated(), loader(KIND, rank, 2), verbose=False
        )
        results[name] = {"after_fit": after_fit, "test": tested, "fresh": fresh}
    return packed(results)


def test_validate_and_test_run_on_the_sharded_module():
    for rank in unpacked(run_ranks(_evaluate_after_fit, timeout=120)):
        for stage in ("after_fit", "test", "fresh"):
            assert rank["fsdp"][stage][0]["val_loss"] == pytest.approx(rank["ddp"][stage][0]["val_loss"], abs=TOLERANCE)
        assert rank["fsdp"]["after_fit"][0]["val_loss"] != rank["fsdp"]["fresh"][0]["val_loss"]
