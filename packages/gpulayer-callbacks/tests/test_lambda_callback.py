"""LambdaCallback against Lightning 2.6.6 (``lightning/pytorch/callbacks/lambda_function.py``): the same keyword
arguments, and a function given for every hook is called at the same points with the same arguments under both
frameworks, through fit, a checkpoint saved and resumed, validate, test, predict and an exception."""

import inspect
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.callbacks import LambdaCallback

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import LambdaCallback as LightningLambdaCallback

FRAMEWORKS = frameworks(LambdaCallback=(LightningLambdaCallback, LambdaCallback))
HOOKS = [name for name in inspect.signature(LightningLambdaCallback.__init__).parameters if name != "self"]


def _simple(value):
    """An argument as both frameworks pass it: plain values as they are, objects by kind."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_simple(item) for item in value]
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    kinds = (torch.Tensor, torch.optim.Optimizer, torch.nn.Module, dict)
    return next((kind.__name__ for kind in kinds if isinstance(value, kind)), "object")


def _module(framework, fail_at=None):
    class Regressor(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(2, 1)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            if self.global_step == fail_at:
                raise RuntimeError(f"failed at step {fail_at}")
            return torch.nn.functional.mse_loss(self(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

        test_step = validation_step

        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regressor()


def _loader():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4, 2, generator=generator), torch.randn(4, 1, generator=generator))
    return DataLoader(data, batch_size=2)


def _calls(name, root):
    """Every hook given as a function that records its call: fit, save, resumed fit, validate, test, predict, and a
    fit that fails."""
    framework = FRAMEWORKS[name]
    calls = []

    def recorder(hook):
        return lambda *args, **kwargs: calls.append((hook, _simple(args), _simple(sorted(kwargs.items()))))

    def trainer(**options):
        callback = framework.LambdaCallback(**{hook: recorder(hook) for hook in HOOKS})
        defaults = {"accelerator": "cpu", "max_epochs": 1, "logger": False, "enable_checkpointing": False}
        defaults |= {"num_sanity_val_steps": 1, "default_root_dir": root, "callbacks": [callback]}
        return framework.Trainer(**defaults | framework.options | options)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = trainer()
        first.fit(_module(framework), _loader(), _loader())
        first.save_checkpoint(root / "saved.ckpt")
        resumed = trainer(max_epochs=2)
        model = _module(framework)
        resumed.fit(model, _loader(), _loader(), ckpt_path=root / "saved.ckpt")
        resumed.validate(model, _loader(), verbose=False)
        resumed.test(model, _loader(), verbose=False)
        resumed.predict(model, _loader())
        with pytest.raises(RuntimeError, match="failed at step 1"):
            trainer().fit(_module(framework, fail_at=1), _loader())
    return calls


def test_the_keyword_arguments_are_lightnings():
    theirs = inspect.signature(LightningLambdaCallback.__init__).parameters
    ours = inspect.signature(LambdaCallback.__init__).parameters
    assert [(p.name, p.default) for p in ours.values()] == [(p.name, p.default) for p in theirs.values()]


def test_every_hook_given_is_called_as_lightning_calls_it(tmp_path):
    expected = _calls("lightning", tmp_path / "lightning")
    actual = _calls("gpulayer", tmp_path / "gpulayer")
    assert [call[0] for call in actual] == [call[0] for call in expected]  # the order first: a readable diff
    assert actual == expected
    assert {call[0] for call in actual} == set(HOOKS)  # every hook was called at least once
    assert ("on_exception", ["object", "Module", "RuntimeError: failed at step 1"], []) in actual


def test_hooks_not_given_are_not_set():
    callback = LambdaCallback(on_fit_start=print)
    assert vars(callback) == {"on_fit_start": print}
