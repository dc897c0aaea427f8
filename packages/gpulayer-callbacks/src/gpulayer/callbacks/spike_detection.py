"""``SpikeDetection``: stop ``fit`` with ``TrainingSpikeException`` when the training loss spikes, and write the
batches to skip on a rerun, with Lightning 2.6's rules (``lightning/pytorch/callbacks/spike.py`` over
``lightning/fabric/utilities/spike.py``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from gpulayer.trainer import Callback


class TrainingSpikeException(RuntimeError):
    """Raised on every rank when a loss spike was detected; Lightning's name (``lightning.fabric.utilities.spike``)."""

    def __init__(self, batch_idx: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}", *args, **kwargs)


class SpikeDetection(Callback):
    """Compare each training batch's loss with the mean of the last ``window`` accepted losses; on a spike, write
    the indices of this batch and the one before it (which may have corrupted the weights) as a JSON list and raise
    ``TrainingSpikeException``.

    A loss is a spike when it is not an improvement on the previous one (``mode``) and differs from the running mean
    by at least ``atol`` and by at least ``rtol`` times the mean (a check whose tolerance is None passes); with
    ``finite_only`` a NaN or infinite loss is a spike too, else it is skipped. Checks start at ``batch_idx >=
    warmup`` in every epoch, as Lightning's do. Each rank checks its own loss; a spike on any rank stops every rank,
    and rank 0 alone writes ``exclude_batches_path`` (a ``.json`` file, or a folder that gets ``skip_batches.json``;
    None: ``default_root_dir/skip_batches.json``). The file lists every spike this callback saw, so a rerun can skip
    those batches.

    Cost: like Lightning's, it checks at every training batch's end, so adding it costs a host sync per step: one
    pair of flags read back from the device (Lightning's comparisons sync several times), none in warmup unless
    ``finite_only=False`` needs the finite flag, as Lightning's does. Under DDP a checked batch adds Lightning's
    collective (two with ``finite_only=False``).
    """

    def __init__(
        self,
        mode: str = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: str | os.PathLike | None = None,
        finite_only: bool = True,
    ) -> None:
        # Lightning's messages: the window's from torchmetrics' Running; the mode's Lightning raises at the first
        # check, GPUlayer at construction.
        if not (isinstance(window, int) and window > 0):
            raise ValueError(f"Expected argument `window` to be a positive integer but got {window}")
        if mode not in ("min", "max"):
            raise ValueError(f"Invalid mode. Has to be min or max, found {mode}")
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only
        self.bad_batches: list[int] = []
        self.last_val: torch.Tensor | float = 0.0
        # The running mean, as torchmetrics' Running(MeanMetric) keeps it: a ring of (value, weight) slots, a NaN
        # entering with weight 0; the mean of no slots is NaN. Its sum is one reduction, not slot after slot: a
        # float32 mean may differ from torchmetrics' in its last bit.
        self._dtype = torch.get_default_dtype()
        self._values: torch.Tensor | None = None
        self._weights: torch.Tensor | None = None
        self._seen = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """The file a spike's batches go to: ``skip_batches.json`` in ``default_root_dir`` or in the folder given, or
        the ``.json`` file given (Lightning works it out at every batch; it is the same for the whole run)."""
        if self.exclude_batches_path is None:
            self.exclude_batches_path = os.path.join(trainer.default_root_dir, "skip_batches.json")
        if not str(self.exclude_batches_path).endswith(".json"):
            self.exclude_batches_path = os.path.join(self.exclude_batches_path, "skip_batches.json")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if isinstance(outputs, torch.Tensor):
            loss = outputs.detach()
        elif isinstance(outputs, Mapping):
            loss = outputs["loss"].detach()
        else:
            raise TypeError(f"outputs have to be of type torch.Tensor or Mapping, got {type(outputs).__qualname__}")
        strategy = trainer.strategy
        finite_here = True
        if batch_idx >= self.warmup:
            finite = torch.isfinite(loss).all()
            spike, finite_here = torch.stack([self._is_spike(loss, finite), finite]).tolist()
            # Each rank judges its own loss; a spike on one stops all (every rank reaches this batch's check).
            if strategy.reduce_boolean_decision(spike, all=False):
                self._handle_spike(trainer, batch_idx)
        elif not self.finite_only:
            finite_here = bool(torch.isfinite(loss).all())
        # With finite_only every loss that is no spike counts, a non-finite warmup loss too, as in Lightning.
        if self.finite_only or strategy.reduce_boolean_decision(finite_here, all=True):
            self._update_stats(loss)

    def _is_spike(self, loss: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
        """Lightning's test, on the device: not better than the last loss, and beyond both tolerances."""
        running = self._running_mean(loss.device)
        diff = loss - self.last_val
        better = (diff <= 0).all() if self.mode == "min" else (diff >= 0).all()
        spike = ~better
        if self.atol is not None:
            spike = spike & ((loss - running).abs() >= abs(self.atol))
        if self.rtol is not None:
            spike = spike & ((loss - running).abs() >= (self.rtol * running).abs())
        if self.finite_only:
            spike = spike | ~finite
        return spike

    def _running_mean(self, device: torch.device) -> torch.Tensor:
        if self._values is None:
            return torch.tensor(float("nan"), dtype=self._dtype, device=device)
        return self._values.sum() / self._weights.sum()

    def _update_stats(self, loss: torch.Tensor) -> None:
        if self._values is None or self._values.device != loss.device:
            self._values = torch.zeros(self.window, dtype=self._dtype, device=loss.device)
            self._weights = torch.zeros(self.window, dtype=self._dtype, device=loss.device)
        slot = self._seen % self.window
        nan = torch.isnan(loss)
        self._values[slot] = torch.where(nan, 0.0, loss).sum()
        self._weights[slot] = (~nan).sum()
        self._seen += 1
        self.last_val = loss

    def _handle_spike(self, trainer: Any, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        if trainer.is_global_zero:
            path = str(self.exclude_batches_path)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as file:
                json.dump(self.bad_batches, file, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    def state_dict(self) -> dict[str, Any]:
        """Lightning's keys; its running mean saves no state (``running`` and ``mean`` are empty), nor does this."""
        return {
            "last_val": self.last_val.item() if isinstance(self.last_val, torch.Tensor) else self.last_val,
            "mode": self.mode,
            "warmup": self.warmup,
            "atol": self.atol,
            "rtol": self.rtol,
            "bad_batches": self.bad_batches,
            "bad_batches_path": self.exclude_batches_path,
            "running": {},
            "mean": {},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what ``state_dict`` saved (Lightning 2.6's raises ``AttributeError`` on any resume)."""
        self.last_val = state_dict["last_val"]
        self.mode = state_dict["mode"]
        self.warmup = state_dict["warmup"]
        self.atol = state_dict["atol"]
        self.rtol = state_dict["rtol"]
        self.bad_batches = list(state_dict["bad_batches"])
        self.exclude_batches_path = state_dict["bad_batches_path"]
