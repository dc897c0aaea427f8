"""What reaches the steps, compared with Lightning 2.6: a ``None`` batch (a ``collate_fn`` dropping a bad batch),
the batches of ``[loader]`` and ``{"name": loader}``, a DataModule's transfer hooks calling ``super()``, and
Lightning's display-only callbacks in ``callbacks=[...]``."""

import csv
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate

import gpulayer.trainer as gl

from .conftest import quiet_lightning

DROPPED = (2, 4)  # the batches of an epoch of 5 that the collate_fn drops (as corrupt ones), the last one too


def _data():
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(20, 2, generator=generator), torch.randn(20, 1, generator=generator))


def _dropping_loader(dropped=DROPPED, size=4):
    """Batches of ``size`` in order; the batches whose first sample index is in ``4 * dropped`` come out None."""
    indexed = TensorDataset(torch.arange(20), *_data().tensors)

    def collate(samples):
        index, x, y = default_collate(samples)
        return None if int(index[0]) // size in dropped else (x, y)

    return DataLoader(indexed, batch_size=size, collate_fn=collate)


def _module(base, record):
    class Recorded(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            record.append(("training_step", batch_idx, self.trainer.global_step))
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("loss", loss)
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx):
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            record.append(
                ("on_train_batch_end", batch_idx, outputs is None, batch is None, self.trainer.global_step, lr)
            )

        def validation_step(self, batch, batch_idx):
            record.append(("validation_step", batch_idx, batch is None))

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return Recorded


def _csv_logger(framework, root):
    """Lightning's default logger is its CSVLogger only where tensorboard is not installed: say it outright."""
    return (gl if framework is gl else framework.loggers).CSVLogger(root)


def _fit_dropping(framework, base, root, **options):
    record = []
    torch.manual_seed(0)
    model = _module(base, record)()
    trainer = framework.Trainer(
        accelerator="cpu",
        max_epochs=2,
        log_every_n_steps=2,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        default_root_dir=root,
        logger=_csv_logger(framework, root),
        **options,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, _dropping_loader(), _dropping_loader(dropped=(1,), size=10))
    with open(root / "lightning_logs" / "version_0" / "metrics.csv") as file:
        rows = [{k: v for k, v in row.items() if v} for row in csv.DictReader(file)]
    none_warnings = [str(w.message) for w in caught if "yielded None" in str(w.message)]
    return record, rows, none_warnings, trainer.global_step, model.layer.weight.detach().clone()


def test_a_none_training_batch_skips_the_step_and_runs_the_rules_as_in_lightning(tmp_path):
    ours = _fit_dropping(gl, gl.Module, tmp_path / "gpulayer")
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _fit_dropping(pl, pl.LightningModule, tmp_path / "lightning", enable_progress_bar=False)
    record, rows, none_warnings, global_step, weight = ours
    assert record == theirs[0]
    assert rows == theirs[1]  # the log steps count the dropped batches (batches_that_stepped), as Lightning's
    assert (
        none_warnings == theirs[2] == ["train_dataloader yielded None. If this was on purpose, ignore this warning..."]
    )
    assert global_step == theirs[3] == 10 - 4  # the four None batches do not step
    torch.testing.assert_close(weight, theirs[4], rtol=0, atol=0)
    assert ("on_train_batch_end", 2, True, True, 2, 0.1 * 0.5**3) in record  # the scheduler steps at a None batch
    assert ("validation_step", 1, True) in record  # a None validation batch reaches validation_step, as in Lightning


def _fit_shaped(framework, base, root, shape, datamodule_base=None, **options):
    """Train on ``shape(loader)``; the batches the step saw, the weights, and what ``trainer.train_dataloader`` held
    at the first step. With ``datamodule_base``, the loader comes from a DataModule whose transfer hooks add to the
    batch and call ``super()``'s."""
    seen, held = [], []

    class Shaped(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            seen.append(type(batch).__name__)
            if not held:
                loaders = self.trainer.train_dataloader
                inner = loaders["data"] if isinstance(loaders, dict) else loaders[0]
                held.append((type(loaders).__name__, type(inner).__name__))
            x, y = batch[0] if isinstance(batch, (list, tuple)) else batch["data"]
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    model = Shaped()
    trainer = framework.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, default_root_dir=root, **options
    )
    loaders = shape(DataLoader(_data(), batch_size=4, shuffle=True))
    if datamodule_base is None:
        trainer.fit(model, loaders)
    else:

        class Data(datamodule_base):
            def train_dataloader(self):
                return loaders

            def on_before_batch_transfer(self, batch, dataloader_idx):
                seen.append("before")
                return super().on_before_batch_transfer([(batch[0][0] * 2, batch[0][1])], dataloader_idx)

            def transfer_batch_to_device(self, batch, device, dataloader_idx):
                seen.append(f"transfer to {device.type}")
                return super().transfer_batch_to_device(batch, device, dataloader_idx)

            def on_after_batch_transfer(self, batch, dataloader_idx):
                return super().on_after_batch_transfer(batch, dataloader_idx)

        trainer.fit(model, datamodule=Data())
        assert Data.name is None
    return seen, model.layer.weight.detach().clone(), held


