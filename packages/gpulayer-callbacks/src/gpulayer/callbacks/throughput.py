"""``Throughput``, ``measure_flops`` and ``get_available_flops``: what ``ThroughputMonitor`` computes with.

Lightning 2.6 has them in ``lightning/fabric/utilities/throughput.py``. ``Throughput`` works on Python numbers only
(no tensor, no collective): the caller hands it running totals and it reports rates over a window of its updates.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

# Peak dense FLOP/s of one device, from the vendors' datasheets, as Lightning 2.6 lists them. Columns: float64,
# float32, TF32, bfloat16, float16, int8, int4; None where the chip has no such mode (or no number is published).
_COLUMNS = (torch.float64, torch.float32, "tfloat32", torch.bfloat16, torch.float16, torch.int8, "int4")
_N = None
_CUDA_FLOPS: dict[str, tuple[float | None, ...]] = {
    "h200 sxm1": (3.4e13, 6.7e13, 9.9e14, 2.0e15, 2.0e15, 4.0e15, _N),
    "h200 nvl1": (3.0e13, 6.0e13, 8.4e14, 1.7e15, 1.7e15, 3.3e15, _N),
    "h100 nvl": (67e12, 133.8e12, 989.4e12, 1978.8e12, 1978.8e12, 3957.8e12, _N),
    "h100 sxm": (33.5e12, 66.9e12, 494.7e12, 989.4e12, 989.4e12, 1978.9e12, _N),
    "h100 pcie": (25.6e12, 51.2e12, 378e12, 756e12, 756e12, 1513e12, _N),
    "rtx 4090": (_N, 82.6e12, 82.6e12, 82.6e12, 82.6e12, 660.6e12, 1321.2e12),
    "rtx 4080": (_N, 48.7e12, 48.7e12, 48.7e12, 48.7e12, 389.9e12, 779.8e12),
    "rtx 4080 super": (_N, 52.2e12, 52.2e12, 52.2e12, 52.2e12, 417.6e12, 835.2e12),
    "l4": (_N, 30.3e12, 60e12, 121e12, 121e12, 242e12, 484e12),
    "l40": (_N, 90.5e12, 90.5e12, 181e12, 181e12, 362e12, 724e12),
    "a100": (9.7e12, 19.5e12, 156e12, 312e12, 312e12, 624e12, _N),
    "a6000": (_N, 38.7e12, 77.4e12, 38.7e12, 38.7e12, 309.7e12, 619.3e12),
    "a40": (_N, 37.4e12, 74.8e12, 37.4e12, 37.4e12, 299.3e12, 598.7e12),
    "a10g": (_N, 31.2e12, 62.5e12, 125e12, 125e12, 250e12, 500e12),
    "rtx 3090 ti": (_N, 40e12, 40e12, 40e12, 40e12, 320e12, 640e12),
    "rtx 3090": (_N, 35.6e12, 35.6e12, 35.6e12, 35.6e12, 284e12, 568e12),
    "rtx 3080 ti": (_N, 34.1e12, 34.1e12, 34.1e12, 34.1e12, 272.8e12, 546.6e12),
    "rtx 3080": (_N, 29.8e12, 29.8e12, 29.8e12, 29.8e12, 238e12, 476e12),
    "rtx 3070": (_N, 20.3e12, 20.3e12, 20.3e12, 20.3e12, 162.6e12, 325.2e12),
    "t4": (_N, 8.1e12, _N, _N, 65e12, 130e12, 260e12),
    "quadro rtx 5000": (_N, 11.2e12, _N, _N, 89.2e12, _N, _N),
    "rtx 2080 super": (_N, 11.2e12, _N, _N, 22.3e12, 178.4e12, 356.8e12),
    "rtx 2080 ti": (_N, 14.2e12, _N, _N, 28.5e12, 227.7e12, 455.4e12),
    "rtx 2080": (_N, 10.6e12, _N, _N, 21.2e12, 169.6e12, 339.1e12),
    "rtx 2070 super": (_N, 9.1e12, _N, _N, 18.1e12, 145e12, 290e12),
    "titan rtx": (_N, 16.3e12, _N, _N, 32.6e12, 261e12, 522e12),
    "v100 sxm": (7.8e12, 15.7e12, _N, _N, 125e12, _N, _N),
    "v100 pcie": (7e12, 14e12, _N, _N, 112e12, _N, _N),
    "v100s pcie": (8.2e12, 16.4e12, _N, _N, 130e12, _N, _N),
}
# (a substring of the device's lower-cased name, the row it reads), first match wins: Lightning's rules.
_SIMPLE_CHIPS = (
    ("a6000", "a6000"),
    ("a100", "a100"),
    ("a40", "a40"),
    ("a10g", "a10g"),
    ("t4", "t4"),
    ("quadro rtx 5000", "quadro rtx 5000"),
    ("titan rtx", "titan rtx"),
    ("v100-sxm", "v100 sxm"),
    ("v100-pcie", "v100 pcie"),
    ("v100s-pcie", "v100s pcie"),
)


def _chip(name: str) -> str | None:
    """The row of ``_CUDA_FLOPS`` a CUDA device's name reads (which may be missing from it), or None."""
    chip = name.lower()
    if "h200" in chip:
        return next((row for row in ("h200 sxm1", "h200 nvl1") if row.split()[1] in chip), chip)
    if "h100" in chip:
        if "hbm3" in chip:
            return "h100 sxm"
        if "nvl" in chip:
            return "h100 nvl"
        return "h100 pcie" if "pcie" in chip or "hbm2e" in chip else chip
    if "l4" in chip:
        return "l40" if "tesla" in chip else "l4"
    if "geforce rtx" in chip:
        suffix = " super" if "super" in chip else " ti" if "ti" in chip else ""
        return f"rtx {chip.split(' ')[3]}{suffix}"
    return next((row for part, row in _SIMPLE_CHIPS if part in chip), None)


