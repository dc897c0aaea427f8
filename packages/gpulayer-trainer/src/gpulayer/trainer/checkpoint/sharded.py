"""The sharded checkpoint format: a folder at the ``*.ckpt`` path, laid out as Lightning 2.6's FSDP strategy lays it
out, written and read here alone.

``lightning/pytorch/strategies/fsdp.py`` (``save_checkpoint``, ``load_checkpoint``) and
``lightning/fabric/strategies/fsdp.py`` (``_distributed_checkpoint_save``, ``_is_sharded_checkpoint``): DCP
(``torch.distributed.checkpoint``) files hold ``{"model": ..., "optimizer_0": ..., ...}`` (``.metadata`` and one
``__<rank>_0.distcp`` per saving rank), and ``meta.pt`` everything else, written by global rank 0.

- Writing (``save``; ``AsyncSaves`` while training goes on, ADR 0026): each rank writes only its own shards into a
  temporary folder rank 0 created and locked; rank 0 adds ``meta.pt`` and swaps the folder into place once every
  rank finished (ADR 0024), so a save that did not finish is never taken for a checkpoint.
- Reading on ranks (``load_metadata``, ``load_model``, ``load_optimizer``): DCP reads into whatever the loading
  module holds, each rank's shards under FSDP or whole tensors in one process or under DDP, so a folder resumes on
  any number of ranks.
- Reading into one process without a process group (``load_whole``): what ``gpulayer consolidate`` writes as one file.

Nothing here needs FSDP: gpulayer-fsdp decides when to save sharded. Imported only when a folder is written or read:
DCP's import would add about 0.6 s to every ``import gpulayer.trainer``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.checkpoint_io import METADATA_FILENAME, is_sharded_checkpoint

DCP_METADATA = ".metadata"  # the folder's index of its shards, written by DCP once every rank wrote
MODEL_KEY = "model"  # the shards' keys, Lightning's: the model's, then one per optimizer (optimizer_key)
_OPTIMIZER_KEY = re.compile(r"optimizer_(\d+)")


def optimizer_key(index: int) -> str:
    """The shards' key of the ``index``-th optimizer's state."""
    return f"optimizer_{index}"


def _optimizer_indices(keys: Any) -> list[int]:
    """The optimizers' indices among a folder's keys, top-level or dotted as DCP's index has them, in order."""
    return sorted({int(match.group(1)) for key in keys if (match := _OPTIMIZER_KEY.fullmatch(key.split(".", 1)[0]))})


SHARDED = StateDictOptions(full_state_dict=False)  # each rank's own part: its shards, or the whole plain tensor
_RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp")  # one rank's shards


@dataclass(frozen=True)
class ShardedOptimizerState:
    """Where an optimizer's state lies in a folder: what ``load_metadata`` gives in ``optimizer_states``."""

    folder: str
    key: str


def model_state(module: nn.Module) -> dict[str, Any]:
    """The module's ``state_dict`` as this rank holds it (DTensor shards under FSDP)."""
    return get_model_state_dict(module, options=SHARDED)


def optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, each tensor as this rank holds it."""
    return get_optimizer_state_dict(module, optimizer, options=SHARDED)


def load_metadata(path: str, weights_only: bool, world_size: int) -> dict[str, Any]:
    """``meta.pt``, with ``optimizer_states`` pointing into the folder, after checking that the folder is whole;
    warns when it was saved on another number of ranks (of the RNG streams)."""
    missing = [name for name in (DCP_METADATA, METADATA_FILENAME) if not os.path.isfile(os.path.join(path, name))]
    if missing:
        raise FileNotFoundError(
            f"refused to load {path}: a sharded checkpoint folder holds {DCP_METADATA} (written by DCP) and "
            f"{METADATA_FILENAME} (written by rank 0), and this one has no {' and no '.join(missing)}"
        )
    checkpoint = checkpoint_io.load(os.path.join(path, METADATA_FILENAME), weights_only=weights_only)
    keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    optimizers = _optimizer_indices(keys)
    if optimizers:
        checkpoint["optimizer_states"] = [ShardedOptimizerState(path, optimizer_key(i)) for i in optimizers]
    saved = {int(m.group(1)) for name in os.listdir(path) if (m := _RANK_FILE.fullmatch(name))}
    if len(saved) != world_size:
        warnings.warn(
            f"{path} was saved on {len(saved)} ranks and is loaded on {world_size}: the model and optimizer state "
            "are resharded exactly, but each rank's RNG streams do not carry across world sizes (every rank takes "
            "the saved rank 0's RNG state); a resumed epoch's data goes on from its position in the epoch's global "
            "order of samples",
            UserWarning,
            stacklevel=2,
        )
    return checkpoint


def load_model(module: nn.Module, path: str, strict: bool) -> None:
    """Read this rank's shards of the folder's ``model`` into ``module`` (already sharded)."""
    state = {MODEL_KEY: model_state(module)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(module, state[MODEL_KEY], options=StateDictOptions(full_state_dict=False, strict=strict))


def load_optimizer(module: nn.Module, optimizer: torch.optim.Optimizer, where: ShardedOptimizerState) -> None:
    """Read this rank's shards of the optimizer state at ``where`` into ``optimizer``."""
    state = {where.key: optimizer_state(module, optimizer)}
    dcp.load(state, checkpoint_id=where.folder)
    set_optimizer_state_dict(module, optimizer, state[where.key], options=SHARDED)


