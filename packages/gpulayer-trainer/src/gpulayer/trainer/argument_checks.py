"""The checks of ``Trainer`` arguments: each turns the value given into the value the loop reads, or raises an
error naming the argument, the value and what is accepted.

A check is called as ``check(name, value, checked)``, ``checked`` holding the arguments checked before it (in
``TrainerArguments``' order), for the few whose rule depends on another (``devices`` on the accelerator).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpulayer.trainer.core.lightning_classes import is_lightning_path, is_lightnings
from gpulayer.trainer.defaults import callback_list
from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError
from gpulayer.trainer.logging.logger import logger_list
from gpulayer.trainer.loops.timer import DURATION
from gpulayer.trainer.profilers.advanced import AdvancedProfiler
from gpulayer.trainer.profilers.profiler import Profiler
from gpulayer.trainer.profilers.pytorch import PyTorchProfiler
from gpulayer.trainer.profilers.simple import SimpleProfiler
from gpulayer.trainer.strategies.precision import resolve_precision
from gpulayer.trainer.strategies.strategy_names import check_strategy

if TYPE_CHECKING:
    from gpulayer.trainer.core.callback import Callback

Check = Callable[[str, Any, Mapping[str, Any]], Any]

ACCELERATORS = ("auto", "cpu", "gpu", "cuda")
CLIP_ALGORITHMS = ("norm", "value")
PROFILERS = {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler}
_REFUSED = object()  # a check's ``none``: None is refused as any other wrong value is


def flag(*, none: Any = _REFUSED) -> Check:
    """True or False; None stands for ``none`` where it is given."""

    def check(name: str, value: Any, checked: Mapping[str, Any]) -> bool:
        if value is None and none is not _REFUSED:
            return none
        if not isinstance(value, bool):
            raise MisconfiguredTypeError(f"{name}={value!r}: accepted values are True or False")
        return value

    return check


def at_least(minimum: int, *, none: Any = _REFUSED) -> Check:
    """An int >= ``minimum``; None stands for ``none`` where it is given."""

    def check(name: str, value: Any, checked: Mapping[str, Any]) -> int:
        return none if value is None and none is not _REFUSED else _int_at_least(name, value, minimum)

    return check


def one_of(*accepted: Any) -> Check:
    return lambda name, value, checked: _choice(name, value, accepted)


def logger(name: str, value: Any, checked: Mapping[str, Any]) -> bool | list[Any]:
    return logger_list(value)


def accelerator(name: str, value: Any, checked: Mapping[str, Any]) -> str:
    chosen = _choice(name, value.lower() if isinstance(value, str) else value, ACCELERATORS)
    import torch

    if chosen == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if chosen in ("gpu", "cuda") and not torch.cuda.is_available():
        raise MisconfiguredValueError(
            f"accelerator={value!r}: no CUDA GPU is available on this machine; use 'cpu' or 'auto'"
        )
    return "cuda" if chosen == "gpu" else chosen


def strategy(name: str, value: Any, checked: Mapping[str, Any]) -> Any:
    check_strategy(value)  # the world size decides what "auto" means (see world.py)
    return value


def devices(name: str, value: Any, checked: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The device indices of this node's processes, one process each; ``None`` for ``"auto"``.

    Lightning's forms: on CPU a positive int or numeric string; on CUDA also -1 (all), a list of indices, "0,2".
    """
    gpu = checked["accelerator"] == "cuda"
    accepted = "a positive int, a numeric string, or 'auto'" + (
        "; on CUDA also -1 (all GPUs), a list of GPU indices, or '0,2'" if gpu else ""
    )
    if value == "auto":
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and (value >= 1 or (gpu and value == -1)):
        indices = list(range(torch_gpu_count() if value == -1 else value))
    elif isinstance(value, int) and not isinstance(value, bool) and value == 0:
        raise MisconfiguredValueError(f"devices={value!r}: must be at least 1 (accepted: {accepted})")
    elif gpu and isinstance(value, (list, tuple)) and value and all(isinstance(i, int) for i in value):
        indices = list(value)
    elif gpu and isinstance(value, str) and "," in value:
        indices = [int(part) for part in value.split(",") if part.strip()]
    else:
        raise MisconfiguredTypeError(f"devices={value!r}: accepted values are {accepted}")
    if gpu and (len(set(indices)) != len(indices) or not all(0 <= i < torch_gpu_count() for i in indices)):
        raise MisconfiguredValueError(f"devices={value!r}: GPU indices must be distinct and below {torch_gpu_count()}")
    return tuple(indices)


