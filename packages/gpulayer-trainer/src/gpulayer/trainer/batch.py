"""Walking a batch: mapping its tensors, moving it to a device and finding its size, as Lightning does."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

# Lightning's message where a batch's size cannot be inferred.
NO_BATCH_SIZE = (
    "We could not infer the batch_size from the batch. Either simplify its structure or provide the batch_size as "
    "`self.log(..., batch_size=batch_size)`."
)


def map_tensors(data: Any, fn: Callable[[Any], Any], movable: bool = False) -> Any:
    """``data`` with ``fn`` applied to every tensor in it (through lists, tuples, named tuples, dicts, dataclasses);
    ``movable``: to every other object with a ``to`` method too, taken whole (Lightning's ``_TransferableDataType``)."""
    if isinstance(data, torch.Tensor) or (movable and callable(getattr(data, "to", None))):
        return fn(data)
    if isinstance(data, Mapping):
        return type(data)({k: map_tensors(v, fn, movable) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_tensors(v, fn, movable) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_tensors(v, fn, movable) for v in data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {f.name: map_tensors(getattr(data, f.name), fn, movable) for f in dataclasses.fields(data) if f.init}
        return dataclasses.replace(data, **changes)
    return data


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Lightning 2.6's ``move_data_to_device`` (``lightning/fabric/utilities/apply_func.py``): each tensor, and each
    other object with a ``to`` method (a PyTorch Geometric ``Data``), moved by its own ``to``; a tensor bound for
    CUDA without blocking, and an object whose ``to`` returns None kept as it is."""
    non_blocking = device.type == "cuda"

    def move(data: Any) -> Any:
        if isinstance(data, torch.Tensor):
            return data.to(device, non_blocking=non_blocking)
        moved = data.to(device)
        return data if moved is None else moved

    return map_tensors(batch, move, movable=True)


def batch_size_of(batch: Any, warn: bool = True) -> int | None:
    """The batch size Lightning 2.6 infers (``extract_batch_size``, ``lightning/pytorch/utilities/data.py``): dim 0
    of the first tensor found walking the batch (a 0-dim tensor counts 1), None when it holds none; a shape read,
    never a device sync. As Lightning, ``warn`` says the batch is ambiguous at the first leaf that differs (another
    size, or a value that is not a tensor, after the first tensor)."""
    size = None
    try:
        for found in _sizes(batch):
            if size is None:
                size = found
            elif found != size:
                if warn:
                    warnings.warn(
                        "Trying to infer the `batch_size` from an ambiguous collection. The batch size we found is "
                        f"{size}. To avoid any miscalculations, use `self.log(..., batch_size=batch_size)`.",
                        UserWarning,
                        stacklevel=2,
                    )
                break
    except RecursionError:
        raise RecursionError(NO_BATCH_SIZE) from None
    return size


def _sizes(batch: Any) -> Iterator[int | None]:
    """Lightning's walk: a tensor's size, into mappings' values and any other iterable but a string, into a
    dataclass's fields; None for every other leaf."""
    if isinstance(batch, torch.Tensor):
        yield 1 if batch.ndim == 0 else batch.size(0)
    elif isinstance(batch, (Iterable, Mapping)) and not isinstance(batch, str):
        for value in batch.values() if isinstance(batch, Mapping) else batch:
            yield from _sizes(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from _sizes(getattr(batch, field.name))
    else:
        yield None
