"""WeightAveraging and EMAWeightAveraging against Lightning 2.6.6 (``lightning/pytorch/callbacks/weight_averaging.py``):
the same run under both frameworks gives the same weights after fit (the averaged ones), the same validation metrics
(computed with the averaged weights), the same averaged copy, the same checkpoint entries tensor for tensor, the same
resume, and the same refusals."""

import warnings
from pathlib import Path

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging
from gpulayer.runtime.testing import run_ranks

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import EMAWeightAveraging as LightningEMA
    from lightning.pytorch.callbacks import WeightAveraging as LightningAveraging

FRAMEWORKS = frameworks(EMA=(LightningEMA, EMAWeightAveraging), Averaging=(LightningAveraging, WeightAveraging))
CHECKPOINT_ENTRIES = ("state_dict", "current_model_state", "averaging_state")


def _module(framework, batch_norm=False):
    class Regressor(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            norm = [torch.nn.BatchNorm1d(8)] if batch_norm else []
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), *norm, torch.nn.ReLU(), torch.nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    return Regressor()


def _probe(framework, save_at, path):
    """Records each validation's ``val_loss``, and saves a checkpoint at the end of the epoch ``save_at``."""

    class Probe(framework.Callback):
        def __init__(self):
            self.validations = []

        def on_validation_end(self, trainer, pl_module):
            self.validations.append((trainer.sanity_checking, trainer.callback_metrics["val_loss"].item()))

        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == save_at:
                trainer.save_checkpoint(path)

    return Probe()


def _loader(samples, seed):
    generator = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))
    return DataLoader(data, batch_size=2)


def _plain(state):
    """A state dict as exact Python values: tensors as (dtype, nested lists)."""
    return {
        key: (str(value.dtype), value.tolist()) if torch.is_tensor(value) else value for key, value in state.items()
    }


def _fit(name, root, make_callback, *, batch_norm=False, trainer=None, ckpt_path=None, save_at=0, extra=None):
    framework = FRAMEWORKS[name]
    folder = Path(root) / name
    saved = folder / "saved.ckpt"
    callback, probe = make_callback(framework), _probe(framework, save_at, saved)
    callbacks = [callback, probe] + ([extra(framework)] if extra else [])
    model = _module(framework, batch_norm)
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 3,
        "logger": False,
        "enable_checkpointing": False,
        "default_root_dir": folder,
        "callbacks": callbacks,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = framework.Trainer(**options | framework.options | (trainer or {}))
        run.fit(model, _loader(12, 0), _loader(4, 1), ckpt_path=ckpt_path)
    result = {
        "global_step": run.global_step,
        "weights": _plain(model.state_dict()),
        "averaged": _plain(callback._average_model.state_dict()),
        "validations": probe.validations,
        "callback_state": callback.state_dict(),
    }
    if saved.exists():
        checkpoint = torch.load(saved, weights_only=True)
        result["checkpoint"] = {key: _plain(checkpoint[key]) for key in CHECKPOINT_ENTRIES}
        result["checkpoint_state"] = checkpoint["callbacks"][callback.state_key]
    return result


def _both(root, make_callback, **kwargs):
    expected = _fit("lightning", root, make_callback, **kwargs)
    actual = _fit("gpulayer", root, make_callback, **kwargs)
    assert actual == expected
    return actual


def _every_other_step(framework):
    """A WeightAveraging subclass with its own avg_fn, updating after odd steps and after the second epoch."""

    class EveryOtherStep(framework.Averaging):
        def __init__(self):
            super().__init__(avg_fn=lambda average, current, count: 0.25 * average + 0.75 * current)

        def should_update(self, step_idx=None, epoch_idx=None):
            return (step_idx is not None and step_idx % 2 == 1) or epoch_idx == 1

    return EveryOtherStep()


@pytest.mark.parametrize(
    "make_callback",
    [
        pytest.param(lambda f: f.EMA(), id="ema-defaults"),
        pytest.param(lambda f: f.EMA(decay=0.7, update_every_n_steps=3, update_starting_at_step=4), id="every-3"),
        pytest.param(lambda f: f.EMA(decay=0.5, update_every_n_steps=0, update_starting_at_epoch=1), id="epochs"),
        pytest.param(lambda f: f.EMA(decay=0.6, update_starting_at_epoch=2), id="steps-and-epochs"),
        pytest.param(_every_other_step, id="subclass-avg-fn"),
        pytest.param(lambda f: f.Averaging(), id="swa"),
    ],
)
def test_the_same_weights_metrics_and_checkpoint_as_lightning(tmp_path, make_callback):
    result = _both(tmp_path, make_callback)
    assert result["global_step"] == 18
    assert set(result["checkpoint"]["averaging_state"]) == {"n_averaged"}


