"""``strategy=``: ``"auto"``, ``"single_device"``, ``"ddp"`` or a ``DDPStrategy`` with DDP's options."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

STRATEGY_NAMES = (
    "auto",
    "single_device",
    "ddp",
    "ddp_find_unused_parameters_true",
    "ddp_find_unused_parameters_false",
    "fsdp",
)
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
        if timeout is not None and not isinstance(timeout, timedelta):
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(
                    f"DDPStrategy(timeout={timeout!r}): accepted values are None, a positive number of seconds or "
                    "a datetime.timedelta"
                )
            timeout = timedelta(seconds=timeout)
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


def check_strategy(value: Any) -> None:
    """Refuse a strategy that no world size makes valid."""
    if not isinstance(value, DDPStrategy):
        _name(value)


def _name(value: Any) -> str:
    name = value.lower() if isinstance(value, str) else value
    if name in _LAUNCHER_VARIANTS:
        raise ValueError(
            f"strategy={value!r}: GPUlayer starts DDP processes with torch's elastic agent; use strategy='ddp' "
            "(python train.py starts them for you, or run under gpulayer launch, torchrun or srun)"
        )
    if not isinstance(name, str) or name not in STRATEGY_NAMES:
        accepted = ", ".join(map(repr, STRATEGY_NAMES))
        raise ValueError(f"strategy={value!r}: accepted values are {accepted} or a gpulayer.trainer.DDPStrategy")
    if name == "fsdp":
        raise NotImplementedError("strategy='fsdp' needs the gpulayer-fsdp package, which is not released yet")
    return name


def resolve_strategy(value: Any, world_size: int) -> tuple[str, DDPStrategy | None]:
    """(name, DDP options): ``"auto"`` is DDP for more than one process, else one device."""
    if isinstance(value, DDPStrategy):
        return "ddp", value
    name = _name(value)
    if name == "single_device":
        if world_size > 1:
            raise ValueError(f"strategy='single_device' trains one process, but devices * num_nodes = {world_size}")
        return name, None
    if name == "auto":
        return ("ddp", DDPStrategy()) if world_size > 1 else ("single_device", None)
    return "ddp", DDPStrategy(find_unused_parameters=name == "ddp_find_unused_parameters_true")
