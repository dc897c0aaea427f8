"""Sharded saves that return once each rank's shards are copied, and are written while training goes on.

``FSDPStrategy(state_dict_type="sharded", async_save=True)`` (ADR 0026). DCP's ``async_save`` copies this rank's
shards to fresh CPU memory (staging) before it returns, so the next optimizer step cannot change what is written,
then writes them in a thread of its own, with its collectives on a gloo process group of their own. A second
thread per rank waits for that write; on rank 0 it then adds ``meta.pt`` (serialized at the save, so later steps
cannot change it either) and puts the folder in place, as a synchronous save does; every rank then learns whether
the save succeeded everywhere. At most one save is in flight: the next one waits for it first. Removing an older
checkpoint and linking ``last`` wait for the save in flight (``when_checkpoints_written``): a crash at any moment
leaves the previous checkpoint whole.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from gpulayer.fsdp import sharded_checkpoint
from gpulayer.trainer.checkpoint import checkpoint_io


class AsyncSaves:
    """This rank's asynchronous sharded saves: every rank makes the same calls in the same order."""

    writer = dcp.FileSystemWriter  # what writes a rank's files (tests put a gated subclass here)

    def __init__(self, runtime: Any, timeout: timedelta | None) -> None:
        self._runtime = runtime
        self._timeout = timeout
        self._group: dist.ProcessGroup | None = None
        self._lock = threading.Lock()  # guards what both threads touch: the path in flight and the actions
        self._in_flight: Future[None] | None = None
        self._path: str | None = None  # where the save in flight goes, until it is there
        self._after_write: list[Callable[[], None]] = []
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpulayer-sharded-save")

    def save(self, checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
        """Stage this rank's shards and return; the folder appears at ``path`` once every rank wrote."""
        self.wait()
        path, shards = sharded_checkpoint.split(checkpoint, path, self._runtime)
        meta = sharded_checkpoint.serialized(checkpoint) if self._runtime.is_global_zero else b""
        if self._group is None:  # every rank is here: the first save
            self._group = dist.new_group(backend="gloo", timeout=self._timeout)
        folder = contextlib.ExitStack()  # rank 0's lock on the temporary folder and the stager, for the finisher
        with folder:
            stager = _stager()
            folder.callback(stager.close)
            if self._runtime.is_global_zero:
                temporary = self._runtime.broadcast(
                    folder.enter_context(checkpoint_io.locked_temporary_folder(os.path.dirname(path)))
                )
            else:
                temporary = self._runtime.broadcast(None)
            written = dcp.async_save(
                shards,
                checkpoint_id=temporary,
                storage_writer=self.writer(temporary),
                process_group=self._group,
                async_stager=stager,
            )
            with self._lock:
                self._path = path
                self._in_flight = self._finisher.submit(self._finish, written, temporary, path, meta, folder.pop_all())

    def _finish(
        self, written: Future[Any], temporary: str, path: str, meta: bytes, folder: contextlib.ExitStack
    ) -> None:
        error = None
        try:
            with folder:  # an error removes the temporary folder (locked_temporary_folder)
                written.result()  # on rank 0: after every rank's files are written
                if self._runtime.is_global_zero:
                    sharded_checkpoint.publish(temporary, path, meta)
        except BaseException as raised:  # DCP's CheckpointException is a BaseException
            error = raised
        flag = torch.tensor([error is not None], dtype=torch.int32)
        dist.all_reduce(flag, dist.ReduceOp.MAX, group=self._group)
        failed = bool(flag.item())  # on any rank
        with self._lock:
            actions, self._after_write, self._path = self._after_write, [], None
            if not failed:
                for action in actions:
                    action()
        if failed:
            why = (
                f"{type(error).__name__}: {error}"
                if error is not None
                else "it failed on another rank, whose error says why"
            )
            raise RuntimeError(
                f"the sharded checkpoint {path} was not saved: its write in the background (async_save=True) "
                f"failed; the checkpoints saved before it are kept. {why}"
            ) from error

    def wait(self) -> None:
        """Return once the save in flight, if any, is in place on every rank; raise its error if it failed."""
        with self._lock:
            in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def close(self) -> None:
        """``wait``, then release the finisher thread and the save's process group."""
        try:
            self.wait()
        finally:
            self._finisher.shutdown()
            if self._group is not None:
                dist.destroy_process_group(self._group)
                self._group = None

    def when_written(self, action: Callable[[], None]) -> None:
        """Run ``action`` after the save in flight is in place (now, if none is)."""
        with self._lock:
            if self._path is not None:
                self._after_write.append(action)
                return
            action()

    def is_being_written(self, path: str | os.PathLike) -> bool:
        with self._lock:
            return self._path == os.path.abspath(os.fspath(path))


def _stager() -> DefaultStager:
    """A copy of every tensor, blocking, into plain CPU memory (DCP's default for ``async_save``). Given
    explicitly: a ``FileSystemWriter`` would otherwise stage, and it keeps a 0-dim DTensor uncopied."""
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=False, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
        )
    )
