"""Writing a checkpoint file so that no crash can lose the previous one, and reading one without running code.

Writes go to a temporary file in the same folder, are flushed and fsynced, then renamed over the target:
a process killed mid-save leaves the old file intact. Reads use ``torch.load(weights_only=True)``: only
tensors and plain Python values are rebuilt; a file holding anything else is refused, naming the type, unless
the caller says the file is trusted.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
from typing import Any

import torch

from gpulayer.trainer.private_files import make_folders


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint holds an object that could run code when loaded."""


def save_atomic(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` via a temporary file and a rename; the folder is created if missing."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    make_folders(folder)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".ckpt")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load(path: str | os.PathLike, *, weights_only: bool = True, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint; ``weights_only=False`` is the explicit opt-in for files you trust."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not weights_only:
        return torch.load(path, map_location=map_location, weights_only=False)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        offending = re.search(r"GLOBAL ([\w.]+)", str(error))
        name = offending.group(1) if offending else "an object that is not a tensor or a plain Python value"
        raise UnsafeCheckpointError(
            f"refused to load {path}: it holds {name}, which is not a type GPUlayer writes, and unpickling it could "
            "run code. If you trust this file, load it with weights_only=False (fit(..., weights_only=False), "
            "Module.load_from_checkpoint(..., weights_only=False))."
        ) from None
