"""Checkpoint writes that fail or are cut short. A write that fails names the path, the operating system's reason and
what is left at that path, keeps the previous checkpoint whole and leaves no temporary, whether training waited for
it or not (``async_save=True``); a process killed while a file is written behind training leaves only whole
``*.ckpt`` files. The disk faults happen on a real 1 MiB tmpfs, full or read-only."""

import ctypes
import errno
import os
import pickle
import signal
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, SingleDeviceStrategy, Trainer
from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.checkpoint_io import CheckpointWriteError

AREA = "Checkpoint writes"
_MS_RDONLY, _MS_REMOUNT, _MNT_DETACH = 1, 32, 2
_ABOUT_600_KB = 384  # a Linear(384, 384): one checkpoint fits in 1 MiB, two do not
_on_linux = pytest.mark.skipif(sys.platform != "linux", reason="mounts a tmpfs with Linux's mount(2)")


def _mount(folder, flags=0):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", os.fsencode(folder), b"tmpfs", flags, b"size=1m") != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(folder))


@pytest.fixture
def small_filesystem(tmp_path):
    """A folder on its own 1 MiB tmpfs, unmounted after the test."""
    folder = tmp_path / "small"
    folder.mkdir()
    try:
        _mount(folder)
    except PermissionError as error:  # not root, or no CAP_SYS_ADMIN (a container)
        pytest.skip(f"this test mounts a 1 MiB tmpfs, which this process may not do: {error}")
    try:
        yield folder
    finally:
        ctypes.CDLL(None, use_errno=True).umount2(os.fsencode(folder), _MNT_DETACH)


def _temporaries(folder):
    return [name for name in os.listdir(folder) if checkpoint_io.is_temporary(name)]


@_on_linux
def test_a_save_that_does_not_fit_names_the_path_and_enospc_and_keeps_the_previous_checkpoint(
    small_filesystem, outcome
):
    path = str(small_filesystem / "last.ckpt")
    checkpoint_io.save_atomic({"epoch": 1, "weights": torch.arange(4.0)}, path)
    with pytest.raises(CheckpointWriteError) as raised:
        checkpoint_io.save_atomic({"epoch": 2, "weights": torch.ones(2**19)}, path)  # 2 MiB
    error = raised.value
    assert str(error) == (
        f"could not save the checkpoint {path}: No space left on device (ENOSPC); the checkpoint already at that path "
        "is whole and unchanged, and no other checkpoint was touched"
    )
    assert isinstance(error, OSError) and (error.errno, error.strerror, error.filename) == (
        errno.ENOSPC,
        "No space left on device",
        path,
    )
    assert error.__cause__ is not None  # torch's own error stays in the traceback
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.errno, copy.filename) == (CheckpointWriteError, str(error), error.errno, path)
    previous = checkpoint_io.load(path)
    assert previous["epoch"] == 1 and torch.equal(previous["weights"], torch.arange(4.0))
    assert _temporaries(small_filesystem) == []
    outcome(
        AREA,
        "a 2 MiB checkpoint saved over a 1 MiB tmpfs's last.ckpt",
        data_lost="none: the previous last.ckpt loads unchanged; no temporary is left",
        result="CheckpointWriteError (an OSError, errno ENOSPC) naming the path, 'No space left on device (ENOSPC)'"
        " and that the checkpoint at that path is whole and unchanged; torch's own error is its cause",
    )


@_on_linux
def test_a_read_only_file_system_is_named_for_the_file_and_for_a_folder_it_cannot_create(small_filesystem, outcome):
    path = str(small_filesystem / "last.ckpt")
    checkpoint_io.save_atomic({"epoch": 1}, path)
    _mount(small_filesystem, _MS_REMOUNT | _MS_RDONLY)
    with pytest.raises(CheckpointWriteError) as raised:
        checkpoint_io.save_atomic({"epoch": 2}, path)
    assert str(raised.value) == (
        f"could not save the checkpoint {path}: Read-only file system (EROFS); the checkpoint already at that path "
        "is whole and unchanged, and no other checkpoint was touched"
    )
    assert raised.value.errno == errno.EROFS
    folder = str(small_filesystem / "checkpoints")
    with pytest.raises(CheckpointWriteError) as raised:
        checkpoint_io.save_atomic({"epoch": 2}, os.path.join(folder, "last.ckpt"))
    assert str(raised.value) == (
        f"could not save the checkpoint {folder}/last.ckpt: Read-only file system (EROFS) at {folder}; no file was "
        "written at that path, and no other checkpoint was touched"
    )
    assert checkpoint_io.load(path)["epoch"] == 1
    outcome(
        AREA,
        "a save over a checkpoint on a read-only file system, and into a folder it cannot create there",
        data_lost="none: the checkpoint there loads unchanged",
        result="CheckpointWriteError naming the path and 'Read-only file system (EROFS)', and for the folder where"
        " it failed",
    )


