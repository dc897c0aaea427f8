"""Every ``Trainer`` argument, checked once at construction and turned into one plain, frozen object.

Errors name the argument, the value and what is accepted, and are raised before any file or directory is
made. Where Lightning only fails later (``accumulate_grad_batches=0``, ``check_val_every_n_epoch=0``) we fail
at once.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError
from gpulayer.trainer.precision import resolve_precision
from gpulayer.trainer.strategy_names import check_strategy

ACCELERATORS = ("auto", "cpu", "gpu", "cuda")
CLIP_ALGORITHMS = ("norm", "value")
_MAX_TIME = re.compile(r"^(\d+):(\d{2}):(\d{2}):(\d{2})$")


@dataclass(frozen=True, kw_only=True)
class TrainerArguments:
    """The resolved arguments: what the loop reads, never re-parsed."""

    accelerator: str
    device_indices: tuple[int, ...] | None  # None: "auto", decided with the placement (see world.py)
    strategy: Any  # a name or a Strategy, resolved with the world size (see world.py)
    num_nodes: int
    precision: str
    max_epochs: int | None
    min_epochs: int | None
    max_steps: int
    min_steps: int | None
    max_time: timedelta | None
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    val_check_interval: int | float | timedelta
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int | float
    fast_dev_run: int
    accumulate_grad_batches: int
    gradient_clip_val: int | float | None
    gradient_clip_algorithm: str | None
    deterministic: bool | str | None
    benchmark: bool | None
    log_every_n_steps: int
    default_root_dir: str
    enable_checkpointing: bool
    inference_mode: bool
    use_distributed_sampler: bool
    prefetch: bool
    check_finite_loss: bool
    enable_progress_bar: bool
    enable_model_summary: bool
    barebones: bool
    detect_anomaly: bool
    overfit_batches: int | float
    reload_dataloaders_every_n_epochs: int
    sync_batchnorm: bool
    enable_autolog_hparams: bool


def parse_arguments(
    *,
    accelerator: str,
    strategy: str,
    devices: Any,
    num_nodes: int,
    precision: Any,
    fast_dev_run: Any,
    max_epochs: Any,
    min_epochs: Any,
    max_steps: Any,
    min_steps: Any,
    max_time: Any,
    limit_train_batches: Any,
    limit_val_batches: Any,
    limit_test_batches: Any,
    limit_predict_batches: Any,
    val_check_interval: Any,
    check_val_every_n_epoch: Any,
    num_sanity_val_steps: Any,
    log_every_n_steps: Any,
    enable_checkpointing: Any,
    accumulate_grad_batches: Any,
    gradient_clip_val: Any,
    gradient_clip_algorithm: Any,
    deterministic: Any,
    benchmark: Any,
    inference_mode: Any,
    use_distributed_sampler: Any,
    default_root_dir: Any,
    prefetch: Any,
    check_finite_loss: Any,
    enable_progress_bar: Any = None,
    enable_model_summary: Any = None,
    barebones: Any = False,
    detect_anomaly: Any = False,
    overfit_batches: Any = 0.0,
    reload_dataloaders_every_n_epochs: Any = 0,
    sync_batchnorm: Any = False,
    enable_autolog_hparams: Any = True,
    logger: Any = None,
    profiler: Any = None,
    plugins: Any = None,
    model_registry: Any = None,
) -> TrainerArguments:
    _refuse_unadopted(profiler=profiler, plugins=plugins, model_registry=model_registry)
    barebones = _flag("barebones", barebones)
    if barebones:
        _check_barebones(
            enable_checkpointing=enable_checkpointing,
            logger=logger,
            enable_progress_bar=enable_progress_bar,
            log_every_n_steps=log_every_n_steps,
            enable_model_summary=enable_model_summary,
            num_sanity_val_steps=num_sanity_val_steps,
            fast_dev_run=fast_dev_run,
            detect_anomaly=detect_anomaly,
        )
        enable_checkpointing, enable_progress_bar, enable_model_summary = False, False, False
        log_every_n_steps, num_sanity_val_steps = 0, 0
    accelerator = _accelerator(accelerator)
    device_indices = _devices(devices, accelerator)
    num_nodes = _int_at_least("num_nodes", num_nodes, 1)
    check_strategy(strategy)  # the world size decides what "auto" means (see world.py)
    fast_dev_run = _fast_dev_run(fast_dev_run)
    limits = {
        name: _limit(name, value)
        for name, value in (
            ("limit_train_batches", limit_train_batches),
            ("limit_val_batches", limit_val_batches),
            ("limit_test_batches", limit_test_batches),
            ("limit_predict_batches", limit_predict_batches),
        )
    }
    check_val_every_n_epoch = _check_val_every_n_epoch(check_val_every_n_epoch)
    val_check_interval = _val_check_interval(val_check_interval, check_val_every_n_epoch)
    max_steps = _int_at_least("max_steps", max_steps, -1)
    max_epochs = None if max_epochs is None else _int_at_least("max_epochs", max_epochs, -1)
    num_sanity_val_steps = (
        2 if num_sanity_val_steps is None else _int_at_least("num_sanity_val_steps", num_sanity_val_steps, -1)
    )
    if fast_dev_run:
        limits = dict.fromkeys(limits, fast_dev_run)
        max_steps, max_epochs, num_sanity_val_steps = fast_dev_run, 1, 0
        val_check_interval, check_val_every_n_epoch = 1.0, 1
    overfit_batches = _limit("overfit_batches", 0.0 if overfit_batches is None else overfit_batches)
    if overfit_batches > 0:  # over fast_dev_run's, as in Lightning
        limits["limit_train_batches"] = limits["limit_val_batches"] = overfit_batches
    clip_val = _gradient_clip_val(gradient_clip_val)
    return TrainerArguments(
        accelerator=accelerator,
        device_indices=device_indices,
        strategy=strategy,
        num_nodes=num_nodes,
        precision=resolve_precision(precision, accelerator),
        max_epochs=max_epochs,
        min_epochs=None if min_epochs is None else _int_at_least("min_epochs", min_epochs, 0),
        max_steps=max_steps,
        min_steps=None if min_steps is None else _int_at_least("min_steps", min_steps, 0),
        max_time=None if max_time is None else _max_time(max_time),
        **limits,
        val_check_interval=val_check_interval,
        check_val_every_n_epoch=check_val_every_n_epoch,
        num_sanity_val_steps=math.inf if num_sanity_val_steps == -1 else num_sanity_val_steps,
        fast_dev_run=fast_dev_run,
        accumulate_grad_batches=_int_at_least("accumulate_grad_batches", accumulate_grad_batches, 1),
        gradient_clip_val=clip_val,
        gradient_clip_algorithm=_clip_algorithm(gradient_clip_algorithm),
        deterministic=_choice("deterministic", deterministic, (None, True, False, "warn")),
        benchmark=_choice("benchmark", benchmark, (None, True, False)),
        log_every_n_steps=50 if log_every_n_steps is None else _int_at_least("log_every_n_steps", log_every_n_steps, 0),
        default_root_dir=_root_dir(default_root_dir),
        enable_checkpointing=_flag(
            "enable_checkpointing", True if enable_checkpointing is None else enable_checkpointing
        ),
        inference_mode=_flag("inference_mode", inference_mode),
        use_distributed_sampler=_flag("use_distributed_sampler", use_distributed_sampler),
        prefetch=_flag("prefetch", prefetch),
        check_finite_loss=_flag("check_finite_loss", check_finite_loss),
        enable_progress_bar=_flag("enable_progress_bar", True if enable_progress_bar is None else enable_progress_bar),
        enable_model_summary=_flag(
            "enable_model_summary", True if enable_model_summary is None else enable_model_summary
        ),
        barebones=barebones,
        detect_anomaly=_flag("detect_anomaly", detect_anomaly),
        overfit_batches=overfit_batches,
        reload_dataloaders_every_n_epochs=_int_at_least(
            "reload_dataloaders_every_n_epochs", reload_dataloaders_every_n_epochs, 0
        ),
        sync_batchnorm=_flag("sync_batchnorm", sync_batchnorm),
        enable_autolog_hparams=_flag("enable_autolog_hparams", enable_autolog_hparams),
    )


# Lightning 2.6 Trainer arguments GPUlayer does not adopt: each is refused by name, saying what to do instead.
_UNADOPTED = {
    "profiler": "GPUlayer has no profiler; wrap fit in torch.profiler.profile(...) yourself, or use benchmarks/",
    "plugins": "GPUlayer takes no plugins: precision= sets the precision, and the cluster environment (torchrun, "
    "Slurm) is detected; run your own script with gpulayer.runtime.launch() for anything else",
    "model_registry": "GPUlayer uploads nothing; save with ModelCheckpoint and upload the file yourself",
}


def _refuse_unadopted(**given: Any) -> None:
    for name, value in given.items():
        if value is not None:
            raise MisconfiguredValueError(f"{name}={value!r}: {_UNADOPTED[name]} (accepted: None)")


def _check_barebones(**given: Any) -> None:
    """Lightning's ``barebones=True``: an argument that turns on what barebones turns off is an error."""
    turned_on = {
        "enable_checkpointing": given["enable_checkpointing"],
        "logger": given["logger"] not in (None, False),
        "enable_progress_bar": given["enable_progress_bar"],
        "log_every_n_steps": given["log_every_n_steps"] not in (None, 0),
        "enable_model_summary": given["enable_model_summary"],
        "num_sanity_val_steps": given["num_sanity_val_steps"] not in (None, 0),
        "fast_dev_run": given["fast_dev_run"] not in (False, 0),
        "detect_anomaly": given["detect_anomaly"],
    }
    for name, on in turned_on.items():
        if on:
            raise MisconfiguredValueError(
                f"barebones=True with {name}={given[name]!r}: barebones mode turns off everything that may cost "
                "speed (checkpoints, logging, the log line, the sanity check, fast_dev_run, anomaly detection); "
                f"drop {name} or barebones"
            )


