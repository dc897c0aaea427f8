"""Sharded checkpoints (``FSDPStrategy(state_dict_type="sharded")``): Lightning's folder layout, bit-exact resume on
the same ranks, resharding to another world size (2, 3 and 4 ranks, and one process) and training on after it, an
interrupted save, and the bad inputs."""

from __future__ import annotations

import copy
import os
import signal
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import gpulayer.trainer as gl
from gpulayer.fsdp import FSDPStrategy
from gpulayer.fsdp.full_state import gather, gather_optimizer
from gpulayer.runtime.testing import RankFailedError, run_ranks
from gpulayer.trainer.checkpoint import checkpoint_io

from .conftest import WIDTH, Block, loader, make_model, packed, unpacked

KIND = "transformer"  # AdamW: two moments per parameter that must come back bit for bit
# 2 -> 4, then one epoch, against the unbroken 2-rank run: the same global batches, but each gradient is averaged
# over 4 ranks' partial means instead of 2 (another order of float additions). Measured max |diff|: 1.19e-7 (2**-23,
# one float32 step between 1 and 2) on the weights, 1.0e-9 on the AdamW moments.
RESHARDED_TRAINING_ATOL = 1.2e-7


def _sharded() -> FSDPStrategy:
    return FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="sharded")


def _fit(
    folder: Path,
    rank: int,
    world_size: int,
    max_epochs: int,
    save: str | None = None,
    callbacks=(),
    accelerator: str = "cpu",
    **options,
):
    """Train on ``world_size`` ranks (``loader``'s global batches), sharded FSDP on 2 or more, one process on 1;
    ``save`` names the folder written after ``fit``. Returns rank 0's full weights and AdamW state (on the CPU),
    the world-size warnings, and the Trainer."""
    trainer = gl.Trainer(
        accelerator=accelerator,
        devices=world_size,
        strategy=_sharded() if world_size > 1 else "auto",
        max_epochs=max_epochs,
        default_root_dir=str(folder),
        logger=False,
        enable_checkpointing=any(isinstance(callback, gl.Checkpoint) for callback in callbacks),
        callbacks=list(callbacks),
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(make_model(KIND), loader(KIND, rank, world_size), **options)
    if save is not None:
        trainer.save_checkpoint(save)
    record = {**_state(trainer), "warnings": [str(w.message) for w in caught if "resharded" in str(w.message)]}
    return record, trainer


def _state(trainer: gl.Trainer) -> dict:
    """``global_step`` and the full weights and AdamW state, on rank 0 (every rank must call it under FSDP)."""
    optimizer = trainer.optimizers[0]
    if trainer.world_size > 1:
        weights, state = gather(trainer.lightning_module.state_dict()), gather_optimizer(optimizer)
    else:
        weights, state = trainer.lightning_module.state_dict(), optimizer.state_dict()
    return {"global_step": trainer.global_step, "weights": weights, "optimizer": state}


class _StateAfterEpochs(gl.Callback):
    """``_state`` at the end of epoch ``epochs`` (counted from 1)."""

    def __init__(self, epochs: int) -> None:
        self.epochs, self.state = epochs, None

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch + 1 == self.epochs:
            self.state = copy.deepcopy(_state(trainer))  # the optimizer steps on in place


def _two_ranks(runtime, folder: str) -> None:
    """Save after epoch 1, resume to epoch 3, and the unbroken run (also its state after epoch 2) (records to
    ``two.pt``); then a save over the first folder that dies mid-way: rank 0 is killed writing ``meta.pt``, after
    every rank wrote its shards."""
    folder, rank = Path(folder), runtime.global_rank
    first, _ = _fit(folder / "first", rank, 2, 1, save=str(folder / "two.ckpt"))
    records = {"first": first, "files": sorted(os.listdir(folder / "two.ckpt"))}
    records["resumed"], trainer = _fit(folder / "resumed", rank, 2, 3, ckpt_path=str(folder / "two.ckpt"))
    after_two = _StateAfterEpochs(2)
    records["unbroken"], _ = _fit(folder / "unbroken", rank, 2, 3, callbacks=[after_two])
    records["unbroken after 2"] = after_two.state
    records["save memory"] = _peak_memory_of_a_sharded_save(folder / "wide.ckpt")
    records["model checkpoint"] = _model_checkpoint_folders(folder, rank)
    records["switches"] = _switches(folder / "switch.ckpt", rank)
    if rank == 0:
        (folder / "two.pt").write_bytes(packed(records))
        trainer.callbacks.append(_KillWhileSaving())
    trainer.save_checkpoint(str(folder / "two.ckpt"))


class _Wide(gl.Module):
    """One 4096 x 4096 layer under AdamW: 201 MB of full state (weights and two moments), 100 MB per rank of 2."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4096, 4096, bias=False)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).square().mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


def _model_checkpoint_folders(folder: Path, rank: int) -> dict | None:
    """``ModelCheckpoint`` keeping the top 2 by ``train_loss`` and ``last`` over 3 epochs, and one with
    ``save_weights_only``: what each leaves in its folder (None without gpulayer-callbacks)."""
    try:
        from gpulayer.callbacks import ModelCheckpoint
    except ImportError:
        return None
    found = {}
    for name, options in (("top 2", dict(save_top_k=2, monitor="train_loss", save_last=True)), ("weights", {})):
        dirpath = folder / f"model-checkpoint-{name}"
        callback = ModelCheckpoint(dirpath=str(dirpath), save_weights_only=name == "weights", **options)
        _fit(folder / name, rank, 2, 3 if name == "top 2" else 1, callbacks=[callback])
        found[name] = {
            entry: sorted(os.listdir(dirpath / entry)) if (dirpath / entry).is_dir() else "file"
            for entry in sorted(os.listdir(dirpath))
        }
        first = dirpath / sorted(os.listdir(dirpath))[0]
        found[name + " keys"] = list(dcp.FileSystemReader(str(first)).read_metadata().state_dict_metadata)
    return found


def _switches(path: Path, rank: int) -> list[str]:
    """One path saved full, then sharded over it, then full again: what lies there after each save."""
    kinds = []
    for state_dict_type in ("full", "sharded", "full"):
        strategy = FSDPStrategy(auto_wrap_policy={Block}, state_dict_type=state_dict_type)
        trainer = gl.Trainer(devices=2, strategy=strategy, max_steps=1, logger=False, enable_checkpointing=False)
        trainer.fit(make_model(KIND), loader(KIND, rank, 2))
        trainer.save_checkpoint(str(path))
        trainer.strategy.barrier()
        kinds.append("folder" if path.is_dir() else "file")
    return kinds


def _peak_memory_of_a_sharded_save(path: Path) -> dict:
    """How far this rank's resident memory rose above its level before ``save_checkpoint`` at its peak during it
    (Linux: writing 5 to ``/proc/self/clear_refs`` resets the peak, ``VmHWM``), against the full state's bytes."""
    trainer = gl.Trainer(devices=2, strategy=_sharded(), max_steps=1, logger=False, enable_checkpointing=False)
    trainer.fit(_Wide(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, 4096))))
    full = 3 * 4096 * 4096 * 4
    Path("/proc/self/clear_refs").write_text("5")
    before = _memory_kib("VmRSS")
    trainer.save_checkpoint(str(path))
    return {"rise": (_memory_kib("VmHWM") - before) * 1024, "full state": full}


