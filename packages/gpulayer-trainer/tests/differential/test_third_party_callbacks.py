"""Callbacks other libraries build on Lightning's ``Callback`` (Optuna's pruning callback, research utilities) are
taken as they are: every hook called as Lightning calls it, their state saved and restored under their key; Lightning's
own callbacks, and callbacks built on them, stay refused by name."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning

THIRD_PARTY = "gpulayer, Lightning's callback"


def _log_from_the_callback(self, trainer, pl_module, *args):
    pl_module.log("seen", float(trainer.global_step))


@pytest.mark.parametrize(
    "scenario",
    [
        {"trainer": {"max_epochs": 2, "val_check_interval": 2}, "stages": ("fit", "validate", "test", "predict")},
        {
            "trainer": {"max_epochs": 2, "accumulate_grad_batches": 2},
            "callback": {"on_train_batch_end": _log_from_the_callback},
        },
        {"trainer": {"max_steps": 3}, "module": {"training_step": None}, "expect_error": True},
    ],
    ids=["every stage", "accumulating, logging from a batch hook", "an exception"],
)
def test_every_hook_of_a_callback_built_on_lightnings_is_called_as_lightning_calls_it(run, assert_same, scenario):
    assert_same(run("lightning", **scenario), run(THIRD_PARTY, **scenario))


def _counting_callback_class(base):
    class Counting(base):
        """A stateful callback of another library: batches seen, saved and restored under its state key."""

        def __init__(self, every):
            self.every, self.batches = every, 0

        @property
        def state_key(self):
            return self._generate_state_key(every=self.every)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.batches += 1

        def state_dict(self):
            return {"batches": self.batches}

        def load_state_dict(self, state_dict):
            self.batches = state_dict["batches"]

    return Counting


def _module_class(base):
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net


def _saved_and_restored(framework, module_base, root):
    """Fit 2 epochs with a stateful callback built on Lightning's Callback, save; resume for 1 more epoch."""
    pl = quiet_lightning()
    counting = _counting_callback_class(pl.Callback)
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=root)
    if framework is pl:
        options |= dict(enable_progress_bar=False, enable_model_summary=False)
    first = counting(every=3)
    trainer = framework.Trainer(max_epochs=2, callbacks=[first], **options)
    trainer.fit(_module_class(module_base)(), data)
    trainer.save_checkpoint(root / "saved.ckpt")
    saved = torch.load(root / "saved.ckpt", weights_only=False)["callbacks"]
    resumed = counting(every=3)
    framework.Trainer(max_epochs=3, callbacks=[resumed], **options).fit(
        _module_class(module_base)(), data, ckpt_path=root / "saved.ckpt"
    )
    return saved, first.batches, resumed.batches


def test_the_state_of_a_callback_built_on_lightnings_is_saved_and_restored_as_in_lightning(tmp_path):
    torch.manual_seed(0)
    ours = _saved_and_restored(gl, gl.Module, tmp_path / "gpulayer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl = quiet_lightning()
        torch.manual_seed(0)
        theirs = _saved_and_restored(pl, pl.LightningModule, tmp_path / "lightning")
    key = "_counting_callback_class.<locals>.Counting{'every': 3}"  # Lightning's _generate_state_key
    assert ours == theirs == ({key: {"batches": 4}}, 4, 6)


def test_lightnings_own_callbacks_and_callbacks_built_on_them_stay_refused_by_name(tmp_path):
    pl = quiet_lightning()
    from lightning.pytorch.callbacks import EarlyStopping, StochasticWeightAveraging

    class Patient(EarlyStopping):
        pass

    refused = [
        (StochasticWeightAveraging(swa_lrs=0.1), r"Lightning's StochasticWeightAveraging"),
        (Patient(monitor="loss"), r"built on Lightning's EarlyStopping: .* Callback itself"),
    ]
    for callback, message in refused:
        with pytest.raises(TypeError, match=r"callbacks\[0\] is .*" + message):
            gl.Trainer(accelerator="cpu", callbacks=[callback], default_root_dir=tmp_path)
    assert pl.Callback is not gl.Callback


def _optuna_study(framework, module_base, root):
    """Two trials of Optuna's pruning callback (optuna-integration) on a small regression; a pruner that prunes the
    second trial once it has reported epoch 2. Returns each trial's state, reported values and parameters."""
    optuna = pytest.importorskip("optuna")
    integration = pytest.importorskip("optuna_integration")
    pl = quiet_lightning()

    class SecondTrialAtEpochTwo(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return trial.number == 1 and trial.last_step is not None and trial.last_step >= 2

    class Net(_module_class(module_base)):
        def __init__(self, lr):
            super().__init__()
            self.lr = lr

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 4, generator=generator), torch.randn(16, 1, generator=generator))

    def objective(trial):
        torch.manual_seed(trial.number)
        lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)
        callback = integration.PyTorchLightningPruningCallback(trial, monitor="val_loss")
        options = dict(accelerator="cpu", max_epochs=4, logger=False, enable_checkpointing=False, default_root_dir=root)
        if framework is pl:
            options |= dict(enable_progress_bar=False, enable_model_summary=False)
        trainer = framework.Trainer(callbacks=[callback], **options)
        trainer.fit(Net(lr), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
        return float(trainer.callback_metrics["val_loss"])

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=SecondTrialAtEpochTwo(), sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"lr": 0.05})
    study.enqueue_trial({"lr": 0.2})
    study.optimize(objective, n_trials=2)
    return [
        (trial.state.name, {step: round(value, 6) for step, value in trial.intermediate_values.items()}, trial.params)
        for trial in study.trials
    ]


