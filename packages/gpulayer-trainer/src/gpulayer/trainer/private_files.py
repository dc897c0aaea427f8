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