@pytest.mark.parametrize("use_buffers", [True, False])
def test_batch_norm_buffers_averaged_or_copied_as_under_lightning(tmp_path, use_buffers):
    result = _both(tmp_path, lambda f: f.EMA(decay=0.8, use_buffers=use_buffers), batch_norm=True)
    assert "net.1.num_batches_tracked" in result["checkpoint"]["state_dict"]


def test_a_bf16_module_is_averaged_into_its_float32_copy_as_under_lightning(tmp_path):
    """Under ``bf16-true`` the module is converted after ``setup``, where the copy was made: the copy stays float32,
    each update rounding ``(1 - decay) * current`` to bfloat16 as torch's expression does."""
    result = _both(tmp_path, lambda f: f.EMA(decay=0.7), batch_norm=True, trainer={"precision": "bf16-true"})
    assert result["averaged"]["module.net.0.weight"][0] == "torch.float32"
    assert result["weights"]["net.0.weight"][0] == "torch.bfloat16"


def test_accumulated_batches_update_at_the_same_steps(tmp_path):
    result = _both(tmp_path, lambda f: f.EMA(decay=0.7, update_every_n_steps=2), trainer={"accumulate_grad_batches": 4})
    assert result["global_step"] == 6


def _replacer(framework):
    """At each epoch's start, gives the module's tensors new storage: every parameter's ``.data`` (the first
    weight's not contiguous), and BatchNorm's running mean assigned anew."""

    class Replacer(framework.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            for parameter in pl_module.parameters():
                parameter.data = parameter.data.clone()
            first = pl_module.net[0].weight
            first.data = first.data.t().contiguous().t()
            norm = pl_module.net[1]
            norm.running_mean = norm.running_mean.clone()

    return Replacer()


def test_tensors_given_new_storage_during_fit_are_followed_as_under_lightning(tmp_path):
    result = _both(tmp_path, lambda f: f.EMA(decay=0.8), batch_norm=True, extra=_replacer)
    assert result["checkpoint"]["state_dict"] != result["checkpoint"]["current_model_state"]


def test_the_checkpoint_holds_both_weight_sets(tmp_path):
    """The file's ``state_dict`` is the averaged copy's, its ``current_model_state`` the module's at the save."""
    result = _fit("gpulayer", tmp_path, lambda f: f.EMA(decay=0.5), trainer={"max_epochs": 1})
    checkpoint = result["checkpoint"]
    averaged = {key[len("module.") :]: value for key, value in result["averaged"].items() if key != "n_averaged"}
    assert checkpoint["state_dict"] == averaged == result["weights"]
    assert checkpoint["current_model_state"] != checkpoint["state_dict"]
    assert checkpoint["averaging_state"] == {"n_averaged": ("torch.int64", 6)}


def test_a_resumed_run_ends_as_lightnings_and_as_an_unbroken_run(tmp_path):
    """Saved at the end of the second epoch, resumed to the third."""

    def make(framework):
        return framework.EMA(decay=0.6, update_every_n_steps=2)

    quiet = {"num_sanity_val_steps": 0}
    unbroken = _both(tmp_path / "unbroken", make, trainer=quiet, save_at=-1)
    _both(tmp_path / "first", make, trainer={**quiet, "max_epochs": 2}, save_at=1)
    resumed = {
        name: _fit(
            name, tmp_path / "resumed", make, trainer=quiet, save_at=-1,
            ckpt_path=tmp_path / "first" / name / "saved.ckpt",
        )
        for name in FRAMEWORKS
    }  # fmt: skip
    assert resumed["gpulayer"] == resumed["lightning"]
    assert len(resumed["gpulayer"]["validations"]) == 1
    for key in ("weights", "averaged", "callback_state", "global_step"):
        assert resumed["gpulayer"][key] == unbroken[key]


def test_a_checkpoint_without_weight_averaging_starts_both_copies_from_its_weights(tmp_path):
    results = {}
    for name, framework in FRAMEWORKS.items():
        path = tmp_path / f"{name}.ckpt"
        plain = _trainer(framework, tmp_path / name, [])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain.fit(_module(framework), _loader(12, 0))
        plain.save_checkpoint(path)
        callback = framework.EMA(decay=0.5)
        with pytest.warns(UserWarning, match="The checkpoint was not created with WeightAveraging"):
            warnings.filterwarnings("ignore", message="(?!The checkpoint was not created)")
            _trainer(framework, tmp_path / name, [callback], max_epochs=2).fit(
                _module(framework), _loader(12, 0), ckpt_path=path
            )
        results[name] = _plain(callback._average_model.state_dict())
    assert results["gpulayer"] == results["lightning"]


def _trainer(framework, folder, callbacks, max_epochs=1):
    return framework.Trainer(
        default_root_dir=folder, max_epochs=max_epochs, logger=False, enable_checkpointing=False,
        callbacks=callbacks, num_sanity_val_steps=0, **framework.options,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        pytest.param({"decay": 1.5}, ValueError, r"Invalid decay value 1\.5 provided", id="decay"),
        pytest.param({"avg_fn": None}, TypeError, "multiple values for keyword argument 'avg_fn'", id="avg-fn"),
    ],
)
def test_bad_arguments_are_refused_at_construction_as_lightning_refuses_them(arguments, error, message):
    for framework in FRAMEWORKS.values():
        with pytest.raises(error, match=message):
            framework.EMA(**arguments)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        pytest.param({"unknown": 1}, TypeError, "unexpected keyword argument 'unknown'", id="unknown"),
        pytest.param({"multi_avg_fn": print}, AssertionError, "Only one of avg_fn and multi_avg_fn", id="both-fns"),
    ],
)
def test_arguments_for_averaged_model_are_refused_at_setup_as_lightning_refuses_them(
    tmp_path, arguments, error, message
):
    for name, framework in FRAMEWORKS.items():
        trainer = framework.Trainer(
            default_root_dir=tmp_path / name, max_epochs=1, logger=False, callbacks=[framework.EMA(**arguments)],
            **framework.options,
        )  # fmt: skip
        with pytest.raises(error, match=message), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(_module(framework), _loader(4, 0))


