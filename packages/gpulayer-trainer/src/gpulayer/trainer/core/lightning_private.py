"""Lightning-private ``Trainer`` attributes that widely used integrations read, answered from one table.

A library's callback built on Lightning's ``Callback`` may read a private attribute of Lightning's Trainer. Each row
of ``LIGHTNING_PRIVATE`` answers one such read on GPUlayer's Trainer, with Lightning 2.6's meaning, and names the
integration that reads it; a test runs that integration. Any other private attribute a callback reads fails with an
``AttributeError`` naming the callback, the attribute, and that it is Lightning's own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpulayer.trainer.core.callback import callback_base


@dataclass(frozen=True)
class AcceleratorConnector:
    """Lightning's ``trainer._accelerator_connector``, as far as integrations read it."""

    is_distributed: bool  # the strategy is a distributed one (DDP, FSDP), on one process too


# name -> its answer for a Trainer. Each row: who reads it, and the test that runs that reader.
LIGHTNING_PRIVATE: dict[str, Callable[[Any], Any]] = {
    # Optuna's PyTorchLightningPruningCallback (optuna-integration), in on_fit_start:
    # test_third_party_callbacks.py::test_optunas_pruning_callback_prunes_the_same_trial_at_the_same_step
    "_accelerator_connector": lambda trainer: AcceleratorConnector(trainer.strategy.is_distributed),
}


def lightning_private(trainer: Any, name: str) -> Any:
    """The answer to ``trainer.<name>`` for a private name the Trainer does not have, from ``LIGHTNING_PRIVATE``;
    else an ``AttributeError`` naming who read it (``Trainer.__getattr__`` calls this: frame 2 is the reader)."""
    if name in LIGHTNING_PRIVATE:
        return LIGHTNING_PRIVATE[name](trainer)
    reader = sys._getframe(2).f_locals.get("self")
    who = "" if callback_base(reader) is None else f"{type(reader).__module__}.{type(reader).__qualname__} reads it: "
    raise AttributeError(
        f"'Trainer' object has no attribute {name!r}: {who}{name} is a private attribute of Lightning's Trainer, "
        f"which GPUlayer's Trainer answers only for the integrations it knows ({', '.join(LIGHTNING_PRIVATE)}); "
        "keep Lightning's Trainer for this callback, or ask for the attribute to be added"
    )
