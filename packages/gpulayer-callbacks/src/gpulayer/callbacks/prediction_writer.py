"""``BasePredictionWriter``: write predictions as ``predict`` makes them, with Lightning 2.6's interval and hooks
(``lightning/pytorch/callbacks/prediction_writer.py``)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Literal

from gpulayer.trainer import Callback
from gpulayer.trainer.exceptions import MisconfiguredValueError
from gpulayer.trainer.loops.evaluation_loop import WriteInterval


class BasePredictionWriter(Callback):
    """Subclass it and override ``write_on_batch_end`` (``write_interval="batch"``), ``write_on_epoch_end``
    (``"epoch"``) or both (``"batch_and_epoch"``).

    ``batch_indices`` are the sampler's indices of each batch: under DDP, this rank's share of the dataset, so each
    rank writes its own. With ``trainer.predict(..., return_predictions=False)`` a batch writer keeps memory flat:
    the loop keeps no output, and the indices only of the batch it runs; an epoch writer gets every output.
    """

    def __init__(self, write_interval: Literal["batch", "epoch", "batch_and_epoch"] = "batch") -> None:
        accepted = [interval.value for interval in WriteInterval]
        if write_interval not in accepted:  # Lightning's message, word for word
            raise MisconfiguredValueError(f"`write_interval` should be one of {accepted}.")
        self.interval = WriteInterval(write_interval)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if "dataloader_iter" in inspect.signature(pl_module.predict_step).parameters:
            raise NotImplementedError("The `PredictionWriterCallback` does not support using `dataloader_iter`.")

    def write_on_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Override with the logic to write a single batch."""
        raise NotImplementedError()

    def write_on_epoch_end(
        self, trainer: Any, pl_module: Any, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> None:
        """Override with the logic to write all batches. As in Lightning, ``predictions`` is one list per loader
        only when there are several, while ``batch_indices`` always has one list per loader."""
        raise NotImplementedError()

    def on_predict_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.interval.on_batch:
            indices = trainer.predict_loop.current_batch_indices
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.interval.on_epoch:
            loop = trainer.predict_loop
            self.write_on_epoch_end(trainer, pl_module, loop.predictions, loop.epoch_batch_indices)
