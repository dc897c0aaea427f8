"""``precision=``: Lightning's names and aliases, and what each does to the module, the inputs and the steps."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gpulayer.trainer.batch import map_tensors

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")
_ALIASES = {64: "64-true", "64": "64-true", 32: "32-true", "32": "32-true", 16: "16-mixed", "16": "16-mixed"}
_HISTORICAL = {16: "16-mixed", "16": "16-mixed", "bf16": "bf16-mixed"}
_TRUE_DTYPES = {"16-true": torch.float16, "bf16-true": torch.bfloat16, "64-true": torch.float64}


def resolve_precision(value: Any, accelerator: str) -> str:
    """Lightning's resolution: aliases, the historical-name warning, and fp16 AMP becoming bf16 on CPU."""
    if value is None:
        return "32-true"
    if isinstance(value, bool) or not (value in PRECISIONS or value in _ALIASES or value == "bf16"):
        raise ValueError(
            f"precision={value!r}: accepted values are {', '.join(map(repr, PRECISIONS))} "
            "and the aliases 64, '64', 32, '32', 16, '16', 'bf16'"
        )
    if value in _HISTORICAL:
        warnings.warn(
            f"precision={value!r} is supported for historical reasons but its usage is discouraged. "
            f"Please set your precision to {_HISTORICAL[value]!r} instead!",
            UserWarning,
            stacklevel=4,
        )
    name = _ALIASES.get(value, _HISTORICAL.get(value, value))
    if name == "16-mixed" and accelerator == "cpu":
        warnings.warn(
            "precision='16-mixed' on CPU: AMP with fp16 is not supported on CPU, so precision='bf16-mixed' is used "
            "instead (as Lightning does)",
            UserWarning,
            stacklevel=4,
        )
        return "bf16-mixed"
    return name


class Precision:
    """The runtime side of one resolved precision name."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self._device_type = device.type
        self._dtype = _TRUE_DTYPES.get(name)
        self.scaler = torch.amp.GradScaler(device.type) if name == "16-mixed" else None
        if name.endswith("-mixed"):
            autocast_dtype = torch.float16 if name == "16-mixed" else torch.bfloat16
            # No cast cache, as in Lightning's autocast: with it, a step of several forward and backward passes (a
            # GAN's under manual optimization) ended with other weights than Lightning's.
            self.step_context: Callable[[], Any] = lambda: torch.autocast(
                self._device_type, dtype=autocast_dtype, cache_enabled=False
            )
        elif self._dtype is not None:
            self.step_context = self._default_dtype
        else:
            self.step_context = contextlib.nullcontext

    @property
    def converts_input(self) -> bool:
        return self._dtype is not None

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(dtype=self._dtype) if self._dtype is not None else module

    def convert_input(self, batch: Any) -> Any:
        """Floating tensors to the true-precision dtype; everything else unchanged."""
        if self._dtype is None:
            return batch
        return map_tensors(batch, lambda t: t.to(self._dtype) if torch.is_floating_point(t) else t)

    def module_init_context(self) -> contextlib.AbstractContextManager[None]:
        """Where modules are made in this precision: the true-precision dtype as torch's default, else as is."""
        return self._default_dtype() if self._dtype is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _default_dtype(self) -> Iterator[None]:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self._dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)


class ScaledOptimizer:
    """An optimizer stepped through fp16 AMP's ``GradScaler``, under either optimization (Lightning's
    ``MixedPrecision.optimizer_step``): ``step(closure)`` runs the closure (backward, unscaling, the hooks before the
    step), then the scaler's step, which skips a non-finite update, and its update. Everything else is the wrapped
    optimizer's. Under automatic optimization it is what ``optimizer_step`` receives."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, automatic: bool = True) -> None:
        self.optimizer = optimizer
        self.scaler = scaler
        self._automatic = automatic

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """The closure's loss under automatic optimization, the optimizer's step's output under manual."""
        loss = closure() if closure is not None else None
        if self._automatic and closure is not None and loss is None:
            return None  # training_step skipped the batch: nothing to unscale or step (Lightning's rule)
        output = self.scaler.step(self.optimizer, **kwargs)
        self.scaler.update()
        return loss if self._automatic else output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)
