"""Sharded checkpoints: a folder at the ``*.ckpt`` path, laid out as Lightning 2.6's FSDP strategy lays it out.

``lightning/pytorch/strategies/fsdp.py`` (``save_checkpoint``, ``load_checkpoint``) and
``lightning/fabric/strategies/fsdp.py`` (``_distributed_checkpoint_save``, ``_is_sharded_checkpoint``): DCP
(``torch.distributed.checkpoint``) writes ``{"model": ..., "optimizer_0": ..., ...}``, one ``__<rank>_0.distcp``
file per rank and ``.metadata``; global rank 0 writes everything else to ``meta.pt``. Each rank writes and reads
only its own shards: no rank holds the full model or optimizer state. DCP reshards on load, so a folder resumes on
any number of ranks. The folder is written under a temporary name and swapped into place once every rank finished
(ADR 0024), so a save that did not finish is never taken for a checkpoint. ``async_save.py`` writes the same folder
while training goes on.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.checkpoint_io import METADATA_FILENAME, is_sharded_checkpoint


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
    shards = {"model": checkpoint.pop("state_dict")}
    shards.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
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
