"""``DataModule``: Lightning's ``LightningDataModule`` — data preparation, splits and loaders in one place."""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.hyperparameters import HyperparametersMixin
from gpulayer.trainer.model_hooks import DataHooks


class DataModule(DataHooks, HyperparametersMixin):
    """Override ``setup`` and the ``*_dataloader`` methods you need; ``prepare_data`` runs once, before ``setup``."""

    def __init__(self) -> None:
        super().__init__()
        self.trainer: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def on_exception(self, exception: BaseException) -> None:
        pass