def test_optunas_pruning_callback_prunes_the_same_trial_at_the_same_step(tmp_path):
    """Optuna's PyTorchLightningPruningCallback reads ``trainer._accelerator_connector.is_distributed`` (a row of
    ``core/lightning_private.py``) and raises ``TrialPruned`` from ``on_validation_end``."""
    ours = _optuna_study(gl, gl.Module, tmp_path / "gpulayer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl = quiet_lightning()
        theirs = _optuna_study(pl, pl.LightningModule, tmp_path / "lightning")
    assert ours == theirs
    assert [state for state, _, _ in ours] == ["COMPLETE", "PRUNED"]
    assert list(ours[0][1]) == [0, 1, 2, 3] and list(ours[1][1]) == [0, 1, 2]


def test_a_lightning_private_attribute_no_known_integration_reads_names_the_callback_that_read_it(tmp_path):
    pl = quiet_lightning()

    class ReadsInternals(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            trainer._data_connector.attach_data(pl_module)

    trainer = gl.Trainer(
        accelerator="cpu", max_steps=1, logger=False, callbacks=[ReadsInternals()], default_root_dir=tmp_path
    )
    data = DataLoader(TensorDataset(torch.randn(4, 4), torch.randn(4, 1)), batch_size=4)
    message = (
        r"no attribute '_data_connector': .*test_third_party_callbacks\..*ReadsInternals reads it: _data_connector "
        r"is a private attribute of Lightning's Trainer"
    )
    with pytest.raises(AttributeError, match=message):
        trainer.fit(_module_class(gl.Module)(), data)


FACTORY_PACKAGE = """
from lightning.pytorch import Callback


class Announced(Callback):
    calls = []

    def on_train_start(self, trainer, pl_module):
        Announced.calls.append([type(c).__name__ for c in trainer.callbacks])


def make():
    return [Announced()]
"""


@pytest.fixture
def installed_callback_factory(tmp_path, monkeypatch):
    """A package installed on ``sys.path`` that registers a factory under Lightning's ``callbacks_factory`` group."""
    import importlib
    import sys

    site = tmp_path / "site"
    (site / "announcing").mkdir(parents=True)
    (site / "announcing" / "__init__.py").write_text(FACTORY_PACKAGE)
    info = site / "announcing-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: announcing\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[lightning.pytorch.callbacks_factory]\nannounce = announcing:make\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield importlib.import_module("announcing")
    sys.modules.pop("announcing", None)


def _with_factory(framework, module_base, root, calls):
    pl = quiet_lightning()
    counting = _counting_callback_class(pl.Callback)
    options = dict(accelerator="cpu", max_epochs=1, logger=False, default_root_dir=root)
    if framework is pl:
        options |= dict(enable_progress_bar=False, enable_model_summary=False)
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    framework.Trainer(callbacks=[counting(every=1)], max_time="00:00:10:00", **options).fit(
        _module_class(module_base)(), data
    )
    return calls.pop()


def test_callbacks_of_installed_factories_join_every_trainer_in_lightnings_order(tmp_path, installed_callback_factory):
    """Lightning's ``lightning.pytorch.callbacks_factory`` entry points: each factory's callbacks join the Trainer's,
    after the user's and the Timer, before the checkpoint callbacks."""
    calls = installed_callback_factory.Announced.calls
    ours = _with_factory(gl, gl.Module, tmp_path / "gpulayer", calls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl = quiet_lightning()
        theirs = _with_factory(pl, pl.LightningModule, tmp_path / "lightning", calls)
    display = {"TQDMProgressBar", "ModelSummary"}  # Lightning's display callbacks: GPUlayer has none
    # With gpulayer-trainer installed alone, the default checkpoint is its DefaultCheckpoint (ModelCheckpoint's twin).
    ours = ["ModelCheckpoint" if name == "DefaultCheckpoint" else name for name in ours]
    assert ours == [name for name in theirs if name not in display]
    assert ours == ["Counting", "Timer", "Announced", "ModelCheckpoint"]
