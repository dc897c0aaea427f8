"""Walking a batch: mapping its tensors, and finding its size the way Lightning infers ``batch_size``."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch


def map_tensors(data: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``data`` with ``fn`` applied to every tensor in it (through lists, tuples, named tuples, dicts, dataclasses)."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return type(data)({k: map_tensors(v, fn) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_tensors(v, fn) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_tensors(v, fn) for v in data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {f.name: map_tensors(getattr(data, f.name), fn) for f in dataclasses.fields(data) if f.init}
        return dataclasses.replace(data, **changes)
    return data


def batch_size_of(batch: Any) -> int:
    """The size of dim 0 of the first tensor found (a 0-dim tensor counts 1); a shape read, never a device sync."""
    size = None
    for found in _sizes(batch):
        if size is None:
            size = found
        elif found != size:
            warnings.warn(
                f"the batch holds tensors of different first dimensions ({size} and {found}); using {size} as the "
                "batch size. Pass self.log(..., batch_size=...) to choose.",
                UserWarning,
                stacklevel=2,
            )
            break
    if size is None:
        raise ValueError("self.log could not infer the batch size from the batch; pass self.log(..., batch_size=...)")
    return size


def _sizes(batch: Any) -> Iterator[int | None]:
    if isinstance(batch, torch.Tensor):
        yield 1 if batch.ndim == 0 else batch.size(0)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from _sizes(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _sizes(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from _sizes(getattr(batch, field.name))