def test_a_checkpoint_loaded_outside_fit_is_warned_about(tmp_path):
    _fit("gpulayer", tmp_path, lambda f: f.EMA(), trainer={"max_epochs": 1})
    trainer = gl.Trainer(default_root_dir=tmp_path, logger=False, callbacks=[EMAWeightAveraging()])
    with pytest.warns(UserWarning, match="loading a checkpoint outside the 'fit' stage"):
        trainer.validate(_module(FRAMEWORKS["gpulayer"]), _loader(4, 1), ckpt_path=tmp_path / "gpulayer" / "saved.ckpt")


def _two_rank_fit(runtime, folder: str) -> dict:
    """One rank's DDP fit with EMA and validation, beside torch's own AveragedModel updated after the same steps
    (no BatchNorm: its running statistics are each rank's own)."""
    framework = FRAMEWORKS["gpulayer"]

    class Reference(gl.Callback):
        def setup(self, trainer, pl_module, stage):
            self.average = AveragedModel(pl_module, avg_fn=get_ema_avg_fn(0.7), use_buffers=True)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.average.update_parameters(pl_module)

    ema, reference = EMAWeightAveraging(decay=0.7), Reference()
    model = _module(framework)
    trainer = gl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, enable_checkpointing=False,
        default_root_dir=folder, callbacks=[ema, reference], num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(model, _loader(16, 0), _loader(4, 1))
    return {
        "weights": _plain(model.state_dict()),
        "averaged": _plain(ema._average_model.state_dict()),
        "reference": _plain(reference.average.state_dict()),
    }


@pytest.mark.multiprocess
def test_under_ddp_every_rank_holds_the_same_average_as_torchs_averaged_model(tmp_path):
    ranks = run_ranks(_two_rank_fit, str(tmp_path), timeout=120)
    assert ranks[0] == ranks[1]
    assert ranks[0]["averaged"] == ranks[0]["reference"]
    averaged = {key[len("module.") :]: value for key, value in ranks[0]["averaged"].items() if key != "n_averaged"}
    assert ranks[0]["weights"] == averaged
    assert ranks[0]["averaged"]["n_averaged"] == ("torch.int64", 8)
