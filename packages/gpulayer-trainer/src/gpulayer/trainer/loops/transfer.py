"""The batch path between a loader and a step: precision conversion, then Lightning's three transfer hooks.

Lightning 2.6's is ``Strategy.batch_to_device`` (``lightning/pytorch/strategies/strategy.py``) and
``LightningModule._apply_batch_transfer_handler`` (``lightning/pytorch/core/module.py``); a DataModule's hook wins
over the module's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.core.hooks import Hooks, is_called

if TYPE_CHECKING:
    from gpulayer.trainer.core.datamodule import DataModule
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.strategies.precision import Precision

_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


class BatchTransfer:
    """Moves batches to the device for one stage at a time (``prepare``); ``moves`` says whether it does anything.

    On the CPU at full precision with no transfer hook overridden every batch would come back unchanged, so
    ``moves`` is False and the loops hand batches on without calling it.
    """

    def __init__(self, device: torch.device, precision: Precision, hooks: Hooks, prefetch: bool) -> None:
        self.device, self.precision, self.hooks, self.prefetch = device, precision, hooks, prefetch
        self.moves = False
        self._datamodule: DataModule | None = None
        self._from_datamodule: set[str] = set()  # the hooks the DataModule overrides: its own win
        self._hooks_overridden = False

    def prepare(self, module: Module, datamodule: DataModule | None) -> None:
        """Decide, once per stage, whether batches move and whose hooks move them: each hook the DataModule
        overrides is the DataModule's (Lightning's ``_DataHookSelector``), the others the Module's."""
        from gpulayer.trainer.core.datamodule import datamodule_overrides
        from gpulayer.trainer.core.module import Module

        self._datamodule = datamodule
        self._from_datamodule = {hook for hook in _TRANSFER_HOOKS if datamodule_overrides(datamodule, hook)}
        self._hooks_overridden = bool(self._from_datamodule) or any(
            is_called(hook, module, Module) for hook in _TRANSFER_HOOKS
        )
        self.moves = self.device.type != "cpu" or self.precision.converts_input or self._hooks_overridden

    def __call__(self, batch: Any, dataloader_idx: int) -> Any:
        if not self.moves:
            return batch
        batch = self.precision.convert_input(batch)
        batch = self._hook("on_before_batch_transfer", batch, dataloader_idx)
        batch = self._hook("transfer_batch_to_device", batch, self.device, dataloader_idx)
        return self._hook("on_after_batch_transfer", batch, dataloader_idx)

    def _hook(self, name: str, *args: Any) -> Any:
        if name in self._from_datamodule:
            return getattr(self._datamodule, name)(*args)
        return self.hooks.module(name, *args)

    def source(self, iterator: Any) -> Any:
        """The batches of ``iterator``, read ahead in a background thread under ``prefetch=True``."""
        if not self.prefetch:
            return iterator
        from gpulayer.trainer.data.prefetch import prefetch

        moves_on_side_stream = self.device.type == "cuda" and not self._hooks_overridden
        return prefetch(iterator, self.device if moves_on_side_stream else None)
