"""The collectives a training loop needs, with failures that name the call and its call site.

Each function takes the default process group as given; ``Runtime`` decides when there is one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


class CollectiveError(RuntimeError):
    """A collective failed or timed out on this rank; ``call_site`` is where the caller entered it."""

    def __init__(self, collective: str, call_site: str, rank: int, cause: BaseException) -> None:
        self.collective = collective
        self.call_site = call_site
        self.rank = rank
        self.timed_out = "timed out" in str(cause).lower() or "timeout" in str(cause).lower()
        what = "timed out" if self.timed_out else "failed"
        hint = (
            ": another rank did not reach this collective (every rank must call the same collectives in the same order)"
            if self.timed_out
            else ""
        )
        super().__init__(f"{collective} {what} on rank {rank}, called at {call_site}{hint}. Cause: {cause}")


def timed_out_in_record(message: str) -> bool:
    """Whether ``message``, a rank's recorded error, is a ``CollectiveError`` whose collective timed out: that rank
    waited for a peer that never came. One that failed broke under a peer that left, as a rank that timed out does
    at once, so the rank that timed out is nearer the cause."""
    return message.startswith("CollectiveError: ") and " timed out on rank " in message.split(", called at ", 1)[0]


def is_transport_failure(error: BaseException) -> bool:
    """Whether ``error`` came from the process group itself (gloo, NCCL, the store), not from the user's code: torch
    raises some of these as its ``DistError``s and others, such as gloo's timeouts, as bare RuntimeErrors."""
    return isinstance(error, dist.DistError) or any(word in str(error) for word in ("gloo", "Gloo", "NCCL"))


def check_reduce_op(op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"op={op!r}: expected one of {', '.join(map(repr, REDUCE_OPS))}")


def all_reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
    check_reduce_op(op)
    if op == "mean" and not tensor.is_floating_point():
        raise ValueError(f"op='mean' needs a floating-point tensor, got dtype {tensor.dtype}")
    with _named("all_reduce"):
        dist.all_reduce(tensor, op=REDUCE_OPS[op])
    if op == "mean":
        tensor.div_(dist.get_world_size())
    return tensor


def all_gather(value: Any) -> list[Any]:
    with _named("all_gather"):
        if isinstance(value, torch.Tensor):
            gathered = [torch.empty_like(value) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, value.contiguous())
            return gathered
        objects: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(objects, value)
        return objects


def broadcast(value: Any, src: int) -> Any:
    with _named("broadcast"):
        if isinstance(value, torch.Tensor):
            dist.broadcast(value, src=src)
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=src)
        return holder[0]


def barrier() -> None:
    with _named("barrier"):
        dist.barrier()


def reduce_flag(flag: bool, device: torch.device, op: str, name: str) -> bool:
    """``any`` (op "max") or ``all`` (op "min") of one boolean per rank."""
    tensor = torch.tensor([int(bool(flag))], dtype=torch.int32, device=device)
    with _named(name):
        dist.all_reduce(tensor, op=REDUCE_OPS[op])
        return bool(tensor.item())


@contextmanager
def _named(collective: str) -> Iterator[None]:
    try:
        yield
    except RuntimeError as err:  # torch.distributed's errors (DistError and its subclasses) are RuntimeErrors
        raise CollectiveError(collective, _caller(), dist.get_rank(), err) from err


def _caller() -> str:
    """The innermost frame outside this package and contextlib: the code that called the collective."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_RUNTIME_DIR) and not path.endswith("contextlib.py"):
            return f"{path}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "<unknown>"