@pytest.mark.parametrize(
    "shape",
    [lambda loader: [loader], lambda loader: (loader,), lambda loader: {"data": loader}],
    ids=["list", "tuple", "dict"],
)
def test_one_loader_in_a_container_gives_batches_in_it_as_in_lightning(tmp_path, shape):
    ours = _fit_shaped(gl, gl.Module, tmp_path / "gpulayer", shape)
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _fit_shaped(pl, pl.LightningModule, tmp_path / "lightning", shape, enable_progress_bar=False)
    assert ours[0] == theirs[0] == [type(shape(None)).__name__] * 10
    torch.testing.assert_close(ours[1], theirs[1], rtol=0, atol=0)
    assert ours[2] == theirs[2] == [(type(shape(None)).__name__, "DataLoader")]


@pytest.mark.parametrize("empty", [[], (), {}], ids=["list", "tuple", "dict"])
def test_an_empty_container_of_training_loaders_trains_nothing_as_in_lightning(tmp_path, empty):
    """``fit(model, [])``: Lightning's warning naming the container's type, no batch, the run finished."""
    results = {}
    for name, framework, base in (("gpulayer", gl, gl.Module), ("lightning", None, None)):
        with warnings.catch_warnings(record=True) as caught:
            if framework is None:
                framework = quiet_lightning()
                base = framework.LightningModule
            warnings.simplefilter("always")
            record = []
            trainer = framework.Trainer(
                accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, default_root_dir=tmp_path
            )
            trainer.fit(_module(base, record)(), empty)
        zero = [str(w.message) for w in caught if "across ranks is zero" in str(w.message)]
        results[name] = (record, trainer.global_step, trainer.current_epoch, str(trainer.state.status), zero[:1])
    assert results["gpulayer"] == results["lightning"]
    assert results["gpulayer"][-1] == [
        f"Total length of `{type(empty).__name__}` across ranks is zero. Please make sure this was your intention."
    ]


def test_several_training_loaders_are_refused_naming_the_argument(tmp_path):
    loader = DataLoader(_data(), batch_size=4)
    trainer = gl.Trainer(accelerator="cpu", max_epochs=1, logger=False, default_root_dir=tmp_path)
    with pytest.raises(
        NotImplementedError, match=r"train_dataloaders .* is a dict of 2 loaders: .* list, tuple or dict"
    ):
        trainer.fit(_module(gl.Module, [])(), {"a": loader, "b": loader})


def test_a_datamodules_transfer_hooks_call_super_as_in_lightning(tmp_path):
    ours = _fit_shaped(gl, gl.Module, tmp_path / "gpulayer", lambda loader: [loader], gl.DataModule)
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _fit_shaped(
            pl, pl.LightningModule, tmp_path / "lightning", lambda loader: [loader], pl.LightningDataModule,
            enable_progress_bar=False,
        )  # fmt: skip
    assert ours[0] == theirs[0] == ["before", "transfer to cpu", "list"] * 10
    torch.testing.assert_close(ours[1], theirs[1], rtol=0, atol=0)


def _display_callbacks(rich):
    callbacks = pytest.importorskip("lightning.pytorch.callbacks")
    if rich:
        pytest.importorskip("rich")
        return [callbacks.RichProgressBar(), callbacks.RichModelSummary()]
    return [callbacks.TQDMProgressBar(), callbacks.ModelSummary(max_depth=2)]