def get_available_flops(device: torch.device, dtype: torch.dtype | str) -> int | None:
    """The device's peak FLOP/s in ``dtype`` (float32 counts as TF32 on Ampere and later unless matmuls are set to
    "highest"), or None, with Lightning's warning for a GPU it does not know; None on the CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    chip = _chip(name)
    if chip is None:
        warnings.warn(f"FLOPs not found for {name!r}", UserWarning, stacklevel=2)
        return None
    if chip not in _CUDA_FLOPS:
        warnings.warn(f"FLOPs not found for {name!r}, chip is {chip!r}", UserWarning, stacklevel=2)
        return None
    if dtype is torch.float32 and torch.cuda.get_device_capability(device)[0] >= 8:
        dtype = "tfloat32" if torch.get_float32_matmul_precision() != "highest" else dtype
    flops = dict(zip(_COLUMNS, _CUDA_FLOPS[chip], strict=True)).get(dtype)
    if flops is None:
        warnings.warn(f"{name!r} does not support {dtype}", UserWarning, stacklevel=2)
        return None
    return int(flops)


def measure_flops(
    model: torch.nn.Module,
    forward_fn: Callable[[], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """The FLOPs of ``forward_fn()`` (and of ``loss_fn`` on its output and its backward, when given), counted by
    torch's ``FlopCounterMode``; a model on the ``meta`` device costs nothing to measure. ``model`` is Lightning's
    argument, kept for its signature."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        output = forward_fn()
        if loss_fn is not None:
            loss_fn(output).backward()
    return counter.get_total_flops()


class _IncreasingWindow(list):
    """The last ``maxlen`` values appended, each larger than the one before (a counter gone wrong raises)."""

    def __init__(self, maxlen: int) -> None:
        super().__init__()
        self.maxlen = maxlen

    def append(self, value: Any) -> None:
        if self and self[-1] >= value:
            raise ValueError(f"Expected the value to increase, last: {self[-1]}, current: {value}")
        super().append(value)
        if len(self) > self.maxlen:
            del self[0]


