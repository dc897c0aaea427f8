"""``DataModule``: Lightning's ``LightningDataModule`` — data preparation, splits and loaders in one place."""

from __future__ import annotations

from typing import Any


class DataModule:
    """Override ``setup`` and the ``*_dataloader`` methods you need; ``prepare_data`` runs once, before ``setup``."""

    prepare_data_per_node: bool = True

    def __init__(self) -> None:
        self.trainer: Any = None

    def prepare_data(self) -> None:
        pass

    def setup(self, stage: str) -> None:
        pass

    def teardown(self, stage: str) -> None:
        pass

    def train_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__}.train_dataloader is not implemented")

    def val_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__}.val_dataloader is not implemented")

    def test_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__}.test_dataloader is not implemented")

    def predict_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__}.predict_dataloader is not implemented")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def on_exception(self, exception: BaseException) -> None:
        pass