def _memory_kib(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(field + ":")))


class _KillWhileSaving(gl.Callback):
    """Puts into the checkpoint an object that kills its process (SIGKILL) as ``torch.save`` pickles it."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint["killer"] = self

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)


def _four_ranks(runtime, folder: str) -> bytes:
    """The 2-rank folder (which the killed save must have left whole) resumed on 4 ranks for one more epoch; a
    4-rank save, resumed on 4 ranks, for 4 -> 3 in the next spawn."""
    folder, rank = Path(folder), runtime.global_rank
    return packed(
        {
            "2 -> 4, one epoch": _fit(folder / "two-four", rank, 4, 2, ckpt_path=str(folder / "two.ckpt"))[0],
            "four": _fit(folder / "four-first", rank, 4, 1, save=str(folder / "four.ckpt"))[0],
            "4 -> 4": _fit(folder / "four-four", rank, 4, 1, ckpt_path=str(folder / "four.ckpt"))[0],
        }
    )


def _three_ranks(runtime, folder: str) -> bytes:
    """The 2- and 4-rank folders loaded on 3 ranks (shards of uneven sizes), and a 3-rank save, for 3 -> 1."""
    folder, rank = Path(folder), runtime.global_rank
    three, _ = _fit(folder / "three-first", rank, 3, 1, save=str(folder / "three.ckpt"))
    return packed(
        {
            "2 -> 3": _fit(folder / "two-three", rank, 3, 1, ckpt_path=str(folder / "two.ckpt"))[0],
            "4 -> 3": _fit(folder / "four-three", rank, 3, 1, ckpt_path=str(folder / "four.ckpt"))[0],
            "three": three,
            "three files": sorted(os.listdir(folder / "three.ckpt")),
        }
    )


def _four_to_two(runtime, folder: str) -> bytes:
    return packed(
        _fit(Path(folder) / "four-two", runtime.global_rank, 2, 1, ckpt_path=str(Path(folder) / "four.ckpt"))[0]
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict]:
    """Four spawns (2 ranks, 4, 3, then 2), and 2 -> 1 and 3 -> 1 in this process: the folder and rank 0's records."""
    folder = tmp_path_factory.mktemp("sharded")
    with pytest.raises(RankFailedError) as failed:  # rank 0 died; rank 1 may first see its peer gone
        run_ranks(_two_ranks, str(folder), timeout=240)
    assert (folder / "two.pt").is_file(), f"the ranks failed before the killed save:\n{failed.value}"
    records = unpacked([(folder / "two.pt").read_bytes()])[0]
    records["leftovers"] = sorted(name for name in os.listdir(folder) if checkpoint_io.is_temporary(name))
    records["leftover files"] = [sorted(os.listdir(folder / name)) for name in records["leftovers"]]
    records.update(unpacked(run_ranks(_four_ranks, str(folder), world_size=4, timeout=240))[0])
    records["swept"] = sorted(name for name in os.listdir(folder) if checkpoint_io.is_temporary(name))
    records.update(unpacked(run_ranks(_three_ranks, str(folder), world_size=3, timeout=120))[0])
    records["4 -> 2"] = unpacked(run_ranks(_four_to_two, str(folder), timeout=120))[0]
    records["2 -> 1"] = _fit(folder / "two-one", 0, 1, 1, ckpt_path=str(folder / "two.ckpt"))[0]
    records["3 -> 1"] = _fit(folder / "three-one", 0, 1, 1, ckpt_path=str(folder / "three.ckpt"))[0]
    return folder, records


