"""``deterministic`` and ``benchmark``: process-wide torch settings, applied as Lightning applies them.

Lightning 2.6's is ``_set_torch_flags`` in ``lightning/pytorch/trainer/connectors/accelerator_connector.py``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

# GPUlayer's own rule for benchmark=None: cuDNN autotuning pays off only on long runs.
AUTOTUNE_FROM_STEPS = 1000


def apply(args: Any) -> None:
    """At construction: deterministic algorithms (and cuBLAS's workspace) on request; a forced ``benchmark``."""
    if args.deterministic is not None:
        if args.deterministic:
            if args.benchmark:
                warnings.warn(
                    "deterministic=True and benchmark=True: cuDNN autotuning may pick non-deterministic kernels",
                    UserWarning,
                    stacklevel=4,
                )
            torch.use_deterministic_algorithms(True, warn_only=args.deterministic == "warn")
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        else:
            torch.use_deterministic_algorithms(False)
    if args.benchmark is not None:
        torch.backends.cudnn.benchmark = args.benchmark
    elif args.deterministic:
        torch.backends.cudnn.benchmark = False


def apply_autotune(args: Any, planned_steps: float, device: torch.device) -> None:
    """At ``fit``, for ``benchmark=None`` on CUDA: autotune only runs planning at least 1,000 optimizer steps."""
    if args.benchmark is None and not args.deterministic and device.type == "cuda":
        torch.backends.cudnn.benchmark = planned_steps >= AUTOTUNE_FROM_STEPS
