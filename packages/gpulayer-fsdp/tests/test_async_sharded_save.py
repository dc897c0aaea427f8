"""``FSDPStrategy(state_dict_type="sharded", async_save=True)``: a save returns once staged and is written while
training goes on, yet writes exactly what a synchronous save writes; ``meta.pt``, removing an older checkpoint and
linking ``last`` wait for the write; a failed write keeps the previous checkpoint and fails ``fit`` on every rank;
a rank killed while a save is written leaves the previous checkpoint whole.

One spawn of 2 gloo ranks. Each rank's files are written through ``_GatedWriter``, a DCP ``FileSystemWriter`` that
waits for the test's callback to let each write through: so the test knows, without timing, that a save is still
in flight when it looks.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import gpulayer.trainer as gl
from gpulayer.fsdp import FSDPStrategy
from gpulayer.runtime.testing import RankFailedError, run_ranks
from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.sharded import AsyncSaves

from .conftest import Block, loader, make_model, packed, unpacked

KIND = "transformer"  # AdamW: the moments must be the saved step's, not a later one's
STEP_2, STEP_4 = "epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"
WAIT_S = 60  # a write the test never lets through fails the run instead of hanging it


class _GatedWriter(dcp.FileSystemWriter):
    """Writes a rank's files once the test lets one more write through."""

    permits = threading.Semaphore(0)

    def write_data(self, plan, planner):
        if not self.permits.acquire(timeout=WAIT_S):
            raise TimeoutError("the test never let this write through")
        return super().write_data(plan, planner)


class _FailingSecondWrite(dcp.FileSystemWriter):
    """Rank 1's second write fails as a full disk would."""

    calls = 0

    def write_data(self, plan, planner):
        type(self).calls += 1
        if type(self).calls == 2 and torch.distributed.get_rank() == 1:
            raise OSError(28, "No space left on device (the test's writer)")
        return super().write_data(plan, planner)


class _Look(gl.Callback):
    """After steps 3 and 5 (one step after each save began): what lies in the checkpoint folder, then, once every
    rank has looked, one write is let through."""

    def __init__(self, dirpath: Path) -> None:
        self.dirpath, self.seen = dirpath, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step in (3, 5):
            self.seen[trainer.global_step] = _contents(self.dirpath)
            trainer.strategy.barrier()  # no rank's write may begin before rank 0 has looked
            _GatedWriter.permits.release()