def _assert_state_equal(actual: dict, expected: dict, atol: float, name: str) -> None:
    assert actual["global_step"] == expected["global_step"], name
    for key, weight in expected["weights"].items():
        torch.testing.assert_close(actual["weights"][key], weight, rtol=0, atol=atol, msg=f"{name}: {key}")
    assert actual["optimizer"]["state"].keys() == expected["optimizer"]["state"].keys(), name
    for index, state in expected["optimizer"]["state"].items():
        for key, value in state.items():
            got = actual["optimizer"]["state"][index][key]
            torch.testing.assert_close(got, value, rtol=0, atol=atol, msg=f"{name}: {index}.{key}")


@pytest.mark.multiprocess
def test_a_sharded_save_writes_lightnings_folder(runs):
    """DCP's per-rank files and ``.metadata``, and rank 0's ``meta.pt`` with everything but the tensors."""
    folder, records = runs
    assert records["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert records["three files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "meta.pt"]
    meta = torch.load(folder / "four.ckpt" / "meta.pt", weights_only=True)
    assert meta["epoch"] == 1 and meta["global_step"] == records["first"]["global_step"]
    assert {"loops", "lr_schedulers", "rng_states"} <= meta.keys() and not {
        "state_dict",
        "optimizer_states",
    } & meta.keys()
    keys = dcp.FileSystemReader(str(folder / "four.ckpt")).read_metadata().state_dict_metadata
    assert "model.head.weight" in keys and "optimizer_0.state.head.weight.exp_avg" in keys


