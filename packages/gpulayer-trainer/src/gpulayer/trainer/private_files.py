"""Folders and files the Trainer makes are never world-writable, whatever the umask (Python gives ``os.makedirs``'s
``mode`` to the last folder only, and ``open`` creates files 0o666 less the umask)."""

from __future__ import annotations

import os


def make_folders(folder: str) -> None:
    """``os.makedirs(folder, exist_ok=True)`` whose new folders lose the world-write bit and nothing else."""
    folder = os.path.abspath(folder)  # a relative name's parents end in "", which is no folder
    if os.path.isdir(folder):
        return
    make_folders(os.path.dirname(folder))
    try:
        os.mkdir(folder, 0o775)
    except FileExistsError:
        if not os.path.isdir(folder):
            raise


def not_world_writable(path: str, flags: int) -> int:
    """An ``opener`` for ``open``: a file it creates is 0o664 less the umask."""
    return os.open(path, flags, 0o664)


def write_atomically(path: str, content: bytes) -> None:
    """A crash leaves the old file or the new one, never half of one."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb", opener=not_world_writable) as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
