"""Hook order of a recording Callback and Module: every `Trainer` entry point, as Lightning 2.6 calls them."""

import functools
import inspect
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning


def test_fit_hook_order_matches_the_reference_trace(differential):
    """2 epochs x 2 batches, 1 val batch, 1 sanity batch: 164 calls (checkpointing is off: no checkpoint hooks)."""
    both = differential(trainer=dict(max_epochs=2, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1))
    assert len(both.lightning.hooks["fit"]) == 164


def test_fit_then_validate_test_predict(differential):
    """Each entry point on the same Trainer after fit: hooks, counters, metrics and return values."""
    both = differential(stages=("fit", "validate", "test", "predict"))
    assert both.lightning.counters == {stage: (6, 2) for stage in ("fit", "validate", "test", "predict")}


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_standalone_evaluation_entry_point(differential, stage):
    """validate/test/predict on a fresh Trainer: no fit hooks, no sanity check, no configure_optimizers."""
    both = differential(stages=(stage,))
    assert not any("configure_optimizers" in hook for hook in both.lightning.hooks[stage])


def test_fit_without_validation(differential):
    """No validation_step and no val loader: no sanity check, no validation hooks."""
    differential(val_sizes=())


def test_loaders_passed_to_the_entry_points(differential):
    """Loaders given as fit/validate/test/predict arguments instead of module hooks."""
    differential(data_source="arguments", stages=("fit", "validate", "test", "predict"))


def test_fit_twice_on_the_same_trainer_does_nothing_the_second_time(differential):
    """Progress is not reset (Lightning's ``_FitLoop.done``), so a second fit after max_epochs runs no epoch (and no
    on_train_start)."""
    both = differential(stages=("fit", "fit"))
    assert both.lightning.counters["fit"] == (6, 2)


# Lightning's tests_pytorch/models/test_hooks.py (2.6) records every hook through wrappers of the hooks assigned on
# the instance, ``setattr(self, name, functools.update_wrapper(functools.partial(call, name, hook), hook))``.
def _simple(value):
    """A recorded argument, the same under both frameworks: plain values as they are, objects by kind."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_simple(item) for item in value]
    if isinstance(value, dict):
        return {key: _simple(item) for key, item in value.items()}
    kinds = (torch.Tensor, torch.optim.Optimizer, torch.nn.Module)
    return next(
        (kind.__name__ for kind in kinds if isinstance(value, kind)), "callable" if callable(value) else "object"
    )


def _record_calls(instance, names, calls, prefix):
    def call(name, hook, *args, **kwargs):
        out = hook(*args, **kwargs)
        calls.append((prefix + name, _simple(args), _simple(kwargs)))
        return out

    for name in names:
        hook = getattr(instance, name, None)  # GPUlayer has no configure_sharded_model: a call to it would show
        if hook is None:
            continue
        setattr(instance, name, functools.update_wrapper(functools.partial(call, name, hook), hook))


def _public_functions(cls):
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def _lightnings_hook_names(pl):
    """The module's and the callback's hooks that Lightning's ``HookedModel`` and ``HookedCallback`` wrap."""
    module_hooks = _public_functions(pl.LightningModule) - {"optimizers", "log", "log_dict"}
    module_hooks -= _public_functions(torch.nn.Module) - {"forward", "zero_grad", "train"}
    return sorted(module_hooks), sorted(_public_functions(pl.Callback))


def _hooked_run(framework, names, stage, tmp_path):
    """``stage`` run by a module and a callback whose hooks ``names`` are all wrapped on the instance: the calls."""
    lightning = framework is not gl
    module_base, callback_base = (
        (framework.LightningModule, framework.Callback) if lightning else (gl.Module, gl.Callback)
    )
    module_hooks, callback_hooks = names
    calls = []

    class Recorded(module_base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            _record_calls(self, module_hooks, calls, "")

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

        test_step = validation_step

        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def configure_model(self): ...  # overridden so that it is called, as in Lightning's HookedModel

        def prepare_data(self): ...

        def train_dataloader(self):
            generator = torch.Generator().manual_seed(0)
            data = TensorDataset(torch.randn(4, 2, generator=generator), torch.randn(4, 1, generator=generator))
            return DataLoader(data, batch_size=2)

        val_dataloader = test_dataloader = predict_dataloader = train_dataloader

    class RecordedCallback(callback_base):
        def __init__(self):
            _record_calls(self, callback_hooks, calls, "Callback.")

    torch.manual_seed(0)
    model = Recorded()
    extra = {"enable_progress_bar": False, "enable_model_summary": False} if lightning else {}
    trainer = framework.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, callbacks=[RecordedCallback()],
        num_sanity_val_steps=1, default_root_dir=tmp_path, **extra,
    )  # fmt: skip
    calls.clear()  # what construction called
    getattr(trainer, stage)(model)
    return calls


@pytest.mark.parametrize(
    "stage, loop", [("fit", "train"), ("validate", "validation"), ("test", "test"), ("predict", "predict")]
)
def test_hooks_wrapped_on_the_instance_are_all_called_as_in_lightnings_test_hooks(stage, loop, tmp_path):
    """Every hook of the module and of a callback, each replaced on the instance by a wrapper of the inherited one,
    is called with Lightning's arguments in Lightning's order (fit: 2 batches, validation and a sanity check)."""
    with warnings.catch_warnings():
        pl = quiet_lightning()
        names = _lightnings_hook_names(pl)
        expected = _hooked_run(pl, names, stage, tmp_path / "lightning")
    actual = _hooked_run(gl, names, stage, tmp_path / "gpulayer")
    assert [call[0] for call in actual] == [call[0] for call in expected]  # the order first: a readable diff
    assert actual == expected
    assert [call[0] for call in expected].count(f"Callback.on_{loop}_batch_end") == 2
