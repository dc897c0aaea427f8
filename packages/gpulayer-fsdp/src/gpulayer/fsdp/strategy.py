"""``FSDPStrategy``: which submodules FSDP2 shards, and whether they free their gathered parameters after forward."""

from __future__ import annotations

import functools
import inspect
import os
import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from gpulayer.fsdp.sharding import FullyShardedModule, shard
from gpulayer.trainer.checkpoint import sharded as sharded_format
from gpulayer.trainer.checkpoint.sharded import AsyncSaves
from gpulayer.trainer.strategies.strategy import DEFAULT_TIMEOUT, Strategy, as_timeout, check_async_save

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
    ``timeout`` bounds every collective, as in ``DDPStrategy``. ``state_dict_type`` is Lightning's: ``"full"``
    saves one file gathered on rank 0, ``"sharded"`` a folder of each rank's shards; either kind loads whatever the
    setting. ``async_save=True`` (sharded only; not in Lightning) makes the saves during ``fit`` return once each
    rank's shards are copied, and writes them while training goes on. The folder's format, its writers and readers
    are gpulayer-trainer's ``checkpoint/sharded.py``: this strategy decides only when to save sharded.
    """

    strategy_name = "fsdp"
    is_distributed = True
    evaluates_in_inference_mode = False  # each step gathers parameters, which a later training step reuses
    gradient_sync = "FSDP's gradient reduce-scatter"

    def __init__(
        self,
        *,
        auto_wrap_policy: Policy | None = None,
        reshard_after_forward: bool | None = None,
        shard_model: ShardFunction | None = None,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        state_dict_type: str = "full",
        async_save: bool = False,
    ) -> None:
        if state_dict_type not in ("full", "sharded"):
            raise ValueError(
                f"FSDPStrategy(state_dict_type={state_dict_type!r}): accepted values are 'full' (one file, gathered "
                "on rank 0) and 'sharded' (a folder of each rank's shards)"
            )
        check_async_save(async_save, "FSDPStrategy")
        if async_save and state_dict_type != "sharded":
            raise ValueError(
                f"FSDPStrategy(async_save=True, state_dict_type={state_dict_type!r}): only sharded checkpoints are "
                "saved asynchronously; pass state_dict_type='sharded' as well"
            )
        if auto_wrap_policy is not None and shard_model is not None:
            raise ValueError("FSDPStrategy(auto_wrap_policy=..., shard_model=...): pass one of them, not both")
        if shard_model is not None and not callable(shard_model):
            raise TypeError(f"FSDPStrategy(shard_model={shard_model!r}): accepted values are None or a function")
        if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
            raise TypeError(
                f"FSDPStrategy(reshard_after_forward={reshard_after_forward!r}): accepted values are True, False or "
                "None (torch's default: True except for the root)"
            )
        super().__init__()
        self.auto_wrap_policy = _policy(auto_wrap_policy)
        self.reshard_after_forward = reshard_after_forward
        self.shard_model = shard_model
        self.timeout = as_timeout(timeout, "FSDPStrategy")
        self.state_dict_type = state_dict_type
        self.async_save = async_save
        self._async_saves: AsyncSaves | None = None  # while fit runs, with async_save
        self._folder_to_load: tuple[str, bool] | None = None  # a sharded checkpoint's model, read once sharded
        self._sharded: weakref.WeakKeyDictionary[nn.Module, FullyShardedModule] = weakref.WeakKeyDictionary()

    def check_world_size(self, world_size: int) -> None:
        if world_size < 2:
            raise ValueError(
                f"strategy='fsdp' shards the model across processes, but devices * num_nodes = {world_size}; "
                "ask for 2 or more devices, or use strategy='auto' for one process"
            )

    def attach(self, runtime: Any, device: torch.device, precision: Any, sync_batchnorm: bool = False) -> None:
        if sync_batchnorm:
            raise ValueError(
                "sync_batchnorm=True with strategy='fsdp': GPUlayer's FSDP does not convert batch norms; call "
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before fit, or use strategy='ddp'"
            )
        super().attach(runtime, device, precision)

    @property
    def _sharded_module(self) -> FullyShardedModule | None:
        """The stage's module as an earlier ``setup_module`` sharded it (it stays sharded across stages), or None."""
        return self._sharded.get(self.lightning_module)

    def setup_module(self) -> None:
        """Shard the module in place (on its device, in the Trainer's precision), every rank from rank 0's weights;
        a module sharded by an earlier stage stays as it is."""
        if self._sharded_module is None:
            super().setup_module()
            module = self.lightning_module
            self._sharded[module] = shard(module, self, self.root_device, self.precision_plugin.name)
        if self._folder_to_load is not None:
            folder, strict = self._folder_to_load
            self._folder_to_load = None
            sharded_format.load_model(self.lightning_module, folder, strict)

    def training_step_runner(self, step: Callable[..., Any]) -> Callable[..., Any]:
        return functools.partial(self._sharded_module.root, step)

    def evaluation_step_runner(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """Through the sharded root, which gathers the parameters that no sharded submodule owns."""
        return functools.partial(self._sharded_module.root, step)

    def no_sync(self) -> AbstractContextManager[None]:
        return self._sharded_module.no_sync()

    def setup_training(self) -> None:
        """``async_save``: the saves of this ``fit`` return once staged."""
        if self.async_save:
            self._async_saves = AsyncSaves(self.runtime, self.timeout)

    def start_background_writes(self) -> None:
        """Nothing: ``async_save`` here is the sharded saves' own (``setup_training``)."""

    def teardown(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """A sharded module stays sharded where it is, for the next stage. ``fit`` returns (or raises) only once its
        last asynchronous save is in place; later saves are synchronous."""
        saves, self._async_saves = self._async_saves, None
        if saves is not None:
            saves.close()

    def lightning_module_state_dict(self) -> dict[str, Any]:
        sharded = self._sharded_module
        if sharded is None:
            return super().lightning_module_state_dict()
        return sharded_format.model_state(sharded.module) if self.saves_on_every_rank else sharded.state_dict()

    def load_model_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        sharded = self._sharded_module  # before a first stage shards the module, its full weights load as they are
        if sharded is None:
            super().load_model_state_dict(state_dict, strict)
        else:
            sharded.load_state_dict(state_dict, strict)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        sharded = self._sharded_module
        if sharded is None:
            return super().optimizer_state(optimizer)
        if self.saves_on_every_rank:
            return sharded_format.optimizer_state(sharded.module, optimizer)
        return sharded.optimizer_state_dict(optimizer)

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: Any) -> None:
        sharded = self._sharded_module
        if sharded is None or isinstance(state, sharded_format.ShardedOptimizerState):
            super().load_optimizer_state_dict(optimizer, state)
        else:
            sharded.load_optimizer_state_dict(optimizer, state)

    @property
    def saves_on_every_rank(self) -> bool:
        """``"sharded"`` with a sharded module: every rank writes its shards (an unsharded one saves in full)."""
        return self.state_dict_type == "sharded" and self._sharded_module is not None

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | os.PathLike) -> None:
        """``"sharded"``: every rank writes its shards into the folder ``filepath``; else rank 0 writes one file."""
        if self.saves_on_every_rank and self._async_saves is not None:
            self._async_saves.save(checkpoint, filepath)
        elif self.saves_on_every_rank:
            sharded_format.save(checkpoint, filepath, self.runtime)
        else:
            super().save_checkpoint(checkpoint, filepath)

    def when_checkpoints_written(self, action: Callable[[], None]) -> None:
        if self._async_saves is None:
            action()
        else:
            self._async_saves.when_written(action)

    def checkpoint_exists(self, filepath: str | os.PathLike) -> bool:
        in_flight = self._async_saves is not None and self._async_saves.is_being_written(filepath)
        return in_flight or super().checkpoint_exists(filepath)

    def load_folder_weights(self, path: str, strict: bool) -> None:
        """Each rank's shards are read once the module is sharded (``setup_module``), not into the whole module."""
        self._folder_to_load = (path, strict)

    def __repr__(self) -> str:
        options = {
            "auto_wrap_policy": self.auto_wrap_policy,
            "reshard_after_forward": self.reshard_after_forward,
            "shard_model": self.shard_model,
            "state_dict_type": None if self.state_dict_type == "full" else self.state_dict_type,
            "async_save": self.async_save or None,
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