@pytest.mark.multiprocess
def test_a_rank_saving_its_shards_holds_far_less_than_the_full_state(runs):
    """Measured on rank 0 of 2 (which also writes ``meta.pt``): the rise of its resident memory during the save."""
    memory = runs[1]["save memory"]
    print(
        f"peak rise during a sharded save: {memory['rise'] / 2**20:.1f} MiB; full state {memory['full state'] / 2**20:.0f} MiB"
    )
    assert memory["rise"] < memory["full state"] / 4


@pytest.mark.multiprocess
def test_model_checkpoint_keeps_top_k_and_last_as_folders(runs):
    """Three epochs, top 2 by ``train_loss``: two epoch folders and ``last.ckpt`` remain (the third removed on rank
    0 after every rank wrote); ``save_weights_only`` writes no optimizer state."""
    found = runs[1]["model checkpoint"]
    if found is None:
        pytest.skip("gpulayer-callbacks is not installed")
    layout = [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert len(found["top 2"]) == 3 and "last.ckpt" in found["top 2"]
    assert all(files == layout for files in found["top 2"].values())
    assert list(found["weights"].values()) == [layout]
    assert any(key.startswith("optimizer_0.") for key in found["top 2 keys"])
    assert not any(key.startswith("optimizer_") for key in found["weights keys"])


@pytest.mark.multiprocess
def test_switching_between_full_and_sharded_replaces_what_is_at_the_path(runs):
    """As Lightning: a sharded save replaces a file at its path, a full save a sharded folder (here atomically)."""
    assert runs[1]["switches"] == ["file", "folder", "file"]


@pytest.mark.multiprocess
def test_a_sharded_checkpoint_resumes_bit_exactly_on_the_same_ranks(runs):
    _assert_state_equal(runs[1]["resumed"], runs[1]["unbroken"], atol=0, name="2 -> 2")
    assert runs[1]["resumed"]["warnings"] == []


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["4 -> 4", "2 -> 3", "4 -> 3", "4 -> 2", "2 -> 1", "3 -> 1"])
def test_a_sharded_checkpoint_loads_exactly_on_another_world_size(runs, name):
    """DCP reshards model and AdamW state bit for bit, into and out of 3 ranks' uneven shards too (``fit`` to the
    saved epoch: nothing trains after the load); a world-size change is warned about (RNG streams, sampler
    position)."""
    saved, loaded = name.split(" -> ")
    saved_by = {"2": "first", "3": "three", "4": "four"}[saved]
    _assert_state_equal(runs[1][name], runs[1][saved_by], atol=0, name=name)
    assert len(runs[1][name]["warnings"]) == (saved != loaded)


@pytest.mark.multiprocess
def test_a_run_resharded_from_2_to_4_ranks_trains_on_like_the_unbroken_run(runs):
    """Saved on 2 ranks after epoch 1, one more epoch on 4: the unbroken 2-rank run's weights and AdamW state after
    epoch 2 (global step 8), up to the order in which the ranks' gradients are summed."""
    resharded, unbroken = runs[1]["2 -> 4, one epoch"], runs[1]["unbroken after 2"]
    _assert_state_equal(
        _key_biases_zeroed(resharded), _key_biases_zeroed(unbroken), atol=RESHARDED_TRAINING_ATOL, name="2 -> 4, on"
    )
    assert len(resharded["warnings"]) == 1


def _key_biases_zeroed(record: dict) -> dict:
    """``record`` with the attention's key biases set to 0. Their true gradient is 0 (softmax ignores a score added
    to a whole row), so AdamW's normalised update turns the ranks' rounding noise there into steps of up to its lr
    (measured: 6e-4 after 4 steps); their AdamW moments are that noise, and are compared."""
    weights = dict(record["weights"])
    for name, value in weights.items():
        if name.endswith("attention.in_proj_bias"):
            weights[name] = torch.cat([value[:WIDTH], torch.zeros(WIDTH), value[2 * WIDTH :]])
    return {**record, "weights": weights}


