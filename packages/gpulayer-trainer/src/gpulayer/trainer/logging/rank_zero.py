"""``rank_zero_only``: Lightning 2.6's decorator (``lightning.pytorch.utilities.rank_zero_only``, defined in
``lightning_utilities/core/rank_zero.py``) for code that runs on global rank 0 alone, such as a logger's writes: the
Trainer calls loggers on every rank, as Lightning does.

``rank_zero_only.rank`` starts as the launcher's environment says (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID`` or
``JSM_NAMESPACE_RANK``, the first set; 0 without any) and is set to the global rank when a run sets up its loggers.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def rank_zero_only(fn: Callable[..., Any], default: Any = None) -> Callable[..., Any]:
    """``fn`` where ``rank_zero_only.rank`` is 0; elsewhere the wrapper returns ``default`` without calling it."""

    @functools.wraps(fn)
    def on_rank_zero(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if rank_zero_only.rank == 0 else default

    return on_rank_zero


def _rank_from_environment() -> int:
    return next((int(os.environ[name]) for name in _RANK_VARIABLES if name in os.environ), 0)


rank_zero_only.rank = _rank_from_environment()  # type: ignore[attr-defined]
