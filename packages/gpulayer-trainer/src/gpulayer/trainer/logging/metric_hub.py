"""``trainer.callback_metrics``, ``logged_metrics`` and ``progress_bar_metrics``, merged lazily.

Lightning merges the active loop's results into these dicts after every batch and turns the progress-bar
values into Python floats there (a device sync per step). We merge only when the dicts are read, when the
active loop changes, and where a batch loop ends: the same contents whenever anyone looks, and no work on
a step nobody looks at. Progress-bar values become floats only when read.

On several ranks, ``sync_dist`` values are reduced by the loops' merges, which every rank makes at the same
points (log steps, epoch ends, evaluation ends). Reading the dicts does not reduce (a read may happen on one
rank only): between those points a ``sync_dist`` step value reads as this rank's own.
"""

from __future__ import annotations

from typing import Any

import torch

from gpulayer.trainer.logging.results import ResultCollection, Sync


class MetricHub:
    def __init__(self, sync: Sync | None = None) -> None:
        self.sync = sync  # Runtime.all_reduce on several ranks, else None
        self.callback: dict[str, torch.Tensor] = {}
        self.logged: dict[str, torch.Tensor] = {}
        self.bar: dict[str, torch.Tensor] = {}
        self.results: ResultCollection | None = None
        # Lightning's ``_first_loop_iter``: None outside a batch loop (epoch values), True/False inside (step values).
        self.first_loop_iter: bool | None = None
        self.current_fx: str | None = None

    def activate(self, results: ResultCollection | None) -> None:
        """Make ``results`` the collection ``self.log`` writes to and the dicts read from."""
        if results is not self.results:
            self.flush()
            self.results = results

    def flush(self, reduce: bool = True) -> dict[str, torch.Tensor]:
        """Merge the active results into the dicts; returns what they logged (for eval return values).

        ``reduce=False`` for reads that some ranks may not make: ``sync_dist`` values are then not reduced.
        """
        if self.results is None:
            return {}
        callback, logged, bar = self.results.metrics(
            on_step=self.first_loop_iter is not None,
            sync=self.sync if reduce else None,
            distributed=self.sync is not None,
        )
        self.callback.update(callback)
        self.logged.update(logged)
        self.bar.update(bar)
        return logged

    def on_batch_start(self, batch: Any, dataloader_idx: int | None = None) -> None:
        self.first_loop_iter = self.first_loop_iter is None
        assert self.results is not None
        self.results.batch = batch
        self.results.batch_size = None
        self.results.dataloader_idx = dataloader_idx

    def on_batch_end(self) -> None:
        assert self.results is not None
        self.results.batch = None
        self.results.batch_size = None

    def epoch_end_reached(self) -> None:
        """Leave the batch loop: keep its last step values (Lightning merged them after that batch)."""
        if self.first_loop_iter is not None:
            self.flush()
        self.first_loop_iter = None

    def should_reset_tensors(self, fx: str) -> bool:
        return self.current_fx != fx and self.first_loop_iter in (None, True)

    def reset_results(self) -> None:
        if self.results is not None:
            self.results.reset()
        self.first_loop_iter = None
        self.current_fx = None

    def reset_metrics(self) -> None:
        self.callback, self.logged, self.bar = {}, {}, {}

    def callback_metrics(self) -> dict[str, torch.Tensor]:
        self.flush(reduce=False)
        return self.callback

    def logged_metrics(self) -> dict[str, torch.Tensor]:
        self.flush(reduce=False)
        return self.logged

    def progress_bar_metrics(self) -> dict[str, float]:
        """Python floats: reading them syncs with the device, so only the log line and users do."""
        self.flush(reduce=False)
        return {name: value.item() for name, value in self.bar.items()}
