"""Lightning 2.6's warnings about a likely user bug, given by GPUlayer in the same cases with the same category
and text: validation with a loader but no step, or a step but no loader
(``lightning/pytorch/trainer/configuration_validator.py``); a val/test/predict loader that shuffles
(``lightning/pytorch/trainer/connectors/data_connector.py``); an ``IterableDataset`` with a ``__len__``
(``lightning/pytorch/utilities/data.py``); a ``predict_step`` returning ``None``
(``lightning/pytorch/loops/prediction_loop.py``)."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import gpulayer.trainer as gl

from .conftest import line_fitter, quiet_lightning

_KINDS = ("You passed in a `val_dataloader`", "You defined a `validation_step`", "Your `", "predict returned None")
_ITERABLE = "Your `IterableDataset` has `__len__` defined."


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)


def _fit_warnings(framework, root, with_step: bool, with_loader: bool) -> list[tuple[str, str]]:
    """(category name, message) of this file's warnings that a one-epoch fit gives."""
    is_ours = framework is gl
    base = line_fitter(gl.Module if is_ours else framework.LightningModule)

    class Module(base):
        if with_step:

            def validation_step(self, batch, batch_idx):
                self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    extra = {} if is_ours else {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = framework.Trainer(
        accelerator="cpu", max_epochs=1, default_root_dir=root, logger=False, enable_checkpointing=False, **extra
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Module(), _loader(), _loader() if with_loader else None)
    return [(type(w.message).__name__, str(w.message)) for w in caught if str(w.message).startswith(_KINDS)]


@pytest.mark.parametrize(
    ("with_step", "with_loader", "expected"),
    [
        (
            False,
            True,
            [("UserWarning", "You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop.")],
        ),
        (
            True,
            False,
            [
                (
                    "PossibleUserWarning",
                    "You defined a `validation_step` but have no `val_dataloader`. Skipping val loop.",
                )
            ],
        ),
        (True, True, []),
        (False, False, []),
    ],
    ids=["loader without step", "step without loader", "both", "neither"],
)
def test_validation_with_a_loader_or_a_step_alone_warns_as_in_lightning(tmp_path, with_step, with_loader, expected):
    with warnings.catch_warnings():
        theirs = _fit_warnings(quiet_lightning(), tmp_path / "lightning", with_step, with_loader)
    ours = _fit_warnings(gl, tmp_path / "gpulayer", with_step, with_loader)
    assert theirs == expected
    assert ours == theirs


class _Predictor:
    """Mixed into line_fitter's module: validation, test and predict steps."""

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def test_step(self, batch, batch_idx):
        self.log("test_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])


def _stage_warnings(framework, root, stage: str, shuffle: bool = False, data=None) -> list[tuple[str, str]]:
    is_ours = framework is gl
    base = line_fitter(gl.Module if is_ours else framework.LightningModule)
    module = type("Module", (_Predictor, base), {})()
    extra = {} if is_ours else {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = framework.Trainer(
        accelerator="cpu", max_epochs=1, default_root_dir=root, logger=False, enable_checkpointing=False, **extra
    )
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1)) if data is None else data
    loader = DataLoader(data, batch_size=4, shuffle=shuffle)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if stage == "fit":
            trainer.fit(module, loader if data is not None else _loader(), loader)
        else:
            getattr(trainer, stage)(module, loader)
    return [(type(w.message).__name__, str(w.message)) for w in caught if str(w.message).startswith(_KINDS)]


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in order"])
@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
def test_a_shuffling_evaluation_loader_warns_as_in_lightning(tmp_path, stage, shuffle):
    with warnings.catch_warnings():
        theirs = _stage_warnings(quiet_lightning(), tmp_path / "lightning", stage, shuffle)
    ours = _stage_warnings(gl, tmp_path / "gpulayer", stage, shuffle)
    assert ours == theirs
    prefix = {"fit": "val", "validate": "val"}.get(stage, stage)
    assert theirs == (
        [
            (
                "PossibleUserWarning",
                f"Your `{prefix}_dataloader`'s sampler has shuffling enabled, it is strongly recommended that you "
                "turn shuffling off for val/test dataloaders.",
            )
        ]
        if shuffle
        else []
    )


class _Stream(IterableDataset):
    """8 samples, with a ``__len__``."""

    def __iter__(self):
        return iter(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)))

    def __len__(self):
        return 8


class _Endless(_Stream):
    """The same samples, without a length."""

    __len__ = None


