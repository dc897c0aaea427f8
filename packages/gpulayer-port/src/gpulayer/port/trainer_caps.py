"""What ``gpulayer port --verify`` makes of every ``Trainer(...)`` a script builds, the same under Lightning and
GPUlayer: one process on the CPU, one epoch of at most ``steps`` optimizer steps with one validation run at its end,
and the evaluation loops cut to ``steps`` batches.

The epoch is cut with ``limit_train_batches``, not ``max_steps``: on a resume Lightning 2.6 treats any ``max_steps``
as a restart inside the saved epoch (the ``_FitLoop.restarting`` setter in ``lightning/pytorch/loops/fit_loop.py``),
which GPUlayer does not follow (docs/porting-from-lightning.md), so a cap there would make every resume differ.
"""

from __future__ import annotations

from typing import Any

_LIMITS = ("limit_val_batches", "limit_test_batches", "limit_predict_batches")


def capped(arguments: dict[str, Any], steps: int) -> dict[str, Any]:
    """``arguments`` (a Trainer's, by name, defaults included) with the caps of a run of ``steps`` steps. A value the
    Trainer refuses stays as it is, for the Trainer's own error."""
    accumulate = arguments.get("accumulate_grad_batches")
    per_step = accumulate if _whole(accumulate) and accumulate > 0 else 1
    max_epochs, min_epochs = arguments.get("max_epochs"), arguments.get("min_epochs")
    max_steps, min_steps = arguments.get("max_steps"), arguments.get("min_steps")
    caps = {
        "accelerator": "cpu",
        "devices": 1,
        "num_nodes": 1,
        "max_epochs": 1
        if max_epochs is None or (_whole(max_epochs) and (max_epochs == -1 or max_epochs > 1))
        else max_epochs,
        "min_epochs": min(min_epochs, 1) if _whole(min_epochs) else min_epochs,
        "max_steps": min(max_steps, steps) if _whole(max_steps) and max_steps >= 0 else max_steps,  # -1: none
        "min_steps": min(min_steps, steps) if _whole(min_steps) else min_steps,
        "limit_train_batches": _batches(arguments.get("limit_train_batches"), steps * per_step),
        **{name: _batches(arguments.get(name), steps) for name in _LIMITS},
        # One validation run, at the end of the one epoch (a fraction or a count would add more). The sanity check
        # needs no cap: both trainers take at most limit_val_batches batches for it.
        "val_check_interval": 1.0,
        "check_val_every_n_epoch": arguments.get("check_val_every_n_epoch") or 1,
    }
    return {**arguments, **{name: value for name, value in caps.items() if name in arguments}}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _batches(value: Any, cap: int) -> Any:
    """A ``limit_*_batches``: a count within ``cap`` and ``0.0`` (none) stay; a fraction or no limit become ``cap``."""
    if _whole(value):
        return min(value, cap) if value >= 0 else value
    if value is None or (isinstance(value, float) and value > 0):
        return cap
    return value
