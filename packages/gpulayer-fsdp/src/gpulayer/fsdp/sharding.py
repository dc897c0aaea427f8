"""Apply FSDP2 to a module: rank 0's weights everywhere, each unit sharded, then the root that runs the steps."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from gpulayer.fsdp import full_state
from gpulayer.trainer.strategies.ddp import StepRunner

if TYPE_CHECKING:
    from gpulayer.fsdp.strategy import FSDPStrategy

# bf16-mixed and 16-mixed: parameters gathered in the low precision for compute, gradients reduced in fp32.
_MIXED = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def shard(module: nn.Module, strategy: FSDPStrategy, device: torch.device, precision: str) -> FullyShardedModule:
    """Shard ``module`` in place and return the root every step runs through."""
    if any(isinstance(m, FSDPModule) for m in module.modules()):
        raise RuntimeError(
            f"{type(module).__name__} is already sharded by fully_shard outside this Trainer's strategy; pass the "
            "unsharded model (use FSDPStrategy(shard_model=...) to shard it yourself)"
        )
    _broadcast_from_rank_zero(module)  # FSDP2 keeps each rank's own values; DDP starts every rank from rank 0's
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    options: dict[str, Any] = {"mesh": mesh}
    if precision in _MIXED:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=_MIXED[precision], reduce_dtype=torch.float32)
    if strategy.shard_model is not None:
        strategy.shard_model(module, mesh)
    else:
        # Deepest first: fully_shard takes the parameters that no unit inside the module has taken.
        for unit in reversed(units(module, strategy.auto_wrap_policy)):
            fully_shard(unit, reshard_after_forward=strategy.reshard_after_forward, **options)
    root = StepRunner(module)
    fully_shard(root, **options)  # the root is never resharded after forward: backward needs it at once
    return FullyShardedModule(module, root, mesh)


def units(module: nn.Module, policy: Any) -> list[nn.Module]:
    """The submodules sharded as units of their own, in pre-order (parents before their children)."""
    if policy is None:
        return _repeated_blocks(module)
    chosen = policy if callable(policy) else (lambda m: isinstance(m, tuple(policy)))
    return [m for m in module.modules() if chosen(m)]


def _repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The outermost modules with parameters held in an ``nn.ModuleList`` or ``nn.Sequential``; without any, each
    direct child with parameters."""
    blocks: list[nn.Module] = []

    def visit(parent: nn.Module) -> None:
        for child in parent.children():
            if isinstance(parent, (nn.ModuleList, nn.Sequential)) and _has_parameters(child):
                blocks.append(child)
            else:
                visit(child)

    visit(module)
    return blocks or [child for child in module.children() if _has_parameters(child)]


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _broadcast_from_rank_zero(module: nn.Module) -> None:
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


class FullyShardedModule:
    """The sharded module and its root: steps run inside the root's forward, so its hooks gather the parameters no
    unit owns, and its backward hooks reduce-scatter every gradient (FSDP2 averages across ranks). Every rank
    calls each method: each may be a collective."""

    def __init__(self, module: nn.Module, root: nn.Module, mesh: DeviceMesh) -> None:
        self.module, self.root, self.mesh = module, root, mesh

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate unsharded on each rank; the next stepping micro-batch reduce-scatters the sum."""
        assert isinstance(self.root, FSDPModule)
        self.root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.root.set_requires_gradient_sync(True)

    def state_dict(self) -> dict[str, Any]:
        """The module's full ``state_dict`` on global rank 0 (on the CPU); ``{}`` on the other ranks."""
        return full_state.gather(self.module.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool) -> None:
        self.module.load_state_dict(full_state.distribute_like(state_dict, self.module.state_dict()), strict=strict)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return full_state.gather_optimizer(optimizer)

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(full_state.distribute_optimizer(state, optimizer))