def defaults_from_environment(init: Callable[..., None]) -> Callable[..., None]:
    """Lightning's ``PL_TRAINER_<ARGUMENT>`` variables: each gives the default of a ``Trainer`` argument the call
    does not pass (``PL_TRAINER_MAX_EPOCHS=3``); the value is read as a Python literal where it is one, else as
    text."""
    names = [name for name in inspect.signature(init).parameters if name != "self"]

    @functools.wraps(init)
    def with_environment_defaults(self: Any, **given: Any) -> None:
        for name in names:
            text = os.environ.get(f"PL_TRAINER_{name.upper()}")
            if text and name not in given:
                try:
                    given[name] = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    given[name] = text
        init(self, **given)

    return with_environment_defaults


def _accelerator(value: Any) -> str:
    name = _choice("accelerator", value.lower() if isinstance(value, str) else value, ACCELERATORS)
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name in ("gpu", "cuda") and not torch.cuda.is_available():
        raise MisconfiguredValueError(
            f"accelerator={value!r}: no CUDA GPU is available on this machine; use 'cpu' or 'auto'"
        )
    return "cuda" if name == "gpu" else name


def _devices(value: Any, accelerator: str) -> tuple[int, ...] | None:
    """The device indices of this node's processes, one process each; ``None`` for ``"auto"``.

    Lightning's forms: on CPU a positive int or numeric string; on CUDA also -1 (all), a list of indices, "0,2".
    """
    gpu = accelerator == "cuda"
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