@pytest.mark.multiprocess
def test_a_save_killed_midway_leaves_the_previous_checkpoint_and_no_folder_taken_for_one(runs):
    """Rank 0 died after the shards were written: the previous folder still resumed (2 -> 4 above), the unfinished
    one lies under a temporary name that no ``*.ckpt`` pattern matches, and the next save's sweep removes it."""
    folder, records = runs
    assert len(records["leftovers"]) == 1 and ".metadata" in records["leftover files"][0]
    assert (
        torch.load(folder / "two.ckpt" / "meta.pt", weights_only=True)["global_step"] == records["first"]["global_step"]
    )
    assert not list(folder.glob("*.ckpt.partial/meta.pt"))  # meta.pt was being written: never in place
    assert records["swept"] == []  # the 4-rank save into the same folder removed it (its writer is dead)


def test_state_dict_type_accepts_full_and_sharded_only():
    assert FSDPStrategy().state_dict_type == "full"
    with pytest.raises(ValueError, match=r"state_dict_type='shards'.*'full'.*'sharded'"):
        FSDPStrategy(state_dict_type="shards")


@pytest.mark.parametrize("present", [[], ["meta.pt"], [".metadata"]])
def test_a_folder_without_metadata_or_meta_pt_is_refused_before_any_weight_is_touched(tmp_path, present):
    folder = tmp_path / "broken.ckpt"
    folder.mkdir()
    for name in present:
        (folder / name).write_bytes(b"")  # present, but the folder is refused before either is read
    model = make_model(KIND)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    trainer = gl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path))
    missing = " and no ".join(name for name in (".metadata", "meta.pt") if name not in present)
    with pytest.raises(FileNotFoundError, match=f"refused to load {folder}: .*this one has no {missing}$"):
        trainer.fit(model, loader(KIND, 0, 1), ckpt_path=str(folder))
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_load_from_checkpoint_refuses_a_folder_and_says_what_to_do(tmp_path):
    (tmp_path / "sharded.ckpt").mkdir()
    with pytest.raises(IsADirectoryError, match=r"sharded\.ckpt: it is a folder .*consolidate it into one file first"):
        type(make_model(KIND)).load_from_checkpoint(tmp_path / "sharded.ckpt")


def test_a_full_save_swaps_out_a_sharded_folder_and_refuses_any_other_folder(tmp_path):
    (tmp_path / "sharded.ckpt").mkdir()
    (tmp_path / "sharded.ckpt" / "meta.pt").write_bytes(b"")
    checkpoint_io.save_atomic({"epoch": 1}, tmp_path / "sharded.ckpt")
    assert checkpoint_io.load(tmp_path / "sharded.ckpt") == {"epoch": 1}
    assert not [name for name in os.listdir(tmp_path) if checkpoint_io.is_temporary(name)]
    (tmp_path / "plain.ckpt").mkdir()
    with pytest.raises(IsADirectoryError, match=r"The checkpoint path exists and is a directory: .*plain\.ckpt"):
        checkpoint_io.save_atomic({"epoch": 1}, tmp_path / "plain.ckpt")


def test_a_folder_published_over_a_last_link_replaces_the_link_and_keeps_its_target(tmp_path):
    (tmp_path / "epoch=0.ckpt").mkdir()
    (tmp_path / "last.ckpt").symlink_to("epoch=0.ckpt")
    with checkpoint_io.locked_temporary_folder(tmp_path) as temporary:
        Path(temporary, "meta.pt").write_bytes(b"new")
        checkpoint_io.publish_folder(temporary, tmp_path / "last.ckpt")
    assert not (tmp_path / "last.ckpt").is_symlink() and (tmp_path / "last.ckpt" / "meta.pt").read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["epoch=0.ckpt", "last.ckpt"]
