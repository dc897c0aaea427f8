"""EarlyStopping against Lightning 2.6.6: scripted metric sequences run under both frameworks must stop at the same
point with the same counters, per-check trace, verbose messages, state and checkpointed state."""

import contextlib
import math
import warnings
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from gpulayer.callbacks.model_checkpoint import ModelCheckpoint

from .conftest import frameworks, info_messages

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

NAN, INF = math.nan, math.inf
FRAMEWORKS = frameworks(
    EarlyStopping=(LightningEarlyStopping, EarlyStopping),
    log_name=("lightning.pytorch.callbacks.early_stopping", "gpulayer.callbacks.early_stopping"),
)


def _scripted_module(framework, values, *, metric="val_loss", validate=True, per_validation=False):
    """Logs ``values[i]`` as ``metric``: ``i`` is the epoch, or the count of validation runs (``per_validation``);
    the last value repeats. Without validation it logs in ``on_train_epoch_end``. The sanity check logs NaN, which
    would stop training at once if early stopping looked at it."""

    class Scripted(framework.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.validations = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def scripted(self):
            index = self.validations if per_validation else self.trainer.current_epoch
            return values[min(index, len(values) - 1)]

        if validate:

            def validation_step(self, batch, batch_idx):
                pass

            def on_validation_epoch_end(self):
                if self.trainer.sanity_checking:
                    self.log(metric, NAN)
                    return
                self.log(metric, self.scripted())
                self.validations += 1

            test_step, on_test_epoch_end = validation_step, on_validation_epoch_end

        else:

            def on_train_epoch_end(self):
                self.log(metric, self.scripted())

    return Scripted()


def _probe(framework, save_at=None, path=None):
    """A checkpoint-type callback (so it runs after EarlyStopping in both hooks) that records the early stopping
    state after every check point, and saves a checkpoint at the end of epoch ``save_at``."""

    class Probe(framework.Checkpoint):
        def __init__(self):
            self.trace = []

        def on_validation_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                self.record("validation_end", trainer)

        def on_train_epoch_end(self, trainer, pl_module):
            self.record("train_epoch_end", trainer)
            if trainer.current_epoch == save_at:
                trainer.save_checkpoint(path)

        def record(self, hook, trainer):
            stopper = next(c for c in trainer.callbacks if isinstance(c, framework.EarlyStopping))
            point = (hook, trainer.current_epoch, trainer.global_step)
            self.trace.append((*point, stopper.wait_count, float(stopper.best_score), trainer.should_stop))

    return Probe()


def _loader(samples):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))
    return DataLoader(data, batch_size=2)


@contextlib.contextmanager
def _lightning_quiet(name):
    if name != "lightning":
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _plain_state(state):
    best = state["best_score"]
    return state | {"best_score": (type(best).__name__, best.dtype, float(best))}


def _fit(name, root, values, *, stopper=None, trainer=None, module=None, save_at=None, ckpt_path=None):
    """One fit under framework ``name``; everything EarlyStopping decided, as plain data."""
    framework = FRAMEWORKS[name]
    module = module or {}
    stopper_options = {"monitor": module.get("metric", "val_loss"), "verbose": True} | (stopper or {})
    early_stopping = framework.EarlyStopping(**stopper_options)
    probe = _probe(framework, save_at, root / f"{name}.ckpt")
    validate = module.get("validate", True)
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 8,
        "logger": False,
        "default_root_dir": root / name,
        "callbacks": [early_stopping, probe],
    }
    with _lightning_quiet(name), info_messages(framework.log_name) as messages:
        run = framework.Trainer(**options | framework.options | (trainer or {}))
        model = _scripted_module(framework, values, **module)
        run.fit(model, _loader(8), _loader(2) if validate else None, ckpt_path=ckpt_path)
    return {
        "current_epoch": run.current_epoch,
        "global_step": run.global_step,
        "should_stop": run.should_stop,
        "check_on_train_epoch_end": early_stopping._check_on_train_epoch_end,
        "stopped_epoch": early_stopping.stopped_epoch,
        "wait_count": early_stopping.wait_count,
        "best_score": float(early_stopping.best_score),
        "stopping_reason": early_stopping.stopping_reason.name,
        "state_key": early_stopping.state_key,
        "state": _plain_state(early_stopping.state_dict()),
        "trace": probe.trace,
        "messages": messages,
    }


def _both(tmp_path, values, **kwargs):
    expected = _fit("lightning", tmp_path, values, **kwargs)
    actual = _fit("gpulayer", tmp_path, values, **kwargs)
    assert actual == expected
    return actual