def _fast_dev_run(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value >= 0:
        return value
    raise MisconfiguredValueError(f"fast_dev_run={value!r}: accepted values are True, False or an int >= 0")


def _limit(name: str, value: Any) -> int | float:
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


def _check_val_every_n_epoch(value: Any) -> int | None:
    if value is None:
        return None
    return _int_at_least("check_val_every_n_epoch", value, 1)


def _val_check_interval(value: Any, check_val_every_n_epoch: int | None) -> int | float | timedelta:
    if value is None:
        return 1.0
    if isinstance(value, (str, dict, timedelta)):
        return _duration("val_check_interval", value, strict=False)
    if isinstance(value, bool):
        raise MisconfiguredTypeError(
            f"val_check_interval={value!r}: accepted values are an int, a float in [0, 1] or a duration"
        )
    if isinstance(value, int):
        return _int_at_least("val_check_interval", value, 1)
    if isinstance(value, float) and 0.0 <= value <= 1.0:
        if check_val_every_n_epoch is None and value != 1.0:
            raise MisconfiguredValueError(
                f"val_check_interval={value!r} with check_val_every_n_epoch=None: a fraction of an epoch needs an "
                "epoch; give val_check_interval as an int (batches) instead"
            )
        return value
    raise MisconfiguredValueError(
        f"val_check_interval={value!r}: accepted values are an int (batches), a float in [0.0, 1.0] (a fraction of "
        "the epoch), or a duration ('DD:HH:MM:SS', a dict of timedelta arguments, a timedelta)"
    )


def _max_time(value: Any) -> timedelta:
    return _duration("max_time", value, strict=True)


def _duration(name: str, value: Any, *, strict: bool) -> timedelta:
    """``"DD:HH:MM:SS"`` (max_time wants two-digit hours, minutes and seconds, as Lightning does), a dict, a timedelta."""
    accepted = "a 'DD:HH:MM:SS' string, a dict of timedelta arguments, or a datetime.timedelta"
    if isinstance(value, timedelta):
        return value
    if isinstance(value, dict):
        try:
            return timedelta(**value)
        except TypeError as error:
            raise MisconfiguredValueError(f"{name}={value!r}: {error}; accepted: {accepted}") from None
    if isinstance(value, str):
        match = _MAX_TIME.match(value) if strict else re.match(r"^(\d+):(\d+):(\d+):(\d+)$", value)
        if match:
            days, hours, minutes, seconds = map(int, match.groups())
            return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    raise MisconfiguredValueError(f"{name}={value!r}: accepted values are {accepted}")


def _gradient_clip_val(value: Any) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MisconfiguredTypeError(
            f"gradient_clip_val={value!r}: accepted values are None or a number (0 means no clipping)"
        )
    if value < 0:
        raise MisconfiguredValueError(f"gradient_clip_val={value!r}: must be >= 0 (0 or None means no clipping)")
    return value


def _clip_algorithm(value: Any) -> str | None:
    if value is None:
        return None
    return _choice("gradient_clip_algorithm", value.lower() if isinstance(value, str) else value, CLIP_ALGORITHMS)


def _root_dir(value: Any) -> str:
    if value is None:
        return os.getcwd()
    if not isinstance(value, (str, os.PathLike)):
        raise MisconfiguredTypeError(f"default_root_dir={value!r}: accepted values are None or a path")
    return os.path.normpath(os.path.abspath(os.path.expanduser(os.fspath(value))))


def _int_at_least(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MisconfiguredTypeError(f"{name}={value!r}: accepted values are ints >= {minimum}")
    if value < minimum:
        raise MisconfiguredValueError(f"{name}={value!r}: accepted values are ints >= {minimum}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise MisconfiguredTypeError(f"{name}={value!r}: accepted values are True or False")
    return value


def _choice(name: str, value: Any, accepted: tuple) -> Any:
    """``value`` if it is one of ``accepted``, of the same type (so ``1`` is not ``True``)."""
    if not any(type(value) is type(option) and value == option for option in accepted):
        raise MisconfiguredValueError(f"{name}={value!r}: accepted values are {', '.join(map(repr, accepted))}")
    return value
