"""Full state from shards and back: the checkpoint format of one process, whatever the world size.

Saving gathers one tensor at a time (every rank takes part) and only global rank 0 keeps a CPU copy, so no rank
holds the full model on its device. Loading scatters rank 0's values into each rank's shard.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor


def gather(state: dict[str, Any]) -> dict[str, Any]:
    """``state``'s sharded tensors made whole: on global rank 0 as CPU tensors, elsewhere ``{}``."""
    keep = dist.get_rank() == 0
    full: dict[str, Any] = {}
    for name, value in state.items():
        value = _whole(value)
        if keep:
            full[name] = value.cpu() if isinstance(value, torch.Tensor) else value
    return full


def distribute_like(full: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """``full``'s values shaped like ``current``'s: sharded where those are (rank 0's values), as they are elsewhere."""
    return {name: _like(value, current.get(name)) for name, value in full.items()}


def gather_optimizer(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` as one process holding every parameter would return it, on global rank 0."""
    state_dict = optimizer.state_dict()
    states = {index: gather(state) for index, state in state_dict["state"].items()}
    return {"state": states, "param_groups": state_dict["param_groups"]} if dist.get_rank() == 0 else {}


def distribute_optimizer(full: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A one-process optimizer ``state_dict`` with each parameter's state sharded like that parameter."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    if len(parameters) != sum(len(group["params"]) for group in full["param_groups"]):
        raise ValueError(
            f"the checkpoint's optimizer state covers {sum(len(g['params']) for g in full['param_groups'])} "
            f"parameters, but the optimizer has {len(parameters)}"
        )
    states = {
        index: {key: _like(value, parameters[index]) for key, value in state.items()}
        for index, state in full["state"].items()
    }
    return {"state": states, "param_groups": full["param_groups"]}


def _whole(value: Any) -> Any:
    return value.full_tensor() if isinstance(value, DTensor) else value


def _like(value: Any, reference: Any) -> Any:
    """``value`` sharded as ``reference`` is, when that is a sharded tensor of its shape (a step count is not)."""
    if not (isinstance(reference, DTensor) and isinstance(value, torch.Tensor) and value.shape == reference.shape):
        return value
    return distribute_tensor(value.to(reference.device), reference.device_mesh, reference.placements)
