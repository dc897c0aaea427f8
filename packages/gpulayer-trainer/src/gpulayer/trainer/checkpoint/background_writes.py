"""Full-state checkpoint files written behind training (``async_save=True`` on one device and under DDP, ADR 0029).

A save copies the checkpoint's tensors to host memory (pinned where they live on a GPU) and returns; a thread writes
the copy with ``checkpoint_io.save_atomic``, so the file appears whole or not at all. The saves of one checkpoint
event (the files saved at one global step: a top-k file, then ``last``) share one staged copy and return at once,
the writes queued in order: a tensor whose storage was staged at its current version is not copied again (a
``state_dict`` gives new tensor objects over the same storage at each call). A save at a later step, or one that
finds a staged tensor changed, waits for the writes in flight first, so at most one staged copy exists. A file
asked for after one that failed is not written (a ``last`` never holds an event whose file is missing). What must
follow a file (the loggers' ``after_save_checkpoint``, removing the file it replaces, the ``last`` link) waits in
order and runs on the training thread once the writes are in place (``finish``), never when one failed.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from gpulayer.trainer.checkpoint import checkpoint_io


class BackgroundWrites:
    """Global rank 0's checkpoint writes in flight, in the order they were asked for."""

    def __init__(self) -> None:
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpulayer-checkpoint-write")
        self._in_flight: list[tuple[str, Future[None]]] = []
        self._after_write: list[Callable[[], None]] = []
        # The staged event's tensors, by storage: key -> (source, kept so its storage is not reused; version; copy).
        self._staged: dict[tuple[Any, ...], tuple[torch.Tensor, int, torch.Tensor]] = {}
        self._step: int | None = None  # the global step of the staged checkpoint event
        self._error: BaseException | None = None  # the first failed write, until ``finish`` reports it
        self._failed = threading.Event()  # set by the writer at a failure: later files are not written

    def save(self, checkpoint: dict[str, Any], path: str | os.PathLike, step: int) -> None:
        """Stage ``checkpoint``, saved at global step ``step``, and return; its file appears at ``path`` once the
        files asked for before it are written."""
        tensors = _tensors(checkpoint)
        if self._in_flight and (step != self._step or any(self._changed(tensor) for tensor in tensors)):
            self.wait()  # the state moved on: the earlier copy is written before a second one is made
        self._step = step
        memo = {id(tensor): self._stage(tensor) for tensor in tensors}
        staged = copy.deepcopy(checkpoint, memo)  # containers and plain values too: training may change them
        copied = torch.cuda.Event() if any(tensor.is_cuda for tensor in tensors) else None
        if copied is not None:
            copied.record()
        written = self._writer.submit(self._write, staged, os.fspath(path), copied)
        self._in_flight.append((os.path.abspath(path), written))

    def is_being_written(self, path: str | os.PathLike) -> bool:
        return os.path.abspath(path) in (where for where, _ in self._in_flight)

    def when_written(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the writes in flight are in place (at once when none is)."""
        if self._in_flight:
            self._after_write.append(action)
        else:
            action()

    def wait(self) -> None:
        """Block until every write in flight ended (the staged copy is freed); a failure is kept for ``finish``."""
        in_flight, self._in_flight, self._staged = self._in_flight, [], {}
        for _, written in in_flight:
            error = written.exception()
            self._error = self._error or error

    def finish(self) -> BaseException | None:
        """``wait``, then run what waited for the writes, in order, unless one failed; the error, if one did (also
        one an earlier ``wait`` saw)."""
        self.wait()
        error, self._error = self._error, None
        self._failed.clear()
        actions, self._after_write = self._after_write, []
        if error is None:
            for action in actions:
                action()
        return error

    def close(self) -> BaseException | None:
        """``finish``, then stop the writer thread."""
        try:
            return self.finish()
        finally:
            self._writer.shutdown()

    def _changed(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage was staged at another version (changed in place since)."""
        found = self._staged.get(_storage_key(tensor))
        return found is not None and found[1] != tensor._version

    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        found = self._staged.get(key)
        if found is not None and found[1] == tensor._version:
            return found[2]
        if tensor.is_cuda:  # pinned: the copy runs on the stream, and the writer waits for it (see save)
            staged = torch.empty_like(tensor, device="cpu", pin_memory=True).copy_(tensor.detach(), non_blocking=True)
        else:
            staged = tensor.detach().clone()
        self._staged[key] = (tensor, tensor._version, staged)
        return staged

    def _write(self, checkpoint: dict[str, Any], path: str, copied: torch.cuda.Event | None) -> None:
        """On the writer thread; nothing after a failed file until ``finish`` reported it."""
        if self._failed.is_set():
            return
        if copied is not None:
            copied.synchronize()
        try:
            checkpoint_io.save_atomic(checkpoint, path)
        except BaseException:
            self._failed.set()
            raise


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What a tensor views: the same for a parameter and each ``detach()`` of it (which share its version)."""
    return tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride()


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value``'s dicts, lists and tuples, each once."""
    found: dict[int, torch.Tensor] = {}
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.setdefault(id(item), item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return list(found.values())
