"""Reading a sharded checkpoint folder, as Lightning 2.6's FSDP strategy lays it out, on any number of ranks.

``lightning/pytorch/strategies/fsdp.py`` (``load_checkpoint``) and ``lightning/fabric/strategies/fsdp.py``
(``_is_sharded_checkpoint``): DCP (``torch.distributed.checkpoint``) files hold ``{"model": ..., "optimizer_0":
..., ...}`` (``.metadata`` and one ``__<rank>_0.distcp`` per saving rank), and ``meta.pt`` everything else. DCP
reads into whatever the loading module holds: each rank's shards under FSDP (gpulayer-fsdp writes the folders),
whole tensors in one process or under DDP; so a folder resumes on any number of ranks.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.checkpoint_io import DCP_METADATA, METADATA_FILENAME

SHARDED = StateDictOptions(full_state_dict=False)  # each rank's own part: its shards, or the whole plain tensor
_RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp")


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
    warns when it was saved on another number of ranks."""
    missing = [name for name in (DCP_METADATA, METADATA_FILENAME) if not os.path.isfile(os.path.join(path, name))]
    if missing:
        raise FileNotFoundError(
            f"refused to load {path}: a sharded checkpoint folder holds {DCP_METADATA} (written by DCP) and "
            f"{METADATA_FILENAME} (written by rank 0), and this one has no {' and no '.join(missing)}"
        )
    checkpoint = checkpoint_io.load(os.path.join(path, METADATA_FILENAME), weights_only=weights_only)
    keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    optimizers = sorted({int(m.group(1)) for key in keys if (m := re.match(r"optimizer_(\d+)\.", key))})
    if optimizers:
        checkpoint["optimizer_states"] = [ShardedOptimizerState(path, f"optimizer_{i}") for i in optimizers]
    saved = {int(m.group(1)) for name in os.listdir(path) if (m := _RANK_FILE.fullmatch(name))}
    if len(saved) != world_size:
        warnings.warn(
            f"{path} was saved on {len(saved)} ranks and is loaded on {world_size}: the model and optimizer state "
            "are resharded exactly, but each rank's RNG streams and its data sampler's position within the epoch do "
            "not carry across world sizes (every rank takes the saved rank 0's RNG state, and a resumed epoch "
            "restarts its shards on the new ranks)",
            UserWarning,
            stacklevel=2,
        )
    return checkpoint


def load_model(module: nn.Module, path: str, strict: bool) -> None:
    """Read this rank's shards of the folder's ``model`` into ``module`` (already sharded)."""
    state = {"model": model_state(module)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(module, state["model"], options=StateDictOptions(full_state_dict=False, strict=strict))


def load_optimizer(module: nn.Module, optimizer: torch.optim.Optimizer, where: ShardedOptimizerState) -> None:
    """Read this rank's shards of the optimizer state at ``where`` into ``optimizer``."""
    state = {where.key: optimizer_state(module, optimizer)}
    dcp.load(state, checkpoint_id=where.folder)
    set_optimizer_state_dict(module, optimizer, state[where.key], options=SHARDED)
