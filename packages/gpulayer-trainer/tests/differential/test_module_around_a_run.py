"""The module around a run, compared with Lightning 2.6: a trained module and its Trainer pickle (the module without
its Trainer, ``LightningModule.__getstate__``), every entry point starts without gradients (``Trainer._run_stage``),
and a hook set to None is skipped (``_call_lightning_module_hook``, ``_call_callback_hooks``)."""

import copy
import io
import pickle
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks

from .conftest import quiet_lightning


def _data():
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator))


with warnings.catch_warnings():
    pl = quiet_lightning()


class _Regressor:
    """The module's body, on either framework's base class (below: module-level classes, so that they pickle)."""

    def __init__(self, manual=False):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.automatic_optimization = not manual
        self.seen = []  # the mode each evaluation step ran in

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        return loss

    def validation_step(self, batch, batch_idx):
        self.seen.append(("validation_step", self.training))
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def test_step(self, batch, batch_idx):
        self.seen.append(("test_step", self.training))
        self.log("test_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def predict_step(self, batch, batch_idx):
        self.seen.append(("predict_step", self.training))
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _LightningRegressor(_Regressor, pl.LightningModule):
    pass


class _GpulayerRegressor(_Regressor, gl.Module):
    pass


class _PicklesTheTrainer:
    """Mixed into either framework's Callback: what pickling the Trainer gives in the middle of fit."""

    def on_train_epoch_end(self, trainer, pl_module):
        self.mid_fit = _trainer_copy(trainer)


class _LightningPickles(_PicklesTheTrainer, pl.Callback):
    pass


class _GpulayerPickles(_PicklesTheTrainer, gl.Callback):
    pass


def _frameworks():
    """(name, Trainer, Module class, Callback, the Trainer's extra options) for Lightning, then GPUlayer."""
    quiet = {"enable_progress_bar": False, "enable_model_summary": False}
    return [
        ("lightning", pl.Trainer, _LightningRegressor, pl.Callback, quiet),
        ("gpulayer", gl.Trainer, _GpulayerRegressor, gl.Callback, {}),
    ]


def _trainer(trainer_class, extra, tmp_path, **options):
    return trainer_class(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
        **extra, **options,
    )  # fmt: skip


def _unpickled(obj):
    """What ``pickle`` gives back, or the error's type."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning warns as it pickles a Trainer after test
            return pickle.loads(pickle.dumps(obj))
    except Exception as error:  # the outcome is compared
        return type(error).__name__


def _trainer_copy(trainer):
    """What a pickled Trainer brings back: its module (detached), step, metrics and state."""
    copied = _unpickled(trainer)
    if isinstance(copied, str):
        return copied
    module = copied.lightning_module
    return (
        isinstance(module, _Regressor), module._trainer, copied.global_step, sorted(copied.callback_metrics),
        copied.state.fn.value, None if copied.state.stage is None else copied.state.stage.value, len(copied.optimizers),
    )  # fmt: skip


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_trained_module_and_its_trainer_pickle_as_in_lightning(tmp_path, manual):
    outcomes = {}
    for name, trainer_class, module_class, _, extra in _frameworks():
        callback = _LightningPickles() if name == "lightning" else _GpulayerPickles()
        torch.manual_seed(0)
        model = module_class(manual)
        trainer = _trainer(trainer_class, extra, tmp_path / name, callbacks=[callback])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, DataLoader(_data(), batch_size=4), DataLoader(_data(), batch_size=4))
            after_fit = _trainer_copy(trainer)
            trainer.test(model, DataLoader(_data(), batch_size=4))
        saved = io.BytesIO()
        torch.save(model, saved)
        saved.seek(0)
        loaded = torch.load(saved, weights_only=False)
        deep = copy.deepcopy(model)
        outcomes[name] = {
            "mid fit": callback.mid_fit,
            "after fit": after_fit,
            "after test": _trainer_copy(trainer),
            "module": [(m._trainer, m.layer.weight.tolist()) for m in (_unpickled(model), loaded, deep)],
            "still attached": model._trainer is trainer,
        }
    assert outcomes["gpulayer"] == outcomes["lightning"]
    assert outcomes["gpulayer"]["module"][0][0] is None and not isinstance(outcomes["gpulayer"]["after fit"], str)


def _fit_and_return_the_module(runtime):
    torch.manual_seed(0)
    model = _GpulayerRegressor()
    trainer = gl.Trainer(accelerator="cpu", devices=2, max_epochs=1, logger=False, enable_checkpointing=False)
    trainer.fit(model, DataLoader(_data(), batch_size=2))
    return model  # through the harness's multiprocessing queue: pickled


@pytest.mark.multiprocess
def test_a_module_trained_on_two_ranks_pickles_back_to_the_parent():
    first, second = run_ranks(_fit_and_return_the_module, world_size=2, timeout=90)
    assert first._trainer is None and second._trainer is None
    torch.testing.assert_close(first.layer.weight, second.layer.weight, rtol=0, atol=0)  # DDP kept them equal


class _RecordsGradients:
    """Mixed into either framework's Callback: whether the module held gradients as each stage's loop began."""

    def __init__(self):
        self.had_gradients = []

    def _record(self, pl_module):
        self.had_gradients.append(any(p.grad is not None for p in pl_module.parameters()))

    def on_train_start(self, trainer, pl_module):
        self._record(pl_module)

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._record(pl_module)

    def on_test_start(self, trainer, pl_module):
        self._record(pl_module)

    def on_predict_start(self, trainer, pl_module):
        self._record(pl_module)


def _leave_gradients(model):
    model(torch.ones(2, 4)).sum().backward()


def test_every_entry_point_starts_without_the_gradients_left_from_before(tmp_path):
    outcomes = {}
    for name, trainer_class, module_class, callback_base, extra in _frameworks():
        recorder = type("Recorder", (_RecordsGradients, callback_base), {})()
        torch.manual_seed(0)
        model = module_class()
        trainer = _trainer(trainer_class, extra, tmp_path / name, callbacks=[recorder], num_sanity_val_steps=0)
        loader = DataLoader(_data(), batch_size=4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for stage in ("fit", "validate", "test", "predict"):
                _leave_gradients(model)
                getattr(trainer, stage)(model, loader)
        outcomes[name] = (recorder.had_gradients, [p.grad for p in model.parameters()])
    assert outcomes["gpulayer"] == outcomes["lightning"] == ([False, False, False, False], [None, None])


# The hooks Lightning calls through _call_lightning_module_hook (or _call_callback_hooks, or
# _call_lightning_datamodule_hook) when set to None: skipped, with whatever the default would have done undone
# (no eval() for on_validation_model_eval, no zero_grad for optimizer_zero_grad).
_MODULE_HOOKS_SKIPPED = (
    "configure_callbacks", "prepare_data", "setup", "configure_model", "teardown", "on_fit_start",
    "on_validation_model_eval", "on_validation_model_train", "on_validation_model_zero_grad", "on_test_model_eval",
    "on_test_model_train", "on_predict_model_eval", "optimizer_zero_grad", "on_train_batch_start",
    "on_save_checkpoint", "lr_scheduler_step", "configure_gradient_clipping",
)  # fmt: skip


def _stages_with(tmp_path, trainer_class, module_class, callback_base, extra, module_hook=None, callback_hook=None):
    """Fit, validate, test and predict with one hook set to None; what ran, the weights, and the errors."""

    callback = type("Plain", (callback_base,), {})()
    if callback_hook is not None:
        setattr(callback, callback_hook, None)
    torch.manual_seed(0)
    model = module_class()
    if module_hook is not None:
        setattr(model, module_hook, None)
    trainer = _trainer(trainer_class, extra, tmp_path, callbacks=[callback], gradient_clip_val=0.5)
    outcome = []
    loader = DataLoader(_data(), batch_size=4)
    for stage, loaders in (
        ("fit", (loader, loader)),
        ("validate", (loader,)),
        ("test", (loader,)),
        ("predict", (loader,)),
    ):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                getattr(trainer, stage)(model, *loaders)
            outcome.append((stage, "ok"))
        except Exception as error:  # the outcome is compared
            outcome.append((stage, type(error).__name__))
    return outcome, model.seen, model.training, [round(v, 6) for v in model.layer.weight.flatten().tolist()]


def test_a_hook_set_to_none_is_skipped_as_in_lightning(tmp_path):
    outcomes: dict[str, list] = {}
    for name, *framework in _frameworks():
        runs = [_stages_with(tmp_path / name, *framework, module_hook=hook) for hook in _MODULE_HOOKS_SKIPPED]
        runs += [_stages_with(tmp_path / name, *framework, callback_hook=hook) for hook in ("setup", "teardown")]
        trainer_class, module_class, *rest = framework
        set_on_the_class = type("SetOnTheClass", (module_class,), dict.fromkeys(("setup", "on_test_model_eval")))
        runs.append(_stages_with(tmp_path / name, trainer_class, set_on_the_class, *rest))
        outcomes[name] = runs
    assert outcomes["gpulayer"] == outcomes["lightning"]
    assert all(stage == "ok" for outcome, *_ in outcomes["gpulayer"] for _, stage in outcome)


def test_a_callback_on_exception_or_a_datamodule_hook_set_to_none_is_skipped_as_in_lightning(tmp_path):
    outcomes = {}
    for name, trainer_class, module_class, callback_base, extra in _frameworks():
        data_module = (pl.LightningDataModule if name == "lightning" else gl.DataModule).from_datasets(
            train_dataset=_data(), batch_size=4
        )
        for hook in ("setup", "teardown", "on_exception"):
            setattr(data_module, hook, None)
        callback = callback_base()
        callback.on_exception = None
        model = module_class()
        model.on_train_start = lambda: 1 / 0
        trainer = _trainer(trainer_class, extra, tmp_path / name, callbacks=[callback])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ZeroDivisionError):
                trainer.fit(model, datamodule=data_module)
        outcomes[name] = trainer.state.status.value
    assert outcomes["gpulayer"] == outcomes["lightning"] == "interrupted"
