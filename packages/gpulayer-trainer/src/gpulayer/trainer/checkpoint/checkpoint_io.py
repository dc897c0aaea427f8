"""Writing a checkpoint file so that no crash can lose the previous one, and reading one without running code.

Writes go to a temporary file in the same folder, are flushed and fsynced, then renamed over the target:
a process killed mid-save leaves the old file intact, and its temporary ``.tmp-*.ckpt.partial`` behind, a name no
``*.ckpt`` pattern matches. The writer holds an exclusive lock on its temporary file until the rename, and the lock
dies with the writer: the next save into the folder removes the temporaries nobody holds, never one that a live
writer (another job sharing the folder) is still writing. Reads use ``torch.load(weights_only=True)``: only
tensors and plain Python values are rebuilt; a file holding anything else is refused, naming the type, unless
the caller says the file is trusted. A file that is empty, truncated or no checkpoint at all is refused as such:
trusting it would not help. A sharded checkpoint (a folder) is written the same way: into a locked temporary
folder of that name, swapped into place once complete (ADR 0024). A save that fails (a full disk, a read-only
folder) raises ``CheckpointWriteError``, an ``OSError`` that names the path, the operating system's reason and what
is left at that path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pickle
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from typing import IO, Any

import torch

from gpulayer.trainer.private_files import make_folders

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so leftovers are never taken for dead and stay
    fcntl = None


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint holds an object that could run code when loaded."""


class DamagedCheckpointError(Exception):
    """The file is no whole checkpoint, so no trust can load it. Each subclass is also the builtin type that torch
    raised for most such files, so ``except`` clauses written for torch's errors still catch it."""


class EmptyCheckpointError(DamagedCheckpointError, EOFError):
    """The file has no bytes."""


class TruncatedCheckpointError(DamagedCheckpointError, OSError):
    """The file begins as a checkpoint but its end is missing."""


class NotACheckpointError(DamagedCheckpointError, pickle.UnpicklingError):
    """The file is not a checkpoint: not a format ``torch.save`` writes, or not a dict."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written: ``errno`` and ``strerror`` are the operating system's reason, ``filename``
    the checkpoint's path, and the message says what is left there."""

    def __init__(self, message: str, code: int, path: str) -> None:
        super().__init__(code, os.strerror(code), path)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # errors cross processes as pickles (spawned ranks, Ray)
        return type(self), (self.message, self.errno, self.filename)


METADATA_FILENAME = "meta.pt"  # a sharded folder's non-tensor state (lightning/fabric/utilities/load.py)
TEMPORARY_PREFIX, TEMPORARY_SUFFIX = ".tmp-", ".ckpt.partial"
_OLD_TEMPORARY_SUFFIX = ".ckpt"  # the name until 2026-12-04, which ``*.ckpt`` matched; an upgraded run may leave some
_AT_FDCWD = -100  # renameat2's "relative to the current directory"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6 is a zip archive
# The older format opens with the pickled magic number: b"\x80", the pickle protocol, then this.
_LEGACY_MAGIC = b"\x8a\n" + torch.serialization.MAGIC_NUMBER.to_bytes(10, "little")


def is_temporary(name: str) -> bool:
    """Whether a file name in a checkpoint folder is a save under way (or the leftover of a writer that died)."""
    return name.startswith(TEMPORARY_PREFIX) and name.endswith((TEMPORARY_SUFFIX, _OLD_TEMPORARY_SUFFIX))