class _KillWhileWriting(gl.Callback):
    """Lets the step-2 save through at step 3; at step 5, with step 4's save held, kills rank 0 (SIGKILL)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 3:
            _GatedWriter.permits.release()
        elif trainer.global_step == 5 and trainer.is_global_zero:
            os.kill(os.getpid(), signal.SIGKILL)


def _contents(folder: Path) -> dict:
    """Each entry: its files (a temporary folder's under the name "temporary"), or where a link points."""
    found = {}
    for name in sorted(os.listdir(folder)) if folder.is_dir() else []:
        path = folder / name
        key = "temporary" if checkpoint_io.is_temporary(name) else name
        found[key] = os.readlink(path) if path.is_symlink() else sorted(os.listdir(path))
    return found


def _fit(folder: Path, rank: int, async_save: bool, max_steps: int = 5, callbacks=(), accelerator: str = "cpu"):
    from gpulayer.callbacks import ModelCheckpoint

    dirpath = folder / "checkpoints"
    every_two = ModelCheckpoint(dirpath=str(dirpath), every_n_train_steps=2, save_top_k=1, save_last="link")
    trainer = gl.Trainer(
        accelerator=accelerator,
        devices=2,
        strategy=FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="sharded", async_save=async_save),
        max_steps=max_steps,
        default_root_dir=str(folder),
        logger=False,
        callbacks=[every_two, *callbacks],
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(make_model(KIND), loader(KIND, rank, 2))
    return trainer, dirpath


def _ranks(runtime, folder: str) -> bytes:
    folder, rank = Path(folder), runtime.global_rank
    _fit(folder / "synchronous", rank, async_save=False)
    look = _Look(folder / "asynchronous" / "checkpoints")
    AsyncSaves.writer = _GatedWriter
    trainer, dirpath = _fit(folder / "asynchronous", rank, async_save=True, callbacks=[look])
    record = {"seen": look.seen, "after fit": _contents(dirpath)}
    record["threads after fit"] = [t.name for t in threading.enumerate() if t.name.startswith("gpulayer-sharded-save")]
    trainer.save_checkpoint(str(folder / "after-fit.ckpt"))  # synchronous: the gate would hold it for WAIT_S
    record["after fit, at once"] = sorted(os.listdir(folder / "after-fit.ckpt"))
    AsyncSaves.writer = _FailingSecondWrite
    try:
        _fit(folder / "failing", rank, async_save=True, max_steps=4)
    except Exception as error:
        record["failure"] = (type(error).__name__, str(error), type(error.__cause__).__name__)
    record["after failure"] = _contents(folder / "failing" / "checkpoints")
    (folder / f"record-{rank}.pt").write_bytes(packed(record))
    AsyncSaves.writer = _GatedWriter
    _fit(folder / "killed", rank, async_save=True, max_steps=6, callbacks=[_KillWhileWriting()])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The spawn ends with rank 0 killed; each rank's records were written before."""
    folder = tmp_path_factory.mktemp("async")
    pytest.importorskip("gpulayer.callbacks")
    with pytest.raises(RankFailedError) as failed:
        run_ranks(_ranks, str(folder), timeout=240)
    records = [folder / f"record-{rank}.pt" for rank in (0, 1)]
    assert all(path.is_file() for path in records), f"the ranks failed before the killed run:\n{failed.value}"
    return folder, unpacked([path.read_bytes() for path in records])


SHARDS = ["__0_0.distcp", "__1_0.distcp", ".metadata"]


@pytest.mark.multiprocess
def test_a_save_in_flight_is_not_in_place_and_keeps_the_previous_checkpoint(runs):
    _, (rank0, _) = runs
    # Step 3: the step-2 save is being written under a temporary name, without meta.pt; last waits for it.
    assert rank0["seen"][3] == {"temporary": []}
    # Step 5: the step-2 folder is whole and still kept, and last points at it, while step 4's is written.
    assert rank0["seen"][5] == {STEP_2: sorted([*SHARDS, "meta.pt"]), "last.ckpt": STEP_2, "temporary": []}


@pytest.mark.multiprocess
def test_fit_returns_with_its_last_save_in_place_and_the_old_one_removed(runs):
    _, ranks = runs
    for record in ranks:  # rank 1 too: it returns only after rank 0 put the folder in place
        assert record["after fit"][STEP_4] == sorted([*SHARDS, "meta.pt"])
    assert ranks[0]["after fit"] == {STEP_4: sorted([*SHARDS, "meta.pt"]), "last.ckpt": STEP_4}
    assert ranks[1]["after fit, at once"] == sorted([*SHARDS, "meta.pt"])  # a save after fit: synchronous
    assert [record["threads after fit"] for record in ranks] == [[], []]


@pytest.mark.multiprocess
def test_an_asynchronous_save_writes_what_a_synchronous_one_writes(runs, tmp_path):
    """Step 5 trained while step 4's save was held: staging copied the shards, so the folder still holds step 4."""
    assert_same_folders(runs[0], tmp_path)


def assert_same_folders(folder: Path, scratch: Path) -> None:
    """The step-4 folders of the synchronous and the asynchronous run hold the same state, bit for bit."""
    saved = {}
    for kind in ("synchronous", "asynchronous"):
        dcp_to_torch_save(str(folder / kind / "checkpoints" / STEP_4), str(scratch / kind))
        saved[kind] = torch.load(scratch / kind, weights_only=True)
        saved[kind]["meta"] = torch.load(folder / kind / "checkpoints" / STEP_4 / "meta.pt", weights_only=True)
    synchronous, asynchronous = saved["synchronous"], saved["asynchronous"]
    assert asynchronous["model"].keys() == synchronous["model"].keys()
    for key, weight in synchronous["model"].items():
        assert torch.equal(asynchronous["model"][key], weight), key
    assert asynchronous["optimizer_0"]["param_groups"] == synchronous["optimizer_0"]["param_groups"]
    torch.testing.assert_close(
        asynchronous["optimizer_0"]["state"], synchronous["optimizer_0"]["state"], rtol=0, atol=0
    )
    for key in ("epoch", "global_step", "loops"):
        assert _equal(asynchronous["meta"][key], synchronous["meta"][key]), key


def _equal(first, second) -> bool:
    """Nested dicts and lists equal, their tensors bit for bit."""
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    if isinstance(first, dict):
        return (
            isinstance(second, dict)
            and first.keys() == second.keys()
            and all(_equal(first[k], second[k]) for k in first)
        )
    if isinstance(first, (list, tuple)):
        return type(first) is type(second) and len(first) == len(second) and all(map(_equal, first, second))
    return first == second


@pytest.mark.multiprocess
def test_a_failed_write_fails_fit_on_every_rank_and_keeps_the_previous_checkpoint(runs):
    _, ranks = runs
    for record in ranks:
        kind, message, cause = record["failure"]
        assert (kind, cause) == ("RuntimeError", "CheckpointException"), message
        assert f"{STEP_4} was not saved" in message and "async_save=True" in message, message
    assert "No space left on device" in ranks[1]["failure"][1]
    # The step-2 checkpoint stays (its removal waited for a write that failed); no unfinished folder is left.
    assert ranks[0]["after failure"] == {STEP_2: sorted([*SHARDS, "meta.pt"]), "last.ckpt": STEP_2}


@pytest.mark.multiprocess
def test_a_rank_killed_while_a_save_is_written_leaves_the_previous_checkpoint_whole(runs, tmp_path):
    """Rank 0 SIGKILLed with step 4's save held: step 2's folder, and ``last`` pointing at it, are untouched (their
    removal and relinking waited for the write); the unfinished folder lies under a temporary name."""
    folder = runs[0] / "killed" / "checkpoints"
    assert _contents(folder) == {STEP_2: sorted([*SHARDS, "meta.pt"]), "last.ckpt": STEP_2, "temporary": []}
    dcp_to_torch_save(str(folder / "last.ckpt"), str(tmp_path / "last"))
    assert torch.load(tmp_path / "last", weights_only=True)["model"].keys()
    assert torch.load(folder / "last.ckpt" / "meta.pt", weights_only=True)["global_step"] == 2


def test_async_save_is_a_bool_for_sharded_checkpoints_only():
    with pytest.raises(TypeError, match=r"async_save='yes'.*True and False"):
        FSDPStrategy(state_dict_type="sharded", async_save="yes")
    with pytest.raises(ValueError, match=r"async_save=True, state_dict_type='full'.*state_dict_type='sharded'"):
        FSDPStrategy(async_save=True)
    assert repr(FSDPStrategy(state_dict_type="sharded", async_save=True)) == (
        "FSDPStrategy(state_dict_type='sharded', async_save=True)"
    )
