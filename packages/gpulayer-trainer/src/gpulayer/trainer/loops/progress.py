"""``Progress``: where a ``fit`` is, in Lightning's counters, and how a checkpoint saves and restores it; and
``fit_limits``, the counts at which it stops."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpulayer.trainer.data.order_position import OrderPosition
from gpulayer.trainer.exceptions import PossibleUserWarning

if TYPE_CHECKING:
    from gpulayer.trainer.arguments import TrainerArguments


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
    at_sync_point: bool = False  # the batch being run is one where the ranks combine decisions (not saved)
    # Where the run is, for checkpoints: "idle", "batch" (up to on_train_batch_end), "validation" (after a batch),
    # "epoch_end" ("stopped" in ``stopped``); and the RNG states at which this epoch's iterator was made and first
    # read.
    phase: str = "idle"
    data_snapshots: dict[str, Any] = field(default_factory=dict)
    order: OrderPosition = field(default_factory=OrderPosition)  # where the epoch is in its global order of samples
    # Set when max_steps ends an epoch before its last batch: the state to go on from in that epoch (see ``stop``).
    stopped: dict[str, Any] | None = None

    def position(self) -> str:
        """Where the run is, for messages."""
        return f"step {self.global_step} (epoch {self.epochs_completed}, batch_idx {self.batch_idx})"

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
            "stopped": self.stopped,
            # A batch saved in its step runs again: it is not consumed.
            "global_order": self.order.state_dict(self.batch_idx + (self.phase != "step")),
        }

    def stop(self, rng_states: dict[str, Any]) -> None:
        """``max_steps`` ends the epoch before its last batch. The epoch's end then counts it as done (Lightning's
        ``current_epoch``), so the state an unbroken run would go on from is kept here: the counters before that
        end, with the epoch's data snapshots, and the RNG states at the stop."""
        self.stopped = {**self.state_dict(), "phase": "stopped", "rng_states": rng_states}

    def load_state_dict(self, state: dict[str, Any], step_limit: int | float) -> dict[str, Any] | None:
        """The counters as saved; returns the saved position to go on from inside its epoch (with ``batch_idx`` and
        ``phase``), or None to start the next epoch. A run that ``max_steps`` stopped mid-epoch goes on from the
        stop when ``step_limit`` lets it train on, as an unbroken run would; otherwise it stays where it ended."""
        stopped = state.get("stopped")  # absent before 2026-12-05
        if stopped is not None and stopped["global_step"] < step_limit:
            state = stopped
        self.stopped = state.get("stopped")  # kept while the run has not gone on from it
        self.epochs_processed = state["epochs_processed"]
        self.global_step = state["global_step"]
        # Saved in on_train_epoch_end, an epoch is processed but not yet completed: current_epoch catches up when
        # training starts, after the sanity check (which reports the saved epoch, as in Lightning).
        self.epochs_completed = state["epochs_completed"]
        self.batches_that_stepped = state["batches_that_stepped"]
        self.total_batches = state["total_batches"]
        self.data_snapshots = dict(state["data_snapshots"])
        # Saved inside a batch's step (an exception in it): that batch runs again, as in Lightning.
        if state["phase"] == "step":
            self.total_batches -= 1
            return {**state, "batch_idx": state["batch_idx"] - 1}
        return state if state["phase"] in ("batch", "validation", "stopped") else None


def fit_limits(args: TrainerArguments) -> tuple[int, int, int | float]:
    """``(max_epochs, min_epochs, step_limit)`` of a ``fit``, as Lightning resolves them at its start: no limit at all
    is 1000 epochs (with its warning), ``max_steps=-1`` no step limit."""
    if args.max_epochs is not None:
        max_epochs = args.max_epochs
    elif args.max_steps == -1 and args.max_time is None:
        warnings.warn(
            "max_epochs was not set: training stops after 1000 epochs. Set max_epochs=-1 to train without "
            "an epoch limit.",
            PossibleUserWarning,
            stacklevel=5,
        )
        max_epochs = 1000
    else:
        max_epochs = -1
    min_epochs = args.min_epochs if args.min_epochs is not None else (1 if args.min_steps is not None else 0)
    return max_epochs, min_epochs, math.inf if args.max_steps == -1 else args.max_steps