def save(checkpoint: dict[str, Any], path: str | os.PathLike, runtime: Any) -> None:
    """Every rank writes its shards of ``checkpoint`` (as ``dump_checkpoint`` built it from ``model_state`` and
    ``optimizer_state``) into a temporary folder that rank 0 created and locked; rank 0 adds ``meta.pt`` and puts
    the folder at ``path`` once DCP has collected every rank's result."""
    path, shards = split(checkpoint, path, runtime)
    if runtime.is_global_zero:
        with checkpoint_io.locked_temporary_folder(os.path.dirname(path)) as temporary:
            runtime.broadcast(temporary)
            dcp.save(shards, checkpoint_id=temporary)  # returns on rank 0 after every rank's files are written
            publish(temporary, path, serialized(checkpoint))
    else:
        dcp.save(shards, checkpoint_id=runtime.broadcast(None))
    runtime.barrier()  # the folder is in place before any rank goes on (to read it, or to remove an older one)


def split(checkpoint: dict[str, Any], path: str | os.PathLike, runtime: Any) -> tuple[str, dict[str, Any]]:
    """Rank 0's absolute ``path``, checked, and the shards taken out of ``checkpoint`` under Lightning's keys
    (what is left is ``meta.pt``'s)."""
    path = os.path.abspath(os.fspath(runtime.broadcast(os.fspath(path))))
    if os.path.isdir(path) and not is_sharded_checkpoint(path):
        raise IsADirectoryError(
            f"save_checkpoint({path!r}): a folder that is not a sharded checkpoint (no {METADATA_FILENAME}) is "
            "there, and a save replaces only a checkpoint; choose another path"
        )
    shards = {MODEL_KEY: checkpoint.pop("state_dict")}
    shards.update({optimizer_key(i): state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
    return path, shards


def serialized(checkpoint: dict[str, Any]) -> bytes:
    """``meta.pt``'s bytes."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def publish(temporary: str, path: str, meta: bytes) -> None:
    """Rank 0, once every rank's shards are in ``temporary``: add ``meta.pt`` and put the folder at ``path``."""
    with open(os.path.join(temporary, METADATA_FILENAME), "wb") as file:
        file.write(meta)
    checkpoint_io.publish_folder(temporary, path)  # fsyncs every file first


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
        path, shards = split(checkpoint, path, self._runtime)
        meta = serialized(checkpoint) if self._runtime.is_global_zero else b""
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
                    publish(temporary, path, meta)
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


def load_whole(folder: Path) -> dict[str, Any]:
    """The checkpoint in ``folder`` as one dict in the Trainer's format, its tensors on the CPU."""
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    meta = checkpoint_io.load(
        folder / METADATA_FILENAME
    )  # checked first: weights_only, so a file holding code is refused
    sharded: dict[str, Any] = {}
    # dcp_to_torch_save's own reading, without its torch.save: no process group, every shard into this process.
    _load_state_dict(
        sharded, storage_reader=dcp.FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(), no_dist=True
    )
    if MODEL_KEY not in sharded:
        raise ValueError(
            f"{folder} holds no {MODEL_KEY!r} among its sharded keys ({', '.join(map(repr, sharded)) or 'none'}): it is "
            "not a checkpoint of Lightning's FSDP layout"
        )
    optimizers = _optimizer_indices(sharded)
    checkpoint = {**meta, "state_dict": sharded.pop(MODEL_KEY)}
    if optimizers:
        checkpoint["optimizer_states"] = [by_index(sharded.pop(optimizer_key(i))) for i in optimizers]
    return {**checkpoint, **sharded}  # keys of a layout other than Lightning's are kept as they are


def by_index(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (FSDP's and DCP's sharded form) keyed by parameter index instead,
    as ``Optimizer.state_dict()`` is: the position of the name in ``param_groups``, group after group."""
    groups = optimizer_state["param_groups"]
    names = [name for group in groups for name in group["params"]]
    if all(isinstance(name, int) for name in names):
        return optimizer_state
    index = {name: position for position, name in enumerate(names)}
    state = optimizer_state["state"]
    return {
        "state": {index[name]: state[name] for name in names if name in state},
        "param_groups": [{**group, "params": [index[name] for name in group["params"]]} for group in groups],
    }