@pytest.mark.parametrize("rich", [False, True], ids=["tqdm and summary", "rich"])
def test_lightnings_display_callbacks_are_dropped_with_one_warning_and_train_as_in_lightning(tmp_path, rich):
    with pytest.warns(UserWarning, match="callbacks: Lightning's .* only display progress") as caught:
        trainer = gl.Trainer(
            accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
            callbacks=_display_callbacks(rich),
        )  # fmt: skip
    assert len([w for w in caught if "only display" in str(w.message)]) == 1
    assert trainer.callbacks == []
    torch.manual_seed(0)
    ours = _module(gl.Module, [])()
    trainer.fit(ours, _dropping_loader(dropped=()))
    with warnings.catch_warnings():
        pl = quiet_lightning()
        torch.manual_seed(0)
        theirs = _module(pl.LightningModule, [])()
        pl.Trainer(
            accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, default_root_dir=tmp_path / "pl",
            callbacks=_display_callbacks(rich),
        ).fit(theirs, _dropping_loader(dropped=()))  # fmt: skip
    torch.testing.assert_close(ours.layer.weight, theirs.layer.weight, rtol=0, atol=0)


def _fit_planned(framework, base, checkpoint_class, root, **options):
    """No batch hook of the user's, so only the batches the cadence plans run the rules: step checkpoints, log steps
    and accumulation around None batches."""

    class Plain(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    model = Plain()
    checkpoint = checkpoint_class(dirpath=root / "checkpoints", every_n_train_steps=2, save_top_k=-1)
    trainer = framework.Trainer(
        accelerator="cpu", max_epochs=3, log_every_n_steps=3, accumulate_grad_batches=2, callbacks=[checkpoint],
        default_root_dir=root, logger=_csv_logger(framework, root), **options,
    )  # fmt: skip
    trainer.fit(model, _dropping_loader(dropped=(1, 2), size=2))  # 10 batches an epoch, 2 of them None
    with open(root / "lightning_logs" / "version_0" / "metrics.csv") as file:
        rows = [{k: v for k, v in row.items() if v and k != "loss"} for row in csv.DictReader(file)]
    files = sorted(path.name for path in (root / "checkpoints").iterdir())
    return trainer.global_step, rows, files, model.layer.weight.detach().clone()


def test_none_batches_between_planned_batches_keep_the_plan_as_in_lightning(tmp_path):
    callbacks = pytest.importorskip("gpulayer.callbacks")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = _fit_planned(gl, gl.Module, callbacks.ModelCheckpoint, tmp_path / "gpulayer")
        pl = quiet_lightning()
        theirs = _fit_planned(
            pl, pl.LightningModule, pl.callbacks.ModelCheckpoint, tmp_path / "lightning", enable_progress_bar=False
        )
    assert ours[:3] == theirs[:3]
    torch.testing.assert_close(ours[3], theirs[3], rtol=0, atol=0)


def _wrapped_transfer_run(framework, base, data_base, root, **options):
    """A DataModule whose ``transfer_batch_to_device`` is a ``functools.wraps`` wrapper of its own default, set on the
    instance, and a Module that overrides the hook: which one moves the batches."""
    import functools

    calls = []

    class Net(_module(base, [])):
        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            calls.append("module")
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

    class Data(data_base):
        def train_dataloader(self):
            return DataLoader(_data(), batch_size=4)

    data = Data()
    default = data.transfer_batch_to_device

    @functools.wraps(default)
    def wrapped(*args, **kwargs):
        calls.append("datamodule wrapper")
        return default(*args, **kwargs)

    data.transfer_batch_to_device = wrapped
    torch.manual_seed(0)
    trainer = framework.Trainer(
        accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False, default_root_dir=root, **options
    )
    trainer.fit(Net(), datamodule=data)
    return sorted(set(calls)), trainer.global_step


def test_a_wrapper_of_a_datamodules_default_transfer_hook_leaves_the_modules_hook_as_in_lightning(tmp_path):
    """Lightning's ``is_overridden`` looks through ``functools.wraps`` (``__wrapped__``): a wrapper of the DataModule's
    own default hook is no override, so the Module's hook moves the batches."""
    ours = _wrapped_transfer_run(gl, gl.Module, gl.DataModule, tmp_path / "gpulayer")
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _wrapped_transfer_run(
            pl, pl.LightningModule, pl.LightningDataModule, tmp_path / "lightning", enable_progress_bar=False
        )
    assert ours == theirs == (["module"], 3)