def torch_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def precision(name: str, value: Any, checked: Mapping[str, Any]) -> str:
    return resolve_precision(value, checked["accelerator"])


def callbacks(name: str, value: Any, checked: Mapping[str, Any]) -> list[Callback]:
    return callback_list(value)


def fast_dev_run(name: str, value: Any, checked: Mapping[str, Any]) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value >= 0:
        return value
    raise MisconfiguredValueError(f"fast_dev_run={value!r}: accepted values are True, False or an int >= 0")


def limit(name: str, value: Any, checked: Mapping[str, Any]) -> int | float:
    """Lightning's rule: an int counts batches, a float in [0, 1] is a fraction, an integral float > 1 is an int."""
    if value is None:
        return 1.0
    if isinstance(value, bool):
        raise MisconfiguredTypeError(f"{name}={value!r}: accepted values are an int >= 0 or a float in [0.0, 1.0]")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and 0.0 <= value <= 1.0:
        return value
    if isinstance(value, float) and value > 1.0 and value.is_integer():
        return int(value)
    raise MisconfiguredValueError(
        f"{name}={value!r}: accepted values are an int >= 0 (batches) or a float in [0.0, 1.0] (a fraction)"
    )


def overfit_batches(name: str, value: Any, checked: Mapping[str, Any]) -> int | float:
    return limit(name, 0.0 if value is None else value, checked)


def val_check_interval(name: str, value: Any, checked: Mapping[str, Any]) -> int | float | timedelta:
    if value is None:
        return 1.0
    if isinstance(value, (str, dict, timedelta)):
        return _duration(name, value, strict=False)
    if isinstance(value, bool):
        raise MisconfiguredTypeError(
            f"val_check_interval={value!r}: accepted values are an int, a float in [0, 1] or a duration"
        )
    if isinstance(value, int):
        return _int_at_least(name, value, 1)
    if isinstance(value, float) and 0.0 <= value <= 1.0:
        return value
    raise MisconfiguredValueError(
        f"val_check_interval={value!r}: accepted values are an int (batches), a float in [0.0, 1.0] (a fraction of "
        "the epoch), or a duration ('DD:HH:MM:SS', a dict of timedelta arguments, a timedelta)"
    )


def check_val_every_n_epoch(name: str, value: Any, checked: Mapping[str, Any]) -> int | None:
    """An int >= 1, or None: then a ``val_check_interval`` fraction of an epoch has no epoch to be a fraction of."""
    if value is not None:
        return _int_at_least(name, value, 1)
    interval = checked["val_check_interval"]
    if isinstance(interval, float) and interval != 1.0:
        raise MisconfiguredValueError(
            f"val_check_interval={interval!r} with check_val_every_n_epoch=None: a fraction of an epoch needs an "
            "epoch; give val_check_interval as an int (batches) instead"
        )
    return None


def sanity_steps(name: str, value: Any, checked: Mapping[str, Any]) -> int | float:
    steps = 2 if value is None else _int_at_least(name, value, -1)
    return math.inf if steps == -1 else steps


def max_time(name: str, value: Any, checked: Mapping[str, Any]) -> timedelta | None:
    return None if value is None else _duration(name, value, strict=True)


