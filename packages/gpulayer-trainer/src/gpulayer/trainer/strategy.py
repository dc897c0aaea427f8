"""``strategy=``: ``"auto"``, ``"single_device"``, ``"ddp"``, a ``DDPStrategy`` with DDP's options, or a strategy
another distribution registers under the ``gpulayer.strategies`` entry point (``"fsdp"``: gpulayer-fsdp)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import timedelta
from importlib.metadata import entry_points
from typing import Any

import torch

STRATEGY_NAMES = (
    "auto",
    "single_device",
    "ddp",
    "ddp_find_unused_parameters_true",
    "ddp_find_unused_parameters_false",
)
ENTRY_POINT_GROUP = "gpulayer.strategies"
# Where the strategies GPUlayer itself publishes come from, for the error when one is not installed.
_PUBLISHED = {"fsdp": "gpulayer-fsdp"}
# Lightning's other ways of starting DDP processes; GPUlayer starts them with torch's elastic agent instead.
_LAUNCHER_VARIANTS = ("ddp_spawn", "ddp_fork", "ddp_notebook")


DEFAULT_TIMEOUT = timedelta(minutes=30)  # Lightning's default_pg_timeout


class DDPStrategy:
    """DistributedDataParallel with the options users tune; the rest of ``ddp_kwargs`` goes to DDP as is.

    ``timeout`` (a ``timedelta`` or seconds) bounds every collective: a rank that stops answering ends the job
    after it. The default is Lightning's, 30 minutes; ``None`` keeps torch's (30 minutes on gloo, 10 on NCCL). It
    applies to the process group the Trainer creates, not to one that already exists.
    """

    strategy_name = "ddp"

    def __init__(
        self,
        *,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        **ddp_kwargs: Any,
    ) -> None:
        for name, value in (
            ("find_unused_parameters", find_unused_parameters),
            ("static_graph", static_graph),
            ("gradient_as_bucket_view", gradient_as_bucket_view),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"DDPStrategy({name}={value!r}): accepted values are True or False")
        timeout = as_timeout(timeout, "DDPStrategy")
        reserved = {"module", "device_ids", "output_device", "process_group"} & ddp_kwargs.keys()
        if reserved:
            raise ValueError(f"DDPStrategy({', '.join(sorted(reserved))}=...): the Trainer sets these itself")
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.timeout: timedelta | None = timeout
        self.ddp_kwargs = ddp_kwargs

    def ddp_options(self) -> dict[str, Any]:
        return {
            "find_unused_parameters": self.find_unused_parameters,
            "static_graph": self.static_graph,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            **self.ddp_kwargs,
        }

    def __repr__(self) -> str:
        options = {k: v for k, v in self.ddp_options().items() if v} | (
            {"timeout": self.timeout} if self.timeout else {}
        )
        return f"DDPStrategy({', '.join(f'{k}={v!r}' for k, v in options.items())})"


def as_timeout(value: timedelta | float | None, owner: str) -> timedelta | None:
    """A strategy's ``timeout``: None, a ``timedelta``, or a positive number of seconds."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(
            f"{owner}(timeout={value!r}): accepted values are None, a positive number of seconds or a datetime.timedelta"
        )
    return timedelta(seconds=value)


class Strategy:
    """What a strategy from another distribution implements: it shards the module in place and says how a step
    runs, how gradients stay local, and how the full state is read and written (see gpulayer-fsdp)."""

    strategy_name = ""
    timeout: timedelta | None = DEFAULT_TIMEOUT

    def check_world_size(self, world_size: int) -> None:
        """Refuse, at construction, a number of processes this strategy cannot train on."""

    def sharded(self, module: torch.nn.Module) -> ShardedModule | None:
        """``module`` as an earlier ``connect`` sharded it, or None."""
        raise NotImplementedError

    def connect(self, module: torch.nn.Module, trainer: Any) -> ShardedModule:
        """Shard ``module`` (on its device, in the Trainer's precision) in place, every rank from rank 0's weights."""
        raise NotImplementedError


class ShardedModule:
    """A module a ``Strategy`` has sharded: every rank calls each method, since each may be a collective."""

    def run(self, step: Any, *args: Any) -> Any:
        """``step(*args)`` where the strategy's hooks see it (training and evaluation steps)."""
        raise NotImplementedError

    def no_sync(self) -> AbstractContextManager[None]:
        """A micro-batch that does not step: gradients are kept, not reduced."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The module's full ``state_dict`` on global rank 0 (on the CPU); other ranks may get ``{}``."""
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool) -> None:
        """Load a full ``state_dict`` (rank 0's is the one used)."""
        raise NotImplementedError

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``optimizer.state_dict()`` as one process would have it, on global rank 0."""
        raise NotImplementedError

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        raise NotImplementedError


def check_strategy(value: Any) -> None:
    """Refuse a strategy that no world size makes valid."""
    if not isinstance(value, (DDPStrategy, Strategy)):
        _name(value)


def _name(value: Any) -> str:
    name = value.lower() if isinstance(value, str) else value
    if name in _LAUNCHER_VARIANTS:
        raise ValueError(
            f"strategy={value!r}: GPUlayer starts DDP processes with torch's elastic agent; use strategy='ddp' "
            "(python train.py starts them for you, or run under gpulayer launch, torchrun or srun)"
        )
    if isinstance(name, str) and name in STRATEGY_NAMES:
        return name
    if isinstance(name, str) and name in _PUBLISHED and name not in registered_strategies():
        package = _PUBLISHED[name]
        raise ValueError(
            f"strategy={value!r} needs the {package} distribution, which is not installed: "
            f"pip install {package} (or gpulayer[all])"
        )
    if not isinstance(name, str) or name not in registered_strategies():
        accepted = ", ".join(map(repr, (*STRATEGY_NAMES, *sorted({*registered_strategies(), *_PUBLISHED}))))
        raise ValueError(f"strategy={value!r}: accepted values are {accepted} or a gpulayer.trainer.DDPStrategy")
    return name


def registered_strategies() -> dict[str, Any]:
    """The strategies installed distributions publish: name -> entry point (loaded only when chosen)."""
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def resolve_strategy(value: Any, world_size: int) -> tuple[str, DDPStrategy | Strategy | None]:
    """(name, options): ``"auto"`` is DDP for more than one process, else one device; a registered name is its
    strategy with default options."""
    if isinstance(value, DDPStrategy):
        return "ddp", value
    if isinstance(value, Strategy):
        value.check_world_size(world_size)
        return value.strategy_name, value
    name = _name(value)
    if name not in STRATEGY_NAMES:
        strategy = registered_strategies()[name].load()()
        strategy.check_world_size(world_size)
        return name, strategy
    if name == "single_device":
        if world_size > 1:
            raise ValueError(f"strategy='single_device' trains one process, but devices * num_nodes = {world_size}")
        return name, None
    if name == "auto":
        return ("ddp", DDPStrategy()) if world_size > 1 else ("single_device", None)
    return "ddp", DDPStrategy(find_unused_parameters=name == "ddp_find_unused_parameters_true")
