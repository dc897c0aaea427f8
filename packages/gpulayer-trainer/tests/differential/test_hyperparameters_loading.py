"""Hyperparameters through a run and back: ``load_from_checkpoint`` rebuilding ``**kwargs`` modules, unpicklable
arguments dropped when a run starts, OmegaConf configs keeping their type, ``strict`` against ``strict_loading``;
each compared with Lightning 2.6 on the same classes."""

import functools
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning

FRAMEWORKS = ("lightning", "gpulayer")


def _base(framework):
    if framework == "gpulayer":
        return gl.Module
    with warnings.catch_warnings():
        return quiet_lightning().LightningModule


def _trainer(framework, root):
    if framework == "gpulayer":
        return gl.Trainer(
            accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, default_root_dir=root
        )
    with warnings.catch_warnings():
        pl = quiet_lightning()
        return pl.Trainer(
            accelerator="cpu",
            max_steps=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )


def _steps(cls):
    """``cls`` with a training step on its ``layer`` (4 inputs) and SGD."""

    class Trained(cls):
        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]).sum(1, keepdim=True), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    Trained.__name__ = Trained.__qualname__ = cls.__name__
    return Trained


def _fit_and_save(framework, model, path):
    """Fit ``model`` one step, save it to ``path`` and return the warnings the run gave."""
    loader = DataLoader(TensorDataset(torch.randn(4, 4), torch.randn(4, 1)), batch_size=2)
    trainer = _trainer(framework, path.parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if framework == "lightning":
            quiet_lightning()
            warnings.simplefilter("always", UserWarning)
        trainer.fit(model, loader)
        trainer.save_checkpoint(path)
    return [str(w.message) for w in caught]


def _received(**arguments):
    return {key: value for key, value in arguments.items() if key != "self"}


# ---- 1. ``**kwargs`` modules: self, *args and **kwargs are no argument names ----------------------------------------
def kwargs_module(base):
    class KwargsModule(base):
        def __init__(self, lr=1e-3, **kwargs):
            super().__init__()
            self.save_hyperparameters()
            self.received = {"lr": lr, **kwargs}
            self.layer = torch.nn.Linear(4, kwargs.get("width", 2))

    return _steps(KwargsModule), {"lr": 0.5, "width": 3}


def kwargs_passed_on(base):
    class Parent(base):
        def __init__(self, width=2, **kwargs):
            super().__init__(**kwargs)
            self.layer = torch.nn.Linear(4, width)

    class Child(Parent):
        def __init__(self, lr=1e-3, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.save_hyperparameters()
            self.received = {"lr": lr, **kwargs}

    return _steps(Child), {"lr": 0.5, "width": 3}


def kwargs_through_a_mixin(base):
    class Mixin:
        def __init__(self, *args, depth=1, **kwargs):
            super().__init__(*args, **kwargs)
            self.depth = depth

    class Mixed(Mixin, base):
        def __init__(self, lr=1e-3, **kwargs):
            super().__init__(**kwargs)
            self.save_hyperparameters()
            self.received = {"lr": lr, **kwargs, "depth": self.depth}
            self.layer = torch.nn.Linear(4, 2)

    return _steps(Mixed), {"lr": 0.5, "depth": 3}


def kwargs_in_a_decorated_init(base):
    def logged(init):
        @functools.wraps(init)
        def wrapper(self, *args, **kwargs):
            init(self, *args, **kwargs)

        return wrapper

    class Decorated(base):
        @logged
        def __init__(self, lr=1e-3, **kwargs):
            super().__init__()
            self.save_hyperparameters()
            self.received = {"lr": lr, **kwargs}
            self.layer = torch.nn.Linear(4, kwargs.get("width", 2))

    return _steps(Decorated), {"lr": 0.5, "width": 3}


@pytest.mark.parametrize(
    "case",
    [kwargs_module, kwargs_passed_on, kwargs_through_a_mixin, kwargs_in_a_decorated_init],
    ids=lambda c: c.__name__,
)
def test_a_kwargs_module_loads_back_with_its_arguments_as_in_lightning(tmp_path, case):
    loaded = {}
    for framework in FRAMEWORKS:
        cls, arguments = case(_base(framework))
        path = tmp_path / f"{framework}.ckpt"
        trained = cls(**arguments)
        _fit_and_save(framework, trained, path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls.load_from_checkpoint(path, lr=0.25)
        torch.testing.assert_close(model.state_dict(), trained.state_dict(), rtol=0, atol=0)
        loaded[framework] = {"received": model.received, "hparams": dict(model.hparams)}
    assert loaded["gpulayer"] == loaded["lightning"]
    assert loaded["gpulayer"]["received"] == {**arguments, "lr": 0.25}


# ---- 2. an argument no checkpoint can pickle leaves hparams when a run starts ---------------------------------------
def test_an_unpicklable_argument_is_dropped_with_lightnings_warning_and_the_checkpoint_saves(tmp_path):
    results = {}
    for framework in FRAMEWORKS:

        class WithAFunction(_base(framework)):
            def __init__(self, activation, width=2):
                super().__init__()
                self.save_hyperparameters()
                self.layer = torch.nn.Linear(4, width)

        model = _steps(WithAFunction)(lambda x: x * 2)
        caught = _fit_and_save(framework, model, tmp_path / f"{framework}.ckpt")
        checkpoint = torch.load(tmp_path / f"{framework}.ckpt", weights_only=False)
        results[framework] = {
            "warnings": [message for message in caught if "pickled" in message],
            "hparams": dict(model.hparams),
            "hparams_initial": list(model.hparams_initial),
            "saved": checkpoint["hyper_parameters"],
        }
    assert results["gpulayer"] == results["lightning"]
    assert results["gpulayer"]["hparams"] == {"width": 2}
    assert results["gpulayer"]["warnings"] == [
        "Attribute 'activation' removed from hparams because it cannot be pickled. You can suppress this warning by"
        " setting `self.save_hyperparameters(ignore=['activation'])`."
    ]


# ---- 3. an OmegaConf config comes back as one -----------------------------------------------------------------------
def test_an_omegaconf_config_loads_back_as_its_own_type_as_in_lightning(tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    results = {}
    for framework in FRAMEWORKS:

        class Configured(_base(framework)):
            def __init__(self, cfg):
                super().__init__()
                self.save_hyperparameters(cfg)
                self.layer = torch.nn.Linear(4, cfg.width)

        cls = _steps(Configured)
        path = tmp_path / f"{framework}.ckpt"
        _fit_and_save(framework, cls(omegaconf.OmegaConf.create({"width": 3, "optim": {"lr": 0.1}})), path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls.load_from_checkpoint(path, weights_only=False)
        checkpoint = torch.load(path, weights_only=False)
        results[framework] = {
            "type": type(model.hparams),
            "yaml": omegaconf.OmegaConf.to_yaml(model.hparams),
            "saved_type": checkpoint["hparams_type"],
            "hparams_name": checkpoint["hparams_name"],
        }
    assert results["gpulayer"] == results["lightning"]
    assert results["gpulayer"]["type"] is omegaconf.DictConfig


# ---- 4. strict against strict_loading -------------------------------------------------------------------------------
STRICT_LOADING = {
    "unset": lambda model: None,
    "True": lambda model: setattr(model, "strict_loading", True),
    "False": lambda model: setattr(model, "strict_loading", False),
    "None": lambda model: setattr(model, "strict_loading", None),
}


def _outcome(cls, path, strict):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = cls.load_from_checkpoint(path, strict=strict)
        except (ValueError, RuntimeError) as error:
            return type(error).__name__, str(error)
    return "loaded", model.strict_loading, [str(w.message) for w in caught if "Found keys" in str(w.message)]


@pytest.mark.parametrize("setting", [*STRICT_LOADING, "class attribute None"])
def test_strict_against_strict_loading_as_in_lightning(tmp_path, setting):
    path = tmp_path / "lightning.ckpt"
    outcomes = {}
    for framework in FRAMEWORKS:

        class Wider(_base(framework)):
            if setting == "class attribute None":
                strict_loading = None

            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 2)
                self.extra = torch.nn.Linear(1, 1)
                STRICT_LOADING.get(setting, STRICT_LOADING["unset"])(self)

        if framework == "lightning":

            class Saved(_base(framework)):
                def __init__(self):
                    super().__init__()
                    self.layer = torch.nn.Linear(4, 2)

            _fit_and_save(framework, _steps(Saved)(), path)
        outcomes[framework] = [_outcome(Wider, path, strict) for strict in (None, True, False)]
    assert outcomes["gpulayer"] == outcomes["lightning"]
    kinds = [outcome[0] for outcome in outcomes["gpulayer"]]
    assert (
        kinds
        == {
            "unset": ["RuntimeError", "RuntimeError", "loaded"],
            "True": ["RuntimeError", "RuntimeError", "ValueError"],
            "False": ["loaded", "ValueError", "loaded"],
            "None": ["RuntimeError", "RuntimeError", "loaded"],
            "class attribute None": ["loaded", "RuntimeError", "loaded"],
        }[setting]
    )


def _legacy_model_class(base):
    class Legacy(base):
        def __init__(self, width=2, depth=1, scale=1.0):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(4, width)

    return Legacy


@pytest.mark.parametrize(
    "saved",
    [
        {"hparams": {"width": 3, "scale": 2.0}},  # Lightning 0.x's key
        {"module_arguments": {"width": 5}},  # Lightning 0.9's
        {"hparams": {"width": 3, "depth": 4}, "module_arguments": {"width": 5}, "hyper_parameters": {"depth": 6}},
    ],
    ids=["hparams", "module_arguments", "both, the current key winning"],
)
def test_hyperparameters_under_lightnings_legacy_keys_build_the_module_as_in_lightning(tmp_path, saved):
    """A checkpoint of an old Lightning release keeps a module's hyperparameters under ``hparams`` or
    ``module_arguments``; Lightning 2.6 still builds the module from them (the current key's values win)."""
    built = {}
    for framework in FRAMEWORKS:
        cls = _legacy_model_class(_base(framework))
        width = {**saved.get("hparams", {}), **saved.get("module_arguments", {}), **saved.get("hyper_parameters", {})}
        layer = torch.nn.Linear(4, width.get("width", 2))
        path = tmp_path / f"{framework}.ckpt"
        state = {f"layer.{k}": v for k, v in layer.state_dict().items()}
        torch.save({"state_dict": state, "pytorch-lightning_version": "2.6.6", **saved}, path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls.load_from_checkpoint(path, weights_only=False)
        built[framework] = (dict(model.hparams), model.layer.out_features)
    assert built["gpulayer"] == built["lightning"]