SCENARIOS = [
    pytest.param([1, 0.9, 0.9, 0.9, 0.9], {"patience": 3}, {}, {}, id="patience"),
    pytest.param([1, 0.9, 0.95, 0.8], {"patience": 0}, {}, {}, id="patience-0"),
    pytest.param([1, 0.9, 0.85, 0.84, 0.83, 0.82, 0.81], {"patience": 2, "min_delta": 0.05}, {}, {}, id="min-delta"),
    pytest.param([1, 1.02, 1.04, 1.2, 1.3], {"patience": 2, "min_delta": -0.05}, {}, {}, id="negative-min-delta"),
    pytest.param([0.1, 0.5, 0.5, 0.6, 0.55, 0.5], {"mode": "max", "patience": 2}, {}, {}, id="max"),
    pytest.param(
        [0.1, 0.2, 0.22, 0.24, 0.3, 0.3], {"mode": "max", "patience": 2, "min_delta": 0.05}, {}, {}, id="max-min-delta"
    ),
    pytest.param(
        [0.5, 0.48, 0.46, 0.3], {"mode": "max", "patience": 2, "min_delta": -0.05}, {}, {}, id="max-negative-min-delta"
    ),
    pytest.param([1, 0.5, 0.3, 0.2, 0.1], {"stopping_threshold": 0.3}, {}, {}, id="stopping-threshold"),
    pytest.param(
        [0.1, 0.5, 0.9, 0.95], {"mode": "max", "stopping_threshold": 0.9}, {}, {}, id="stopping-threshold-max"
    ),
    pytest.param([1, 2, 5, 6, 1], {"divergence_threshold": 5, "patience": 9}, {}, {}, id="divergence"),
    pytest.param([5, 4, 2, 1], {"mode": "max", "divergence_threshold": 2, "patience": 9}, {}, {}, id="divergence-max"),
    pytest.param([1, 0.9, NAN, 0.5], {}, {}, {}, id="nan"),
    pytest.param([1, INF], {"mode": "max"}, {}, {}, id="inf"),
    pytest.param([1, 0.9, NAN, NAN, NAN, 0.5], {"check_finite": False}, {}, {}, id="nan-unchecked"),
    pytest.param([1, -INF, 0, 0, 0], {"check_finite": False, "patience": 2}, {}, {}, id="minus-inf-unchecked"),
    pytest.param([1, 0.9], {"monitor": "missing", "strict": False, "verbose": False}, {}, {}, id="not-strict-missing"),
    # Two validations per epoch: the check runs after each one, or once at the epoch's end when asked.
    *(
        pytest.param(
            [1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
            {"patience": 2, "check_on_train_epoch_end": choice},
            {"val_check_interval": 0.5},
            {"per_validation": True},
            id=f"half-epoch-validation-check-on-train-epoch-end-{choice}",
        )
        for choice in (True, False, None)
    ),
    # Lightning's EarlyStopping.setup, matched: an int 1 (validate every batch) equals 1.0, so the check is at
    # epoch end.
    pytest.param(
        [1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
        {"patience": 2},
        {"val_check_interval": 1},
        {"per_validation": True},
        id="int-1-val-check-interval",
    ),
    pytest.param(
        [1, 0.9, 0.9, 0.9, 0.9],
        {"patience": 2},
        {"check_val_every_n_epoch": 2, "max_epochs": 12},
        {"per_validation": True},
        id="validation-every-2-epochs",
    ),
    # Checked every epoch, the metric is missing in the epochs without validation (so strict=False).
    pytest.param(
        [1, 0.9, 0.9, 0.9, 0.9],
        {"patience": 2, "check_on_train_epoch_end": True, "strict": False, "verbose": False},
        {"check_val_every_n_epoch": 2, "max_epochs": 12},
        {"per_validation": True},
        id="validation-every-2-epochs-checked-every-epoch",
    ),
    pytest.param([3, 2, 2, 2, 2], {"patience": 2}, {}, {"validate": False, "metric": "loss"}, id="no-validation"),
    # Without validation, a check placed after validation never runs (Lightning's behaviour, matched).
    pytest.param(
        [3, 2, 2, 2, 2],
        {"patience": 2, "check_on_train_epoch_end": False},
        {},
        {"validate": False, "metric": "loss"},
        id="no-validation-checked-after-validation",
    ),
    pytest.param([1, 0.9, 0.9, 0.9, 0.9, 0.9], {"patience": 1}, {"min_epochs": 5}, {}, id="min-epochs"),
    pytest.param([NAN], {}, {"fast_dev_run": 2}, {}, id="fast-dev-run"),
]


@pytest.mark.parametrize(("values", "stopper", "trainer", "module"), SCENARIOS)
def test_a_scripted_sequence_stops_where_lightning_stops(tmp_path, values, stopper, trainer, module):
    _both(tmp_path, values, stopper=stopper, trainer=trainer, module=module)


def test_the_documented_stop_points(tmp_path):
    """Stop points observed under Lightning 2.6 (``EarlyStopping._evaluate_stopping_criteria``), through GPUlayer
    alone: (values, arguments) -> (epochs run, stopped_epoch)."""
    cases = [
        ([1, 0.9, 0.9, 0.9, 0.9, 0.9], {"patience": 3}, 5, 4, "PATIENCE_EXHAUSTED"),
        ([1, 0.9, 0.85, 0.84, 0.83, 0.82], {"patience": 2, "min_delta": 0.05}, 6, 5, "PATIENCE_EXHAUSTED"),
        ([1, 0.5, 0.3, 0.2], {"stopping_threshold": 0.3}, 4, 3, "STOPPING_THRESHOLD"),
        ([1, 2, 5, 6], {"divergence_threshold": 5}, 4, 3, "DIVERGENCE_THRESHOLD"),
        ([1, NAN, 1], {}, 2, 1, "NON_FINITE_METRIC"),
    ]
    for values, stopper, epochs, stopped_epoch, reason in cases:
        result = _fit("gpulayer", tmp_path, values, stopper=stopper)
        assert (result["current_epoch"], result["stopped_epoch"], result["stopping_reason"]) == (
            epochs,
            stopped_epoch,
            reason,
        )
        assert result["state"]["stopping_reason"] == EarlyStoppingReason[reason].value


def test_a_time_based_val_check_interval_checks_after_each_validation(tmp_path):
    """Lightning's ``EarlyStopping.setup`` crashes on a time-based interval, which leaves ``val_check_interval``
    unset; GPUlayer checks after every validation, as for any interval other than once per epoch. A zero interval
    validates after every batch, like Lightning's 0.0."""
    values = [1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
    kwargs = {"stopper": {"patience": 3}, "module": {"per_validation": True}}
    with _lightning_quiet("lightning"), pytest.raises(AttributeError, match="val_check_interval"):
        _fit("lightning", tmp_path, values, trainer={"val_check_interval": timedelta(0)}, **kwargs)
    expected = _fit("lightning", tmp_path, values, trainer={"val_check_interval": 0.0}, **kwargs)
    actual = _fit("gpulayer", tmp_path, values, trainer={"val_check_interval": timedelta(0)}, **kwargs)
    assert actual == expected
    assert (actual["check_on_train_epoch_end"], actual["stopped_epoch"], actual["global_step"]) == (False, 1, 5)


@pytest.mark.parametrize("check_on_train_epoch_end", [True, False])
def test_strict_names_the_missing_metric_and_the_available_ones(tmp_path, check_on_train_epoch_end):
    stopper = {"monitor": "missing", "check_on_train_epoch_end": check_on_train_epoch_end}
    errors = []
    for name in FRAMEWORKS:
        with pytest.raises(RuntimeError) as error:
            _fit(name, tmp_path, [1.0], stopper=stopper)
        errors.append(str(error.value))
    assert errors[0] == errors[1]
    assert errors[1] == (
        "Early stopping conditioned on metric `missing` which is not available. Pass in or modify your `EarlyStopping`"
        " callback to use any of the following: `val_loss`"
    )


def test_a_missing_metric_warns_when_not_strict_and_verbose(tmp_path):
    with pytest.warns(RuntimeWarning, match="Early stopping conditioned on metric `missing` which is not available"):
        result = _fit("gpulayer", tmp_path, [1.0], stopper={"monitor": "missing", "strict": False}, trainer={})
    assert (result["current_epoch"], result["wait_count"], result["stopping_reason"]) == (8, 0, "NOT_STOPPED")


RESUMES = [
    pytest.param([1, 0.9, 0.9, 0.9, 0.9, 0.9], {"patience": 3}, {}, 2, id="mid-patience"),
    pytest.param(
        [1, 0.9, 0.85, 0.84, 0.83, 0.82, 0.81],
        {"patience": 2, "min_delta": 0.05, "check_on_train_epoch_end": False},
        {},
        3,
        id="after-validation-min-delta",
    ),
    # Saved at the stop (min_epochs keeps it going): the restored stopping_reason and wait_count carry on.
    pytest.param([1, 0.9, 0.9, 0.9, 0.9, 0.9], {"patience": 1}, {"min_epochs": 4}, 2, id="after-a-stop"),
]


@pytest.mark.parametrize(("values", "stopper", "trainer", "save_at"), RESUMES)
def test_a_resumed_run_restores_the_callback_state_as_lightning_does(tmp_path, values, stopper, trainer, save_at):
    unbroken = _both(tmp_path, values, stopper=stopper, trainer=trainer, save_at=save_at)
    saved = {}
    for name in FRAMEWORKS:
        checkpoint = torch.load(tmp_path / f"{name}.ckpt", weights_only=True)
        saved[name] = {key: _plain_state(state) for key, state in checkpoint["callbacks"].items()}
    assert saved["gpulayer"] == saved["lightning"]
    assert list(saved["gpulayer"]) == [unbroken["state_key"]]

    resumed = {}
    for name in FRAMEWORKS:
        ckpt_path = tmp_path / f"{name}.ckpt"
        resumed[name] = _fit(name, tmp_path / "resumed", values, stopper=stopper, trainer=trainer, ckpt_path=ckpt_path)
    assert resumed["gpulayer"] == resumed["lightning"]
    for field in ("current_epoch", "global_step", "stopped_epoch", "wait_count", "best_score", "state"):
        assert resumed["gpulayer"][field] == unbroken[field], field


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_no_check_outside_fit(tmp_path, stage):
    results = []
    for name, framework in FRAMEWORKS.items():
        stopper = framework.EarlyStopping(monitor="val_loss", check_on_train_epoch_end=False)
        model = _scripted_module(framework, [NAN])
        options = {
            "accelerator": "cpu",
            "devices": 1,
            "logger": False,
            "default_root_dir": tmp_path,
            "callbacks": stopper,
        }
        with _lightning_quiet(name):
            trainer = framework.Trainer(**options | framework.options)
            getattr(trainer, stage)(model, _loader(2), verbose=False)
        results.append((trainer.should_stop, stopper.stopping_reason.name, _plain_state(stopper.state_dict())))
    assert results[0] == results[1]
    assert results[1][:2] == (False, "NOT_STOPPED")


@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (0, 2), (1, 2)])
@pytest.mark.parametrize("log_rank_zero_only", [False, True])
def test_verbose_messages_carry_the_rank_prefix_of_lightning(rank, world_size, log_rank_zero_only):
    trainer = SimpleNamespace(global_rank=rank, world_size=world_size)
    logged = []
    with info_messages(FRAMEWORKS["lightning"].log_name) as messages:
        LightningEarlyStopping._log_info(trainer, "message", log_rank_zero_only)
    logged.append(messages)
    with info_messages(FRAMEWORKS["gpulayer"].log_name) as messages:
        EarlyStopping("val_loss", log_rank_zero_only=log_rank_zero_only)._log_info(trainer, "message")
    logged.append(messages)
    assert logged[0] == logged[1]


@pytest.mark.parametrize(("monitor", "mode"), [("val_loss", "min"), ("val/acc", "max")])
def test_state_key_and_state_dict_match_lightning(monitor, mode):
    theirs, ours = LightningEarlyStopping(monitor, mode=mode), EarlyStopping(monitor, mode=mode)
    assert ours.state_key == theirs.state_key
    theirs.wait_count, theirs.stopped_epoch, theirs.best_score = 2, 5, torch.tensor(0.25)
    theirs.stopping_reason_message = "stopped"
    ours.load_state_dict(theirs.state_dict())
    assert _plain_state(ours.state_dict()) == _plain_state(theirs.state_dict())
    # A state saved before 2.6 has no stopping reason: it loads as "not stopped".
    old = {key: value for key, value in theirs.state_dict().items() if not key.startswith("stopping_reason")}
    ours.load_state_dict(old)
    assert (ours.stopping_reason, ours.stopping_reason_message) == (EarlyStoppingReason.NOT_STOPPED, None)


def test_an_unknown_mode_is_rejected_with_lightnings_message():
    with pytest.raises(MisconfigurationException) as theirs:
        LightningEarlyStopping("val_loss", mode="maximum")
    with pytest.raises(ValueError) as ours:
        EarlyStopping("val_loss", mode="maximum")
    assert str(ours.value) == str(theirs.value) == "`mode` can be min, max, got maximum"


def test_the_trainer_lists_its_early_stopping_callbacks_as_lightning_does(tmp_path):
    with _lightning_quiet("lightning"):
        theirs = pl.Trainer(
            callbacks=[LightningEarlyStopping("a"), LightningEarlyStopping("b")],
            logger=False,
            default_root_dir=tmp_path,
        )
    ours = gl.Trainer(
        callbacks=[EarlyStopping("a"), ModelCheckpoint(dirpath=tmp_path), EarlyStopping("b")],
        logger=False,
        default_root_dir=tmp_path,
    )
    assert [c.monitor for c in ours.early_stopping_callbacks] == [c.monitor for c in theirs.early_stopping_callbacks]
    assert ours.early_stopping_callback.monitor == theirs.early_stopping_callback.monitor == "a"
