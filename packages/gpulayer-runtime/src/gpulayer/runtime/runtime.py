"""The handle a process trains with: its placement, its process group, and the collectives over it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from gpulayer.runtime import clean_exit, collectives, started
from gpulayer.runtime.placement import Placement


class Runtime:
    """Joins this process to its job's process group, or to none at world size 1.

    At world size 1 every collective returns at once, without a process group. A process group that
    already exists (the user made it) is used as is and left alone by ``close()``. As a context manager it
    closes the group on a clean exit only.
    """

    def __init__(
        self,
        placement: Placement | None = None,
        *,
        accelerator: str = "auto",
        timeout: timedelta | float | None = None,
        store: dist.Store | None = None,
    ) -> None:
        self.placement = placement if placement is not None else Placement.detect(accelerator=accelerator)
        self.timeout = _as_timedelta(timeout)
        self._owns_group = False
        if self.placement.accelerator == "cuda":
            _select_cuda_device(self.placement.device)
        if self.placement.is_distributed:
            self._join(store)

    world_size = property(lambda self: self.placement.world_size)
    global_rank = property(lambda self: self.placement.global_rank)
    local_rank = property(lambda self: self.placement.local_rank)
    local_world_size = property(lambda self: self.placement.local_world_size)
    node_rank = property(lambda self: self.placement.node_rank)
    num_nodes = property(lambda self: self.placement.num_nodes)
    device = property(lambda self: self.placement.device)
    backend = property(lambda self: self.placement.backend)

    @property
    def is_global_zero(self) -> bool:
        return self.placement.global_rank == 0

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` in place across ranks (``op``: sum, mean, max, min) and return it."""
        if not self.placement.is_distributed:
            collectives.check_reduce_op(op)
            return tensor
        return collectives.all_reduce(tensor, op)

    def all_gather(self, value: Any) -> list[Any]:
        """One ``value`` per rank, in rank order: tensors of one shape, or picklable objects."""
        return collectives.all_gather(value) if self.placement.is_distributed else [value]

    def broadcast(self, value: Any, src: int = 0) -> Any:
        """``src``'s ``value`` on every rank: a tensor (filled in place) or a picklable object."""
        if not 0 <= src < self.world_size:
            raise ValueError(f"src={src}: must be a rank in [0, {self.world_size})")
        return collectives.broadcast(value, src) if self.placement.is_distributed else value

    def barrier(self) -> None:
        if self.placement.is_distributed:
            collectives.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one: for decisions that end or skip work."""
        if not self.placement.is_distributed:
            return bool(flag)
        return collectives.reduce_flag(flag, self.device, "max", "any")

    def all(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on all of them."""
        if not self.placement.is_distributed:
            return bool(flag)
        return collectives.reduce_flag(flag, self.device, "min", "all")

    def close(self) -> None:
        """Destroy the process group this runtime created; safe to call twice."""
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        # On an error the group is left to the process's exit: the failing rank then reports its error before
        # its peers see it vanish, and a broken NCCL group cannot hang in its teardown.
        if exc_type is None:
            self.close()

    def __repr__(self) -> str:
        return f"Runtime({self.placement!r})"

    def _join(self, store: dist.Store | None) -> None:
        placement = self.placement
        if dist.is_initialized():
            if (dist.get_world_size(), dist.get_rank()) != (placement.world_size, placement.global_rank):
                raise RuntimeError(
                    f"a process group already exists as rank {dist.get_rank()} of {dist.get_world_size()}, "
                    f"but the placement says rank {placement.global_rank} of {placement.world_size}"
                )
            if dist.get_backend() == "gloo":
                clean_exit.collect_at_clean_exit()
            return
        if store is None and (placement.master_addr is None or placement.master_port is None):
            raise ValueError(f"{placement!r} names no master_addr and master_port; pass store= to join without them")
        worker = started.this_worker()
        if store is None and worker is not None and placement.run_id == worker.prefix:
            store = worker.store(self.timeout)
        if store is None and placement.restart_count and placement.agent_store and placement.num_nodes == 1:
            store = _store_of_this_attempt(placement, self.timeout)
        dist.init_process_group(
            backend=placement.backend,
            init_method=None if store is not None else _tcp_url(placement.master_addr, placement.master_port),
            store=store,
            world_size=placement.world_size,
            rank=placement.global_rank,
            timeout=self.timeout,
            device_id=placement.device if placement.accelerator == "cuda" else None,
        )
        self._owns_group = True
        if placement.backend == "gloo":  # NCCL groups are left to the process's exit (see __exit__)
            clean_exit.close_at_clean_exit(self.close)
            # Gloo's connection setup ends on each rank on its own: without this barrier a rank could leave
            # Runtime(), finish and close its sockets while a peer still connects, which then fails with
            # "connectFullMesh failed ... Connection closed by peer" (seen once in a loaded hunt).
            dist.barrier()


def _store_of_this_attempt(placement: Placement, timeout: timedelta | None) -> dist.Store:
    """The agent's store, under a prefix of this restart. Torch's static rendezvous hands every restart the same
    store, where the last attempt's process-group keys would send the new ranks to dead peers (torch issue 135712
    is the same flaw in the shared c10d store). One node has one agent, so every rank counts restarts alike."""
    client = dist.TCPStore(
        placement.master_addr,
        placement.master_port,
        placement.world_size,
        is_master=False,
        timeout=timeout or default_pg_timeout,
    )
    return dist.PrefixStore(f"gpulayer/attempt_{placement.restart_count}", client)


def _as_timedelta(timeout: timedelta | float | None) -> timedelta | None:
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"timeout={timeout!r}: expected a positive number of seconds or a timedelta")
    return timedelta(seconds=timeout)


def _select_cuda_device(device: torch.device) -> None:
    count = torch.cuda.device_count()
    if device.index >= count:
        raise RuntimeError(f"this process needs {device}, but this machine has {count} CUDA device(s)")
    torch.cuda.set_device(device)


def _tcp_url(host: str | None, port: int | None) -> str:
    # Both come from the placement, which requires them at world size > 1. IPv6 literals need brackets.
    return f"tcp://[{host}]:{port}" if host and ":" in host else f"tcp://{host}:{port}"
