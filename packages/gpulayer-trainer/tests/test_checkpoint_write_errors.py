"""A checkpoint write that fails names the path, the operating system's reason and what is left at that path; the
previous checkpoint stays whole and no temporary is left. Tested on a real 1 MiB tmpfs, full or read-only."""

import ctypes
import errno
import os
import pickle
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer
from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.checkpoint_io import CheckpointWriteError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="mounts a tmpfs with Linux's mount(2)")

_MS_RDONLY, _MS_REMOUNT, _MNT_DETACH = 1, 32, 2
_ABOUT_600_KB = 384  # a Linear(384, 384): one checkpoint fits in 1 MiB, two do not


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


def test_a_save_that_does_not_fit_names_the_path_and_enospc_and_keeps_the_previous_checkpoint(small_filesystem):
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


def test_a_read_only_file_system_is_named_for_the_file_and_for_a_folder_it_cannot_create(small_filesystem):
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


class Wide(Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(_ABOUT_600_KB, _ABOUT_600_KB)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)  # no optimizer state: the file is about the weights


def test_fit_on_a_full_disk_ends_naming_the_file_and_enospc_and_the_earlier_epochs_checkpoint_loads(small_filesystem):
    trainer = Trainer(default_root_dir=small_filesystem, accelerator="cpu", max_epochs=2, logger=False)
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