def _duration(name: str, value: Any, *, strict: bool) -> timedelta:
    """``"DD:HH:MM:SS"`` (max_time wants two-digit hours, minutes and seconds, as Lightning), a dict, a timedelta."""
    accepted = "a 'DD:HH:MM:SS' string, a dict of timedelta arguments, or a datetime.timedelta"
    if isinstance(value, timedelta):
        return value
    if isinstance(value, dict):
        try:
            return timedelta(**value)
        except TypeError as error:
            raise MisconfiguredValueError(f"{name}={value!r}: {error}; accepted: {accepted}") from None
    if isinstance(value, str):
        # max_time: the Timer's rule (Lightning hands max_time to its Timer).
        match = DURATION.fullmatch(value.strip()) if strict else re.match(r"^(\d+):(\d+):(\d+):(\d+)$", value)
        if match:
            days, hours, minutes, seconds = map(int, match.groups())
            return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    raise MisconfiguredValueError(f"{name}={value!r}: accepted values are {accepted}")


def gradient_clip_val(name: str, value: Any, checked: Mapping[str, Any]) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MisconfiguredTypeError(
            f"gradient_clip_val={value!r}: accepted values are None or a number (0 means no clipping)"
        )
    if value < 0:
        raise MisconfiguredValueError(f"gradient_clip_val={value!r}: must be >= 0 (0 or None means no clipping)")
    return value


def clip_algorithm(name: str, value: Any, checked: Mapping[str, Any]) -> str | None:
    if value is None:
        return None
    return _choice(name, value.lower() if isinstance(value, str) else value, CLIP_ALGORITHMS)


def root_dir(name: str, value: Any, checked: Mapping[str, Any]) -> str:
    if value is None:
        return os.getcwd()
    if not isinstance(value, (str, os.PathLike)):
        raise MisconfiguredTypeError(f"default_root_dir={value!r}: accepted values are None or a path")
    return os.path.normpath(os.path.abspath(os.path.expanduser(os.fspath(value))))


def profiler(name: str, value: Any, checked: Mapping[str, Any]) -> Profiler | None:
    """A ``Profiler``, or Lightning's names for one (any case), made here as Lightning's ``_init_profiler`` does."""
    if value is None or isinstance(value, Profiler):
        return value
    if isinstance(value, str):
        if "." in value and is_lightning_path(value):  # a config's class_path, left unported
            raise MisconfiguredValueError(
                f"{name}={value!r}: Lightning's class; use gpulayer.trainer.{value.rsplit('.', 1)[-1]} (the same "
                "arguments), or run gpulayer port on the config"
            )
        if value.lower() not in PROFILERS:
            raise MisconfiguredValueError(
                "When passing string value for the `profiler` parameter of `Trainer`, it can only be one of "
                f"{list(PROFILERS)}"
            )
        return PROFILERS[value.lower()]()
    if is_lightnings(type(value)):
        raise MisconfiguredTypeError(
            f"profiler={value!r}: a Lightning profiler; use gpulayer.trainer.{type(value).__name__} (the same "
            "arguments) or its name ('simple', 'advanced', 'pytorch')"
        )
    raise MisconfiguredTypeError(f"{name}={value!r}: accepted values are None, {list(PROFILERS)} or a Profiler")


# Lightning 2.6 Trainer arguments GPUlayer does not adopt: each is refused by name, saying what to do instead.
_UNADOPTED = {
    "plugins": "GPUlayer takes no plugins: precision= sets the precision, and the cluster environment (torchrun, "
    "Slurm) is detected; run your own script with gpulayer.runtime.launch() for anything else",
    "model_registry": "GPUlayer uploads nothing; save with ModelCheckpoint and upload the file yourself",
}


def unadopted(name: str, value: Any, checked: Mapping[str, Any]) -> None:
    if value is not None:
        raise MisconfiguredValueError(f"{name}={value!r}: {_UNADOPTED[name]} (accepted: None)")


def _int_at_least(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MisconfiguredTypeError(f"{name}={value!r}: accepted values are ints >= {minimum}")
    if value < minimum:
        raise MisconfiguredValueError(f"{name}={value!r}: accepted values are ints >= {minimum}")
    return value


def _choice(name: str, value: Any, accepted: tuple) -> Any:
    """``value`` if it is one of ``accepted``, of the same type (so ``1`` is not ``True``)."""
    if not any(type(value) is type(option) and value == option for option in accepted):
        raise MisconfiguredValueError(f"{name}={value!r}: accepted values are {', '.join(map(repr, accepted))}")
    return value
