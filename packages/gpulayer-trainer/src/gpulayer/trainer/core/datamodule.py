"""``DataModule``: Lightning's ``LightningDataModule`` — data preparation, splits and loaders in one place."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Sized
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from gpulayer.trainer.core.hooks import is_overridden
from gpulayer.trainer.core.hyperparameters import HyperparametersMixin
from gpulayer.trainer.core.lightning_classes import lightning_class
from gpulayer.trainer.core.model_hooks import DataHooks

_LOADER_METHODS = (
    ("Train dataloader", "train_dataloader"),
    ("Validation dataloader", "val_dataloader"),
    ("Test dataloader", "test_dataloader"),
    ("Predict dataloader", "predict_dataloader"),
)


class DataModule(DataHooks, HyperparametersMixin):
    """Override ``setup`` and the ``*_dataloader`` methods you need; ``prepare_data`` runs once, before ``setup``.
    The batch transfer hooks are ``DataHooks``' defaults, so an override can call ``super()``'s."""

    name: str | None = None
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self) -> None:
        super().__init__()
        self.trainer: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def on_exception(self, exception: BaseException) -> None:
        pass

    @classmethod
    def from_datasets(
        cls,
        train_dataset: Dataset | Iterable[Dataset] | None = None,
        val_dataset: Dataset | Iterable[Dataset] | None = None,
        test_dataset: Dataset | Iterable[Dataset] | None = None,
        predict_dataset: Dataset | Iterable[Dataset] | None = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **datamodule_kwargs: Any,
    ) -> DataModule:
        """A DataModule whose loaders read these datasets (a list of datasets gives a list of loaders); training
        shuffles. ``batch_size`` and ``num_workers`` also go to ``__init__`` where it takes them (Lightning's)."""

        def loaders(datasets: Any, shuffle: bool) -> Any:
            def loader(dataset: Dataset) -> DataLoader:
                ordered = not shuffle or isinstance(dataset, IterableDataset)
                return DataLoader(
                    dataset, batch_size=batch_size, shuffle=not ordered, num_workers=num_workers, pin_memory=True
                )

            if isinstance(datasets, Dataset):
                return lambda: loader(datasets)
            return lambda: [loader(dataset) for dataset in datasets]

        parameters = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        given = {"batch_size": batch_size, "num_workers": num_workers}
        datamodule = cls(**datamodule_kwargs, **{k: v for k, v in given.items() if takes_any or k in parameters})
        for datasets, method, shuffle in (
            (train_dataset, "train_dataloader", True),
            (val_dataset, "val_dataloader", False),
            (test_dataset, "test_dataloader", False),
            (predict_dataset, "predict_dataloader", False),
        ):
            if datasets is not None:
                setattr(datamodule, method, loaders(datasets, shuffle))
        return datamodule

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | os.PathLike,
        map_location: Any = None,
        hparams_file: str | None = None,
        **kwargs: Any,
    ) -> DataModule:
        """Rebuild the DataModule from a checkpoint's saved hyperparameters (``kwargs`` override them) and its
        ``state_dict``; the file loads with ``weights_only=True`` (pass ``weights_only=False`` for one you trust)."""
        if hparams_file is not None:
            raise NotImplementedError(
                "load_from_checkpoint(hparams_file=...) is not supported; pass overrides as kwargs"
            )
        from gpulayer.trainer.core.saving import load_datamodule

        return load_datamodule(cls, checkpoint_path, **kwargs)

    def __str__(self) -> str:
        """Each loader method and the size of its dataset (Lightning's): ``{Train dataloader: size=60}`` per line."""
        lines = []
        for title, method in _LOADER_METHODS:
            try:
                loaders = getattr(self, method)()
                if isinstance(loaders, DataLoader):
                    shown = f"size={_size(loaders)}"
                else:
                    shown = " ; ".join(f"{i}. size={_size(loader)}" for i, loader in enumerate(loaders, start=1))
            except Exception:  # as Lightning: a method that cannot give loaders now shows None
                shown = "None"
            lines.append(f"{{{title}: {shown}}}")
        return os.linesep.join(lines)


def datamodule_base(datamodule: Any) -> type | None:
    """The class ``datamodule``'s hooks override: GPUlayer's ``DataModule``, or Lightning's ``LightningDataModule`` for
    one another library built on it (PyTorch Geometric's ``LightningDataset``) or Lightning's ``from_datasets`` made,
    which the Trainer takes as it is; None for anything else."""
    if isinstance(datamodule, DataModule):
        return DataModule
    return lightning_class(type(datamodule), "LightningDataModule", "core.datamodule")


def datamodule_overrides(datamodule: Any, name: str) -> bool:
    """Whether ``datamodule`` (None: there is none) overrides the hook ``name`` of the class it builds on
    (``datamodule_base``): the rule by which its hook wins over the Module's."""
    base = datamodule_base(datamodule) if datamodule is not None else None
    return base is not None and is_overridden(name, datamodule, base)


def _size(loader: DataLoader) -> str:
    return str(len(loader.dataset)) if isinstance(loader.dataset, Sized) else "NA"