@pytest.mark.parametrize("sized", [True, False], ids=["with __len__", "without"])
@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
def test_an_iterable_dataset_with_a_length_warns_as_in_lightning(tmp_path, stage, sized):
    data = _Stream() if sized else _Endless()
    with warnings.catch_warnings():
        theirs = _stage_warnings(quiet_lightning(), tmp_path / "lightning", stage, data=data)
    ours = _stage_warnings(gl, tmp_path / "gpulayer", stage, data=data)
    assert ours == theirs
    assert theirs == [
        (
            "UserWarning",
            _ITERABLE + " In combination with multi-process data loading (when num_workers > 1), "
            "`__len__` could be inaccurate if each worker is not configured independently to avoid having "
            "duplicate data.",
        )
    ] * ((2 if stage == "fit" else 1) if sized else 0)


def test_a_predict_step_returning_none_warns_once_per_trainer_as_in_lightning(tmp_path):
    found = {}
    for name in ("lightning", "gpulayer"):
        with warnings.catch_warnings():
            framework = quiet_lightning() if name == "lightning" else gl
        is_ours = framework is gl
        base = type("Base", (_Predictor, line_fitter(gl.Module if is_ours else framework.LightningModule)), {})
        module = type("Module", (base,), {"predict_step": lambda self, batch, batch_idx: None})()
        extra = {} if is_ours else {"enable_progress_bar": False, "enable_model_summary": False}
        trainer = framework.Trainer(accelerator="cpu", default_root_dir=tmp_path / name, logger=False, **extra)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):  # two batches each, twice: one warning
                trainer.predict(module, _loader())
        found[name] = [(type(w.message).__name__, str(w.message)) for w in caught if str(w.message).startswith(_KINDS)]
    assert found["gpulayer"] == found["lightning"]
    assert found["lightning"] == [("UserWarning", "predict returned None if it was on purpose, ignore this warning...")]


_EVAL_MODE = "Found "


def _eval_mode_warnings(framework, root, in_eval: str) -> list[tuple[str, str]]:
    """A fit whose module, or only its layer, was left in eval mode (``in_eval``: "module", "layer" or "none")."""
    is_ours = framework is gl
    module = line_fitter(gl.Module if is_ours else framework.LightningModule)()
    {"module": module, "layer": module.layer, "none": torch.nn.Identity()}[in_eval].eval()
    extra = {} if is_ours else {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = framework.Trainer(
        accelerator="cpu", max_epochs=1, default_root_dir=root, logger=False, enable_checkpointing=False, **extra
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, _loader())
    return [(type(w.message).__name__, str(w.message)) for w in caught if str(w.message).startswith(_EVAL_MODE)]


@pytest.mark.parametrize(("in_eval", "count"), [("module", 2), ("layer", 1), ("none", 0)])
def test_modules_in_eval_mode_when_training_starts_warn_as_in_lightning(tmp_path, in_eval, count):
    with warnings.catch_warnings():
        theirs = _eval_mode_warnings(quiet_lightning(), tmp_path / "lightning", in_eval)
    ours = _eval_mode_warnings(gl, tmp_path / "gpulayer", in_eval)
    expected = (
        "PossibleUserWarning",
        f"Found {count} module(s) in eval mode at the start of training. This may lead to unexpected behavior "
        "during training. If this is intentional, you can ignore this warning.",
    )
    assert theirs == ([expected] if count else [])
    assert ours == theirs


def _empty_checkpoint_warnings(framework, path) -> list[tuple[str, str]]:
    is_ours = framework is gl
    base = gl.Module if is_ours else framework.LightningModule
    stateless = type("Stateless", (base,), {})
    torch.save({"state_dict": {}, "hyper_parameters": {}, "pytorch-lightning_version": "2.6.6"}, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stateless.load_from_checkpoint(str(path))
    return [(type(w.message).__name__, str(w.message)) for w in caught if "contains no parameters" in str(w.message)]


def test_a_checkpoint_with_an_empty_state_dict_warns_as_in_lightning(tmp_path):
    with warnings.catch_warnings():
        theirs = _empty_checkpoint_warnings(quiet_lightning(), tmp_path / "lightning.ckpt")
    ours = _empty_checkpoint_warnings(gl, tmp_path / "gpulayer.ckpt")
    assert theirs == [
        ("UserWarning", f"The state dict in {str(tmp_path / 'lightning.ckpt')!r} contains no parameters.")
    ]
    assert ours == [("UserWarning", f"The state dict in {str(tmp_path / 'gpulayer.ckpt')!r} contains no parameters.")]
