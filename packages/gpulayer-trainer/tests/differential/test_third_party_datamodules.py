"""Data modules other libraries build on Lightning's ``LightningDataModule`` (PyTorch Geometric's ``LightningDataset``
and ``LightningNodeData``) are taken as they are, passed positionally or as ``datamodule=``: every hook called as
Lightning 2.6 calls it (its data hooks, its batch transfer hooks, its state saved and restored), and so is the
``LightningDataModule`` Lightning's own ``from_datasets`` makes. The trainer never imports Lightning: the base is
recognised by its name and module."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning

THIRD_PARTY = "gpulayer, Lightning's DataModule"


@pytest.mark.parametrize(
    "scenario",
    [
        {"data_source": "datamodule", "stages": ("fit", "validate", "test", "predict")},
        {"data_source": "datamodule_positional", "stages": ("fit", "validate", "test", "predict")},
        {"data_source": "datamodule_as_dataloaders", "stages": ("test", "predict")},
        {"data_source": "datamodule", "val_sizes": (6, 3), "shuffle": True, "trainer": {"max_epochs": 3}},
        {"data_source": "datamodule", "module": {"training_step": None}, "expect_error": True},
    ],
    ids=["datamodule=", "positionally", "as dataloaders=", "two val loaders, shuffled", "an exception"],
)
def test_every_hook_of_a_datamodule_built_on_lightnings_is_called_as_lightning_calls_it(run, assert_same, scenario):
    assert_same(run("lightning", **scenario), run(THIRD_PARTY, **scenario))


def _datasets():
    generator = torch.Generator().manual_seed(3)
    return [
        TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 2, generator=generator)) for n in (10, 6)
    ]


def _library_datamodule_class(base):
    class GraphDataModule(base):
        """A data module as a library ships one (PyTorch Geometric's shape): its own options saved as hyperparameters,
        a loader it has no data for set to None, batch transfer hooks calling ``super()``, and state."""

        def __init__(self, train, val=None, batch_size=4, calls=None):
            super().__init__()
            self.save_hyperparameters("batch_size")
            self.train_set, self.val_set, self.calls, self.batches = train, val, calls, 0
            if val is None:
                self.val_dataloader = None

        def prepare_data(self):
            self.calls.append(f"D.prepare_data(devices={self.trainer.num_devices})")

        def setup(self, stage):
            self.calls.append(f"D.setup({getattr(stage, 'value', stage)})")

        def train_dataloader(self):
            self.calls.append("D.train_dataloader")
            return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

        def val_dataloader(self):
            self.calls.append("D.val_dataloader")
            return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            self.calls.append(f"D.on_before_batch_transfer({dataloader_idx})")
            return [batch[0] * 2, batch[1]]

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            self.calls.append(f"D.transfer_batch_to_device({device.type}, {dataloader_idx})")
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def on_after_batch_transfer(self, batch, dataloader_idx):
            self.calls.append(f"D.on_after_batch_transfer({dataloader_idx})")
            self.batches += 1
            return batch

        def state_dict(self):
            self.calls.append("D.state_dict")
            return {"batches": self.batches}

        def load_state_dict(self, state_dict):
            self.calls.append(f"D.load_state_dict({state_dict})")
            self.batches = state_dict["batches"]

        def teardown(self, stage):
            self.calls.append(f"D.teardown({getattr(stage, 'value', stage)})")

    return GraphDataModule


def _module_class(base):
    class Net(base):
        def __init__(self, calls):
            super().__init__()
            self.layer, self.calls = torch.nn.Linear(4, 2), calls

        def setup(self, stage):
            self.calls.append(f"M.setup({getattr(stage, 'value', stage)})")

        def on_train_epoch_start(self):
            self.calls.append("M.on_train_epoch_start")

        def training_step(self, batch, batch_idx):
            self.calls.append(f"M.training_step({batch_idx})")
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.calls.append(f"M.validation_step({batch_idx})")
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def teardown(self, stage):
            self.calls.append(f"M.teardown({getattr(stage, 'value', stage)})")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net


def _fit_save_and_resume(framework, module_base, datamodule_base, root, with_val, positional):
    """Fit 2 epochs, save, resume for a third with a new data module; every call, the checkpoint's data module keys,
    the metrics, steps and weights."""
    train, val = _datasets()
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=root)
    if framework is not gl:
        options |= dict(enable_progress_bar=False, enable_model_summary=False)
    calls = []
    library = _library_datamodule_class(datamodule_base)

    class Net(_module_class(module_base)):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            raise AssertionError("the DataModule's on_before_batch_transfer wins over the module's")

    framework.seed_everything(7)
    module = Net(calls)

    def fit(trainer, datamodule, **arguments):
        if positional:
            trainer.fit(module, datamodule, **arguments)
        else:
            trainer.fit(module, datamodule=datamodule, **arguments)

    trainer = framework.Trainer(max_epochs=2, **options)
    fit(trainer, library(train, val if with_val else None, batch_size=4, calls=calls))
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    trainer.save_checkpoint(root / "run.ckpt")
    saved = torch.load(root / "run.ckpt", weights_only=False)
    kept = {key: value for key, value in saved.items() if "datamodule" in key or key.endswith("GraphDataModule")}
    calls.append("resume")
    resumed = framework.Trainer(max_epochs=3, **options)
    fit(resumed, library(train, val if with_val else None, batch_size=4, calls=calls), ckpt_path=root / "run.ckpt")
    weights = {name: value.detach().clone() for name, value in module.state_dict().items()}
    return calls, kept, metrics, (trainer.global_step, resumed.global_step, resumed.current_epoch), weights


@pytest.mark.parametrize("with_val", [True, False], ids=["with validation", "its val_dataloader set to None"])
@pytest.mark.parametrize("positional", [False, True], ids=["datamodule=", "fit(model, dm)"])
def test_a_library_datamodule_trains_saves_and_resumes_as_under_lightning(tmp_path, with_val, positional):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _fit_save_and_resume(
            pl, pl.LightningModule, pl.LightningDataModule, tmp_path / "lightning", with_val, positional
        )
    ours = _fit_save_and_resume(gl, gl.Module, pl.LightningDataModule, tmp_path / "gpulayer", with_val, positional)
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]
    assert ours[1]["datamodule_hyper_parameters"] == {"batch_size": 4}
    assert ours[2] == pytest.approx(theirs[2], rel=1e-6)
    assert ours[3] == theirs[3] == (6, 9, 3)
    for name, weight in theirs[4].items():
        torch.testing.assert_close(ours[4][name], weight)
    moved = 6 + (2 + 4 if with_val else 0)  # 3 training batches an epoch; the sanity check's 2, then 2 an epoch
    assert f"D.load_state_dict({{'batches': {moved}}})" in ours[0]


def _from_datasets_run(framework, module_base, datamodule, root):
    """Lightning's ``LightningDataModule.from_datasets`` result, fitted for 2 epochs, then tested."""
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=root, max_epochs=2)
    if framework is not gl:
        options |= dict(enable_progress_bar=False, enable_model_summary=False)
    framework.seed_everything(5)
    module = _module_class(module_base)([])
    module.test_step = module.validation_step
    trainer = framework.Trainer(**options)
    trainer.fit(module, datamodule)
    tested = trainer.test(module, datamodule=datamodule, verbose=False)
    return module.calls, tested, trainer.global_step, {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_lightnings_from_datasets_datamodule_is_taken_as_it_is(tmp_path):
    """Lightning's ``from_datasets`` returns a ``LightningDataModule`` whose loaders are set on the instance (shuffled
    for training, pinned memory): GPUlayer's Trainer takes it as Lightning's does (a port rewrites
    ``LightningDataModule.from_datasets`` to GPUlayer's own ``DataModule.from_datasets``)."""
    train, val = _datasets()
    with warnings.catch_warnings():
        pl = quiet_lightning()
        datamodule = pl.LightningDataModule.from_datasets(train, val, test_dataset=val, batch_size=4)
        theirs = _from_datasets_run(pl, pl.LightningModule, datamodule, tmp_path / "lightning")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")  # torch: the CPU cannot pin
        ours = _from_datasets_run(gl, gl.Module, datamodule, tmp_path / "gpulayer")
    assert ours[0] == theirs[0]
    assert ours[1][0] == pytest.approx(theirs[1][0], rel=1e-6)
    assert ours[2] == theirs[2] == 6
    for name, weight in theirs[3].items():
        torch.testing.assert_close(ours[3][name], weight)


def test_what_is_not_a_datamodule_is_still_refused_by_name(tmp_path):
    trainer = gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path)
    with pytest.raises(TypeError, match=r"datamodule must be a gpulayer.trainer.DataModule .*got TensorDataset"):
        trainer.fit(_module_class(gl.Module)([]), datamodule=_datasets()[0])
