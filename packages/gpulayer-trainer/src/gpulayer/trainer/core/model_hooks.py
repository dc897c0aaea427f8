"""The hooks Lightning calls, with its names and arguments: ``ModelHooks`` (a ``Module``'s, each a no-op by
default) and ``DataHooks`` (shared by ``Module`` and ``DataModule``: data preparation, setup, loaders and batch
transfer)."""

from __future__ import annotations

from typing import Any

import torch

from gpulayer.trainer.batch import move_to_device
from gpulayer.trainer.exceptions import MisconfiguredNotImplementedError


class ModelHooks:
    """Override the ones you need in your ``Module``; the Trainer skips those you leave alone."""

    def on_fit_start(self) -> Any:
        return None

    def on_fit_end(self) -> Any:
        return None

    def on_train_start(self) -> Any:
        return None

    def on_train_end(self) -> Any:
        return None

    def on_train_epoch_start(self) -> Any:
        return None

    def on_train_epoch_end(self) -> Any:
        return None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> Any:
        return None

    def on_validation_start(self) -> Any:
        return None

    def on_validation_end(self) -> Any:
        return None

    def on_validation_epoch_start(self) -> Any:
        return None

    def on_validation_epoch_end(self) -> Any:
        return None

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return None

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return None

    def on_test_start(self) -> Any:
        return None

    def on_test_end(self) -> Any:
        return None

    def on_test_epoch_start(self) -> Any:
        return None

    def on_test_epoch_end(self) -> Any:
        return None

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return None

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return None

    def on_predict_start(self) -> Any:
        return None

    def on_predict_end(self) -> Any:
        return None

    def on_predict_epoch_start(self) -> Any:
        return None

    def on_predict_epoch_end(self) -> Any:
        return None

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return None

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return None

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> Any:
        return None

    def on_before_backward(self, loss: torch.Tensor) -> Any:
        return None

    def on_after_backward(self) -> Any:
        return None

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> Any:
        return None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> Any:
        return None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> Any:
        return None


class DataHooks:
    """Data preparation, ``setup``/``teardown`` per stage, and the loaders; a loader hook counts only if overridden.

    ``prepare_data`` runs on each node's local rank 0, or with ``prepare_data_per_node = False`` on global rank 0
    only; the other ranks wait for it.
    """

    prepare_data_per_node: bool = True

    def prepare_data(self) -> None:
        pass

    def setup(self, stage: str) -> None:
        pass

    def teardown(self, stage: str) -> None:
        pass

    def train_dataloader(self) -> Any:
        raise MisconfiguredNotImplementedError(f"{type(self).__qualname__}.train_dataloader is not implemented")

    def val_dataloader(self) -> Any:
        raise MisconfiguredNotImplementedError(f"{type(self).__qualname__}.val_dataloader is not implemented")

    def test_dataloader(self) -> Any:
        raise MisconfiguredNotImplementedError(f"{type(self).__qualname__}.test_dataloader is not implemented")

    def predict_dataloader(self) -> Any:
        raise MisconfiguredNotImplementedError(f"{type(self).__qualname__}.predict_dataloader is not implemented")

    # ---- batch transfer: a DataModule's override wins over the Module's ------------------------------------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch
