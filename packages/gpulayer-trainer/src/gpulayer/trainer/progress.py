"""``Progress``: where a ``fit`` is, in Lightning's counters, and how a checkpoint saves and restores it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    """The fit loop's counters. ``global_step`` counts optimizer steps (the optimization advances it);
    ``batches_that_stepped`` is the logger's step; ``total_batches`` counts batches across epochs."""

    global_step: int = 0
    epochs_completed: int = 0  # trainer.current_epoch
    epochs_processed: int = 0
    batches_that_stepped: int = 0
    total_batches: int = 0
    batch_idx: int = -1
    is_last_batch: bool = False
    # Where the run is, for checkpoints: "idle", "batch" (up to on_train_batch_end), "validation" (after a batch),
    # "epoch_end"; and the RNG states at which this epoch's iterator was made and first read.
    phase: str = "idle"
    data_snapshots: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epochs_processed": self.epochs_processed,
            "epochs_completed": self.epochs_completed,
            "global_step": self.global_step,
            "batches_that_stepped": self.batches_that_stepped,
            "total_batches": self.total_batches,
            "batch_idx": self.batch_idx,
            "phase": self.phase,
            "data_snapshots": dict(self.data_snapshots),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The counters as saved; ``batch_idx`` and ``phase`` are the fit loop's to resume from."""
        self.epochs_processed = state["epochs_processed"]
        self.global_step = state["global_step"]
        # Saved in on_train_epoch_end, an epoch is processed but not yet completed: current_epoch catches up when
        # training starts, after the sanity check (which reports the saved epoch, as in Lightning).
        self.epochs_completed = state["epochs_completed"]
        self.batches_that_stepped = state["batches_that_stepped"]
        self.total_batches = state["total_batches"]
        self.data_snapshots = dict(state["data_snapshots"])
