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
