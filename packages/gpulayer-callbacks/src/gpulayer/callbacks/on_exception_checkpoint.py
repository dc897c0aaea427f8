"""``OnExceptionCheckpoint``: save a checkpoint when an entry point raises, as Lightning 2.6 does
(``lightning/pytorch/callbacks/on_exception_checkpoint.py``)."""

from __future__ import annotations

import os
from typing import Any

from gpulayer.trainer import Checkpoint


class OnExceptionCheckpoint(Checkpoint):
    """Write ``<dirpath>/<filename>.ckpt`` (atomically, through ``trainer.save_checkpoint``) from ``on_exception``,
    on whichever exception ends ``fit``, ``validate``, ``test`` or ``predict``, overwriting an earlier one. A later
    ``fit`` resumes from it by itself (Lightning's rule: without a ``ckpt_path``, "last", which includes this
    file), or from ``ckpt_path=callback.ckpt_path``. An entry point that ends well removes the file at its
    ``teardown``, as Lightning's does.

    Under DDP each rank that raises calls ``save_checkpoint``, where global rank 0 alone writes, with its own state:
    on an error every rank meets, or on the collective error a rank that failed alone leaves rank 0 with.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike, filename: str = "on_exception") -> None:
        # Lightning's checks stop at an empty filename; a dirpath or filename of another type would fail only
        # inside the exception it is saving for.
        if not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(f"dirpath={dirpath!r}: accepted values are a folder's path (a str or os.PathLike)")
        if not isinstance(filename, str):
            raise TypeError(f"filename={filename!r}: accepted values are a file name without its extension (a str)")
        if not filename:  # Lightning's message, word for word
            raise ValueError("The filename cannot be empty")
        # Set now, not in setup: an exception can come at any moment.
        self.dirpath = dirpath
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def on_exception(self, trainer: Any, *_: Any, **__: Any) -> None:
        trainer.save_checkpoint(self.ckpt_path)

    def teardown(self, trainer: Any, *_: Any, **__: Any) -> None:
        trainer.strategy.remove_checkpoint(self.ckpt_path)