class Throughput:
    """Rates over the last ``window_size`` updates of running totals, as Lightning 2.6 reports them.

    ``compute()`` returns ``time``, ``batches``, ``samples`` (and ``lengths``) always; once the window is full,
    ``device/batches_per_sec``, ``device/samples_per_sec`` (and ``device/items_per_sec``), with their global
    counterparts (times ``world_size``) above one device; once ``window_size`` updates carried ``flops``,
    ``device/flops_per_sec`` (``flops_per_sec`` above one device) and ``device/mfu`` where ``available_flops`` is
    known. ``separator`` replaces the ``/``.
    """

    def __init__(
        self, available_flops: float | None = None, world_size: int = 1, window_size: int = 100, separator: str = "/"
    ) -> None:
        _check_window(world_size, window_size)
        self.available_flops = available_flops
        self.world_size = world_size
        self.separator = separator
        self._time: _IncreasingWindow = _IncreasingWindow(window_size)
        self._batches: _IncreasingWindow = _IncreasingWindow(window_size)
        self._samples: _IncreasingWindow = _IncreasingWindow(window_size)
        self._lengths: _IncreasingWindow = _IncreasingWindow(window_size)
        self._flops: deque[float] = deque(maxlen=window_size)

    def update(
        self, *, time: float, batches: int, samples: int, lengths: int | None = None, flops: float | None = None
    ) -> None:
        """Totals so far on this device: seconds, batches, samples, items (``lengths``); ``flops``: this device's
        FLOPs since the previous update."""
        self._time.append(time)
        if samples < batches:
            raise ValueError(f"Expected samples ({samples}) to be greater or equal than batches ({batches})")
        self._batches.append(batches)
        self._samples.append(samples)
        if lengths is not None:
            if lengths < samples:
                raise ValueError(f"Expected lengths ({lengths}) to be greater or equal than samples ({samples})")
            self._lengths.append(lengths)
            if len(self._lengths) != len(self._samples):
                raise RuntimeError(
                    f"If lengths are passed ({len(self._lengths)}), there needs to be the same number of samples"
                    f" ({len(self._samples)})"
                )
        if flops is not None:
            self._flops.append(flops * self.world_size)  # all devices together

    def compute(self) -> dict[str, int | float]:
        device, world_size = f"device{self.separator}", self.world_size
        metrics: dict[str, int | float] = {
            "time": self._time[-1],
            "batches": self._batches[-1],
            "samples": self._samples[-1],
        }
        if self._lengths:
            metrics["lengths"] = self._lengths[-1]
        several = world_size > 1
        elapsed = self._time[-1] - self._time[0]
        if len(self._time) == self._time.maxlen:
            batches_per_sec = (self._batches[-1] - self._batches[0]) / elapsed
            samples_per_sec = (self._samples[-1] - self._samples[0]) / elapsed
            metrics[f"{device}batches_per_sec"] = batches_per_sec
            metrics[f"{device}samples_per_sec"] = samples_per_sec
            if several:
                metrics["batches_per_sec"] = batches_per_sec * world_size
                metrics["samples_per_sec"] = samples_per_sec * world_size
            if len(self._lengths) == self._lengths.maxlen:
                items_per_sec = (self._lengths[-1] - self._lengths[0]) / elapsed
                metrics[f"{device}items_per_sec"] = items_per_sec
                if several:
                    metrics["items_per_sec"] = items_per_sec * world_size
        if len(self._flops) == self._flops.maxlen:
            # The first update's FLOPs were spent before the window's first time: they are left out.
            flops_per_sec = (sum(self._flops) - self._flops[0]) / elapsed
            if several:
                metrics["flops_per_sec"] = flops_per_sec
            metrics[f"{device}flops_per_sec"] = flops_per_sec / world_size
            if self.available_flops:
                metrics[f"{device}mfu"] = flops_per_sec / world_size / self.available_flops
        return metrics

    def reset(self) -> None:
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()


def _check_window(world_size: int, window_size: int) -> None:
    """Lightning asserts these when its ``Throughput`` is built; GPUlayer names the argument, and checks them when
    ``ThroughputMonitor`` is constructed."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: accepted values are integers of at least 1")
    if not isinstance(window_size, int) or window_size < 2:
        raise ValueError(f"window_size={window_size!r}: accepted values are integers of at least 2 (rates need two)")
