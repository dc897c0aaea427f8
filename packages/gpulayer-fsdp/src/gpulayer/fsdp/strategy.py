"""``FSDPStrategy``: which submodules FSDP2 shards, and whether they free their gathered parameters after forward."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from torch import nn

from gpulayer.fsdp.sharding import FullyShardedModule, shard
from gpulayer.trainer.strategy import DEFAULT_TIMEOUT, ShardedModule, Strategy, as_timeout

Policy = Iterable[type[nn.Module]] | Callable[[nn.Module], bool]
ShardFunction = Callable[..., None]


class FSDPStrategy(Strategy):
    """Fully sharded data parallel on FSDP2 (``torch.distributed.fsdp.fully_shard``): experimental.

    ``auto_wrap_policy`` chooses the submodules sharded as units of their own: a set of module classes (every
    instance, as in Lightning), or a function ``module -> bool``. The default is the model's repeated blocks: the
    outermost modules held in an ``nn.ModuleList`` or ``nn.Sequential``, or, in a model without such containers, each
    direct child with parameters. The units are sharded bottom-up, then the root, which owns the rest.
    ``shard_model(module, mesh)`` replaces the policy: it calls ``fully_shard`` itself (the root is still added).
    ``reshard_after_forward`` is FSDP2's: True frees a unit's gathered parameters after its forward and gathers them
    again in backward, False keeps them until backward, None (torch's default) is True except for the root.
    ``timeout`` bounds every collective, as in ``DDPStrategy``.
    """

    strategy_name = "fsdp"

    def __init__(
        self,
        *,
        auto_wrap_policy: Policy | None = None,
        reshard_after_forward: bool | None = None,
        shard_model: ShardFunction | None = None,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
    ) -> None:
        if auto_wrap_policy is not None and shard_model is not None:
            raise ValueError("FSDPStrategy(auto_wrap_policy=..., shard_model=...): pass one of them, not both")
        if shard_model is not None and not callable(shard_model):
            raise TypeError(f"FSDPStrategy(shard_model={shard_model!r}): accepted values are None or a function")
        if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
            raise TypeError(
                f"FSDPStrategy(reshard_after_forward={reshard_after_forward!r}): accepted values are True, False or "
                "None (torch's default: True except for the root)"
            )
        self.auto_wrap_policy = _policy(auto_wrap_policy)
        self.reshard_after_forward = reshard_after_forward
        self.shard_model = shard_model
        self.timeout = as_timeout(timeout, "FSDPStrategy")
        self._sharded: weakref.WeakKeyDictionary[nn.Module, FullyShardedModule] = weakref.WeakKeyDictionary()

    def check_world_size(self, world_size: int) -> None:
        if world_size < 2:
            raise ValueError(
                f"strategy='fsdp' shards the model across processes, but devices * num_nodes = {world_size}; "
                "ask for 2 or more devices, or use strategy='auto' for one process"
            )

    def sharded(self, module: nn.Module) -> ShardedModule | None:
        return self._sharded.get(module)

    def connect(self, module: nn.Module, trainer: Any) -> ShardedModule:
        sharded = shard(module, self, trainer._device, trainer._precision.name)
        self._sharded[module] = sharded
        return sharded

    def __repr__(self) -> str:
        options = {
            "auto_wrap_policy": self.auto_wrap_policy,
            "reshard_after_forward": self.reshard_after_forward,
            "shard_model": self.shard_model,
        }
        shown = {name: value for name, value in options.items() if value is not None}
        return f"FSDPStrategy({', '.join(f'{name}={value!r}' for name, value in shown.items())})"


def _policy(value: Policy | None) -> frozenset[type[nn.Module]] | Callable[[nn.Module], bool] | None:
    if value is None:
        return None
    if callable(value) and not isinstance(value, type):
        required = [
            p
            for p in inspect.signature(value).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(required) != 1:
            raise TypeError(
                f"FSDPStrategy(auto_wrap_policy={value!r}): a function takes one module and returns whether to shard "
                "it as a unit (FSDP1's (module, recurse, nonwrapped_numel) policies do not apply to FSDP2)"
            )
        return value
    classes = frozenset([value] if isinstance(value, type) else value)
    if not classes or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in classes):
        raise TypeError(
            f"FSDPStrategy(auto_wrap_policy={value!r}): accepted values are None, a set of nn.Module classes, or a "
            "function module -> bool"
        )
    return classes