def save_atomic(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` via a temporary file and a rename; the folder is created if missing, and the
    temporaries that dead writers left in it are removed."""
    path = os.fspath(path)
    replaced_folder = os.path.isdir(path) and not os.path.islink(path)
    if replaced_folder and not is_sharded_checkpoint(path):  # Lightning's error
        raise IsADirectoryError(f"The checkpoint path exists and is a directory: {path}")
    folder = os.path.dirname(os.path.abspath(path))
    with _naming_write_errors(path):
        make_folders(folder)
        remove_dead_temporaries(folder)
        with _locked_temporary(folder) as (file, temporary):
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
            # Under the lock: a sweeper must not take a finished file for a dead one. A sharded checkpoint there (a
            # run switched to "full") is swapped out in the same single step, as a folder save swaps out a file.
            _exchange(temporary, path) if replaced_folder else os.replace(temporary, path)
    if replaced_folder:
        remove(temporary)
    _fsync_folder(folder)


@contextlib.contextmanager
def _naming_write_errors(path: str) -> Iterator[None]:
    """A save into ``path`` that the operating system refused raises ``CheckpointWriteError``, naming its reason."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        cause = _system_error(error)
        if cause is None:
            raise
        raise CheckpointWriteError(_write_failure(path, cause), cause.errno, path) from error


def _system_error(error: BaseException) -> OSError | None:
    """The operating system's error behind a failed save. torch.save, given a Python file, lets the file's
    ``OSError`` out of its writer, and closing the archive then fails with a bare ``RuntimeError`` ("unexpected
    pos") raised while handling it: the ``OSError`` is its context."""
    if isinstance(error, RuntimeError):
        error = error.__context__
    return error if isinstance(error, OSError) and error.errno else None


def _write_failure(path: str, cause: OSError) -> str:
    """What a failed save says: the path, the system's reason (and the folder it concerns, if not the path's own),
    and what is left."""
    reason = f"{cause.strerror or os.strerror(cause.errno)} ({errno.errorcode.get(cause.errno, cause.errno)})"
    failed = cause.filename  # the temporary file, or a folder that could not be created
    if failed not in (None, path) and not is_temporary(os.path.basename(failed)):
        reason += f" at {failed}"
    return f"could not save the checkpoint {path}: {reason}; {_what_is_left(path)}"


def _what_is_left(path: str) -> str:
    """A failed save touches neither the file at its path (it writes a temporary) nor any other checkpoint."""
    if not os.path.lexists(path):
        return "no file was written at that path, and no other checkpoint was touched"
    try:
        whole = is_sharded_checkpoint(path) or (os.path.isfile(path) and _damage(path) is None)
    except OSError:  # unreadable: say no more than we know
        whole = False
    kept = "the checkpoint already at that path is whole and" if whole else "the file already at that path is"
    return f"{kept} unchanged, and no other checkpoint was touched"


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """Lightning's ``_is_sharded_checkpoint``: a folder holding ``meta.pt``."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, METADATA_FILENAME))


def remove_dead_temporaries(folder: str) -> list[str]:
    """Remove the temporary files in ``folder`` whose writer is gone (no process holds their lock); return
    their names. A file that a live writer holds stays."""
    if fcntl is None:
        return []
    try:
        names = [name for name in os.listdir(folder) if is_temporary(name)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(folder, name)
        folder_ = os.path.isdir(path) and not os.path.islink(path)
        try:  # read-write: NFS grants exclusive locks only to writers (a folder opens read-only)
            handle = os.open(path, os.O_RDONLY if folder_ else os.O_RDWR)
        except OSError:  # renamed or removed meanwhile, or not ours to open
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its writer is alive
            os.close(handle)
            continue
        try:
            if os.path.samestat(os.fstat(handle), os.stat(path)):  # not renamed by a writer that just finished
                shutil.rmtree(path, ignore_errors=True) if folder_ else os.unlink(path)
                removed.append(name)
        except FileNotFoundError:
            pass
        finally:
            os.close(handle)
    return removed


@contextlib.contextmanager
def _locked_temporary(folder: str) -> Iterator[tuple[IO[bytes], str]]:
    """A new temporary file in ``folder``, locked until closed; removed if the block fails before renaming it."""
    while True:
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=TEMPORARY_PREFIX, suffix=TEMPORARY_SUFFIX)
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        if os.fstat(handle).st_nlink:
            break
        os.close(handle)  # a sweeper locked it between its creation and our lock, and removed it: take another
    try:
        with os.fdopen(handle, "wb") as file:
            yield file, temporary
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def locked_temporary_folder(parent: str | os.PathLike) -> Iterator[str]:
    """A new temporary folder in ``parent`` (created if missing, its dead temporaries removed), locked until the
    block ends; removed if the block fails. Publish it inside the block with ``publish_folder``."""
    parent = os.path.abspath(os.fspath(parent))
    make_folders(parent)
    remove_dead_temporaries(parent)
    while True:
        temporary = tempfile.mkdtemp(dir=parent, prefix=TEMPORARY_PREFIX, suffix=TEMPORARY_SUFFIX)
        handle = os.open(temporary, os.O_RDONLY)
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        if os.fstat(handle).st_nlink:
            break
        os.close(handle)  # a sweeper removed it between its creation and our lock: take another
    try:
        yield temporary
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    finally:
        os.close(handle)


def publish_folder(temporary: str, path: str | os.PathLike) -> None:
    """Put the finished folder ``temporary`` at ``path``, in one step: a checkpoint already there (file or folder)
    is exchanged with it atomically, then removed; a crash at any point leaves a whole checkpoint at ``path``."""
    path = os.path.abspath(os.fspath(path))
    _fsync_tree(temporary)
    if os.path.lexists(path):
        _exchange(temporary, path)  # the old checkpoint now lies at the temporary name, which no pattern matches
        remove(temporary)
    else:
        os.rename(temporary, path)
    _fsync_folder(os.path.dirname(path))


def remove(path: str | os.PathLike) -> None:
    """A checkpoint file, link (dangling or not: the link itself) or folder, if there."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def _exchange(first: str, second: str) -> None:
    """Swap two paths atomically (Linux's ``renameat2(RENAME_EXCHANGE)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None or renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), 2) != 0:
        code = ctypes.get_errno() if renameat2 is not None else errno.ENOSYS
        raise OSError(
            code,
            f"cannot replace {second} atomically ({os.strerror(code)}): this platform or file system has no "
            "renameat2(RENAME_EXCHANGE); save the sharded checkpoint under a new name",
        )


def _fsync_tree(folder: str) -> None:
    for root, _, names in os.walk(folder):
        for name in names:
            handle = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
        _fsync_folder(root)


def _fsync_folder(folder: str) -> None:
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load(path: str | os.PathLike, *, weights_only: bool = True, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint; ``weights_only=False`` is the explicit opt-in for files you trust. A damaged file raises a
    ``DamagedCheckpointError`` naming what is wrong with it, whatever the trust."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"refused to load {path}: it is a folder (a sharded checkpoint, one file per rank), and this reads one "
            "file; resume from the folder with trainer.fit(ckpt_path=...) (any strategy, any number of ranks), or "
            "consolidate it into one file first"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=weights_only)
    except Exception as error:
        damage = _damage(path)
        if damage is not None:
            raise damage from None  # torch's text would suggest weights_only=False, which cannot help
        if not weights_only or not isinstance(error, pickle.UnpicklingError):
            raise
        offending = re.search(r"GLOBAL ([\w.]+)", str(error))
        name = offending.group(1) if offending else "an object that is not a tensor or a plain Python value"
        raise UnsafeCheckpointError(
            f"refused to load {path}: it holds {name}, which is not a tensor or a plain Python value (such as "
            "a module's OmegaConf hyperparameters), and unpickling it could run code. If you trust this file, load "
            "it with weights_only=False (fit(..., weights_only=False), Module.load_from_checkpoint(..., "
            "weights_only=False))."
        ) from None
    if not isinstance(checkpoint, dict):
        raise NotACheckpointError(
            f"refused to load {path}: it is not a checkpoint: it holds a {type(checkpoint).__name__}, and a "
            "checkpoint is a dict"
        )
    return checkpoint


def _damage(path: str) -> DamagedCheckpointError | None:
    """The error for a file that torch could not load, when its bytes show it to be empty, truncated or no
    checkpoint; ``None`` for a whole archive (or a file in torch's pre-1.6 format), whose error is torch's own."""
    with open(path, "rb") as file:
        head = file.read(16)
    refused = f"refused to load {path}: "
    if not head:
        return EmptyCheckpointError(refused + "the file is empty (0 bytes)")
    if _ZIP_MAGIC.startswith(head[:4]):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except zipfile.BadZipFile:
            return TruncatedCheckpointError(
                refused + f"the file is truncated: it stops after {os.path.getsize(path)} bytes, before the end of "
                "the checkpoint it begins (a save that did not finish, or a copy that stopped early)"
            )
        if any(name.count("/") == 1 and name.endswith("/data.pkl") for name in names):
            return None
        return NotACheckpointError(refused + "it is not a checkpoint: a zip archive that torch.save did not write")
    if head[:1] == b"\x80":  # a pickle
        if head[2:].startswith(_LEGACY_MAGIC):
            return None
        return NotACheckpointError(refused + "it is not a checkpoint: a pickle that torch.save did not write")
    return NotACheckpointError(
        refused + f"it is not a checkpoint: torch.save writes a zip archive, and this file begins with {head!r}"
    )
