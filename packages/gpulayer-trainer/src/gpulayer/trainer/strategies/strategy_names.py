"""``strategy=``: ``"auto"``, ``"single_device"``, ``"ddp"`` (and Lightning's ``"ddp_spawn"``, ``"ddp_fork"``,
``"ddp_notebook"``), a ``Strategy`` object (``DDPStrategy`` with DDP's options), or a strategy another distribution
registers under the ``gpulayer.strategies`` entry point (``"fsdp"``: gpulayer-fsdp), turned into the ``Strategy``
the Trainer trains with."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from gpulayer.trainer.strategies.ddp import DDPStrategy
from gpulayer.trainer.strategies.strategy import SingleDeviceStrategy, Strategy

# Lightning 2.6's DDP names (``DDPStrategy.register_strategies``): how each starts its ranks.
_DDP_START_METHODS = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}
_DDP_NAMES = {
    f"{name}{unused}": start_method
    for name, start_method in _DDP_START_METHODS.items()
    for unused in ("", "_find_unused_parameters_true", "_find_unused_parameters_false")
}
STRATEGY_NAMES = ("auto", "single_device", *_DDP_NAMES)
ENTRY_POINT_GROUP = "gpulayer.strategies"
# Where the strategies GPUlayer itself publishes come from, for the error when one is not installed.
_PUBLISHED = {"fsdp": "gpulayer-fsdp"}


def check_strategy(value: Any) -> None:
    """Refuse a strategy that no world size makes valid."""
    if not isinstance(value, Strategy):
        _name(value)


def _name(value: Any) -> str:
    name = value.lower() if isinstance(value, str) else value
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


def resolve_strategy(value: Any, world_size: int, interactive: bool = False) -> Strategy:
    """The ``Strategy`` for ``value``: ``"auto"`` is DDP for more than one process (forked ranks in an
    ``interactive`` session, as Lightning's ``ddp_fork``), else one device; a registered name is its strategy with
    default options."""
    if isinstance(value, Strategy):
        strategy = value
    else:
        name = _name(value)
        if name not in STRATEGY_NAMES:
            strategy = registered_strategies()[name].load()()
        elif name == "single_device" or (name == "auto" and world_size == 1):
            strategy = SingleDeviceStrategy()
        elif name == "auto":
            strategy = DDPStrategy(start_method="fork" if interactive else "popen")
        else:
            strategy = DDPStrategy(
                find_unused_parameters=name.endswith("_find_unused_parameters_true"), start_method=_DDP_NAMES[name]
            )
    if isinstance(strategy, SingleDeviceStrategy) and world_size > 1:
        raise ValueError(f"strategy='single_device' trains one process, but devices * num_nodes = {world_size}")
    strategy.check_world_size(world_size)
    return strategy