class Wide(Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(_ABOUT_600_KB, _ABOUT_600_KB)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)  # no optimizer state: the file is about the weights


@_on_linux
@pytest.mark.parametrize("async_save", [False, True], ids=["synchronous", "async_save"])
def test_fit_on_a_full_disk_ends_naming_the_file_and_enospc_and_the_earlier_epochs_checkpoint_loads(
    small_filesystem, outcome, async_save
):
    trainer = Trainer(
        default_root_dir=small_filesystem,
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        strategy=SingleDeviceStrategy(async_save=async_save),
    )
    loader = DataLoader(TensorDataset(torch.randn(2, _ABOUT_600_KB)), batch_size=2)
    with pytest.raises(CheckpointWriteError) as raised:
        trainer.fit(Wide(), loader)
    folder = small_filesystem / "checkpoints"
    failed = str(folder / "epoch=1-step=2.ckpt")
    assert str(raised.value) == (
        f"could not save the checkpoint {failed}: No space left on device (ENOSPC); no file was written at that "
        "path, and no other checkpoint was touched"
    )
    assert os.listdir(folder) == ["epoch=0-step=1.ckpt"]
    assert checkpoint_io.load(folder / "epoch=0-step=1.ckpt")["epoch"] == 0
    written = "written behind training (async_save=True)" if async_save else "written while training waits"
    outcome(
        AREA,
        f"fit whose second epoch's checkpoint does not fit on a 1 MiB tmpfs, {written}",
        data_lost="the second epoch's checkpoint; the first epoch's file loads and no temporary is left",
        result="fit fails with CheckpointWriteError naming epoch=1-step=2.ckpt, 'No space left on device (ENOSPC)'"
        " and that no other checkpoint was touched"
        + ("; raised at fit's end, where it waits for the write" if async_save else ""),
    )


_KILLED_WHILE_WRITING = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
from gpulayer.callbacks import ModelCheckpoint
from gpulayer.trainer import Module, SingleDeviceStrategy, Trainer
from gpulayer.trainer.checkpoint import checkpoint_io

saves, torch_save = [], checkpoint_io.torch.save


def second_save_stops_half_written(obj, file):
    saves.append(file)
    if len(saves) < 2:
        return torch_save(obj, file)
    file.write(b"x" * 100_000)
    file.flush()
    print("half written", flush=True)
    sys.stdin.read()  # the parent kills this process here, while training goes on


class Net(Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


checkpoint_io.torch.save = second_save_stops_half_written
checkpoint = ModelCheckpoint(dirpath=sys.argv[1], save_top_k=-1, save_last="link")
trainer = Trainer(max_epochs=1000, strategy=SingleDeviceStrategy(async_save=True), callbacks=[checkpoint],
                  logger=False, enable_progress_bar=False)
trainer.fit(Net(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4))
"""


def test_a_process_killed_while_a_file_is_written_behind_training_leaves_only_whole_checkpoints(tmp_path, outcome):
    folder = tmp_path / "checkpoints"
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_WHILE_WRITING, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        try:
            assert child.stdout.readline() == b"half written\n"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
    whole = sorted(path.name for path in folder.glob("*.ckpt"))
    assert whole == ["epoch=0-step=2.ckpt", "last.ckpt"]  # the second epoch's file is still a temporary
    assert os.readlink(folder / "last.ckpt") == "epoch=0-step=2.ckpt"
    assert all(checkpoint_io.load(folder / name)["global_step"] == 2 for name in whole)
    assert _temporaries(folder)
    outcome(
        AREA,
        "SIGKILL of a one-process fit while its second checkpoint is written behind training (async_save=True)",
        exit_status=child.returncode,
        data_lost="the steps since the first epoch's checkpoint",
        result="every *.ckpt left loads (epoch=0-step=2.ckpt, and last.ckpt linked to it); the half-written file is"
        " a temporary, which the next save in that folder removes",
    )
