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
    stopped = {name: _stopped_by_max_steps(name, folder, rank) for name in ("ddp", "fsdp")}
    uninterrupted = fit(KIND, _fsdp(), folder / "uninterrupted", rank=rank)
    return packed({"uninterrupted": uninterrupted, "resumed": resumed, "stopped by max_steps": stopped})


def _stopped_by_max_steps(name: str, folder: Path, rank: int) -> dict:
    """Under ``name``: ``max_steps=2`` stops epoch 0 (4 batches, shuffled by the distributed sampler) in the middle,
    ``save_checkpoint`` after ``fit``, and a new Trainer goes on to ``max_steps=6``, into epoch 1; and the
    unbroken run to 6 steps."""
    run = dict(kind="transformer", shuffled=True, rank=rank, max_epochs=-1, accumulate_grad_batches=1)
    ckpt = str(folder / f"{name}-stopped.ckpt")
    fit(strategy=_strategy(name), folder=folder / f"{name}-stop", max_steps=2, save=ckpt, **run)
    return {
        "resumed": fit(strategy=_strategy(name), folder=folder / f"{name}-resumed", max_steps=6, ckpt_path=ckpt, **run),
        "unbroken": fit(strategy=_strategy(name), folder=folder / f"{name}-unbroken", max_steps=6, **run),
    }


def _strategy(name: str) -> object:
    return _fsdp() if name == "fsdp" else name


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, dict]:
    """One spawn of 2 ranks for the tests below: its folder and rank 0's records."""
    folder = tmp_path_factory.mktemp("two-ranks")
    fit(KIND, "auto", folder / "one-first", world_size=1, max_epochs=1, save=str(folder / "one.ckpt"))
    return folder, unpacked(run_ranks(_two_ranks, str(folder), timeout=300))[0]


def _four_ranks(runtime, folder: str) -> bytes:
    """The two-rank FSDP checkpoint, resumed by four ranks of half the batch."""
    rank = runtime.global_rank
    ckpt = str(Path(folder) / "fsdp.ckpt")
    return packed(fit(KIND, _fsdp(), Path(folder) / "fsdp-four", rank=rank, world_size=4, ckpt_path=ckpt))


def test_checkpoints_resume_across_fsdp_ddp_and_one_process(two_ranks):
    folder, records = two_ranks
    expected = records["uninterrupted"]
    assert expected["global_step"] == 4
    results = dict(records["resumed"])
    results["fsdp -> one process"] = fit(
        KIND, "auto", folder / "fsdp-one", world_size=1, ckpt_path=str(folder / "fsdp.ckpt")
    )
    results["fsdp -> fsdp, 4 ranks"] = unpacked(run_ranks(_four_ranks, str(folder), world_size=4, timeout=240))[0]
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


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_run_max_steps_stopped_mid_epoch_resumes_to_the_unbroken_weights(two_ranks, strategy):
    """On 2 ranks, under DDP and FSDP, a run that ``max_steps`` stopped mid-epoch and a new Trainer resumed from
    the file saved after ``fit`` ends with the unbroken run's weights and AdamW state, bit for bit, having seen
    its losses (the rest of the stopped epoch's shuffled shard, then the next epoch)."""
    run = two_ranks[1]["stopped by max_steps"][strategy]
    resumed, unbroken = run["resumed"], run["unbroken"]
    assert resumed["global_step"] == unbroken["global_step"] == 6
    assert resumed["losses"] == unbroken["losses"][2:]
    for key, weight in unbroken["weights"].items():
        torch.testing.assert_close(resumed["weights"][key], weight, rtol=0, atol=0, msg=key)
    for index, state in unbroken["optimizer"]["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(resumed["optimizer"]["state"][index][key], value, rtol=0, atol=0)


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
