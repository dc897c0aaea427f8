"""Where a preempted ``fit`` saves and resumes: Lightning's ``hpc_ckpt_N.ckpt`` in ``default_root_dir``, and whether
this worker is one the elastic agent restarted (which resumes by itself)."""

from __future__ import annotations

import os
import re

_HPC = re.compile(r"^hpc_ckpt_(\d+)\.ckpt$")


def hpc_save_path(folder: str) -> str:
    """The next ``hpc_ckpt_N.ckpt`` in ``folder`` (N one past the highest there, from 1)."""
    return os.path.join(folder, f"hpc_ckpt_{(_highest(folder) or 0) + 1}.ckpt")


def hpc_resume_path(folder: str) -> str | None:
    """The highest ``hpc_ckpt_N.ckpt`` in ``folder``, if any."""
    highest = _highest(folder)
    return None if highest is None else os.path.join(folder, f"hpc_ckpt_{highest}.ckpt")


def _highest(folder: str) -> int | None:
    if not os.path.isdir(folder):
        return None
    numbers = [int(match.group(1)) for name in os.listdir(folder) if (match := _HPC.match(name))]
    return max(numbers, default=None)


def is_restart() -> bool:
    """A worker the elastic agent (``gpulayer launch --max-restarts``, torchrun) started again after a failure."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
