"""Trainer(logger=...) with Lightning's own TensorBoardLogger and with a user's logger: the same files, scalars and
calls as under Lightning 2.6; a value that is no logger is refused; on two ranks only rank 0 writes."""

import importlib.util
import os
import warnings
import weakref

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks

lightning = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402

needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard")


def _module_class(base, fail=False):
    class Imaged(base):
        def __init__(self, width=4, label="demo"):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            if fail and self.global_step == 3:
                raise RuntimeError("a failing step")
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            if batch_idx == 0:
                self.logger.experiment.add_image("inputs", x[:1].unsqueeze(0).sigmoid(), self.global_step)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("val_loss", loss)
            self.log("val_step", loss * 2, on_step=True, on_epoch=False)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Imaged


def _loaders():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(20, 4, generator=generator), torch.randn(20, 1, generator=generator))
    return DataLoader(data, batch_size=4), DataLoader(data, batch_size=8)


def _fit(ours, root, logger, fail=False, **options):
    torch.manual_seed(0)
    model = _module_class(gl.Module if ours else lightning.LightningModule, fail)()
    options = dict(accelerator="cpu", max_epochs=2, log_every_n_steps=2, default_root_dir=root, logger=logger) | options
    if ours:
        trainer = gl.Trainer(**options)
        trainer.fit(model, *_loaders())
        return trainer
    with warnings.catch_warnings():  # Lightning's tips, and torch's LeafSpec deprecation raised inside it
        warnings.simplefilter("ignore")
        trainer = lightning.Trainer(enable_progress_bar=False, enable_model_summary=False, **options)
        trainer.fit(model, *_loaders())
    return trainer


def _tensorboard_run(ours, root):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (root / "lightning_logs" / "version_0").mkdir(parents=True)  # taken: the logger picks version_1
    trainer = _fit(ours, root, TensorBoardLogger(root))
    version = root / "lightning_logs" / "version_1"
    events = EventAccumulator(str(version), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    scalars = {
        tag: [(event.step, round(event.value, 5)) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }
    images = {tag: [event.step for event in events.Images(tag)] for tag in events.Tags()["images"]}
    files = sorted(
        "events.out.tfevents"
        if name.startswith("events.out.tfevents")
        else os.path.relpath(os.path.join(top, name), root)
        for top, _, names in os.walk(root)
        for name in names
    )
    where = (trainer.log_dir, trainer.checkpoint_callback.best_model_path)
    return scalars, images, files, (version / "hparams.yaml").read_text(), [os.path.relpath(p, root) for p in where]


@needs_tensorboard
def test_lightnings_tensorboard_logger_writes_the_same_run(tmp_path):
    ours = _tensorboard_run(True, tmp_path / "gpulayer")
    theirs = _tensorboard_run(False, tmp_path / "lightning")
    assert ours == theirs
    scalars, images, files, hparams, (log_dir, checkpoint) = ours
    assert {"train_loss_step", "train_loss_epoch", "val_loss", "val_step", "epoch", "hp_metric"} <= scalars.keys()
    assert images == {"inputs": [0, 5]}  # self.logger.experiment.add_image in a step
    # Lightning's hparams.yaml: through OmegaConf.save (the keys in their order) where omegaconf is installed
    assert hparams == (
        "width: 4\nlabel: demo\n" if importlib.util.find_spec("omegaconf") else "label: demo\nwidth: 4\n"
    )
    assert (log_dir, checkpoint) == (
        "lightning_logs/version_1",
        "lightning_logs/version_1/checkpoints/epoch=1-step=10.ckpt",
    )
    assert files.count("events.out.tfevents") == 1


@needs_tensorboard
def test_fast_dev_run_puts_a_logger_that_takes_every_call_in_place_of_the_given_one(tmp_path):
    """As Lightning's DummyLogger: self.logger.experiment.add_image runs, nothing is written, log_dir is None."""
    results = []
    for ours in (True, False):
        root = tmp_path / str(ours)
        trainer = _fit(ours, root, TensorBoardLogger(root), fast_dev_run=2)
        written = sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.exists() else []
        results.append((type(trainer.logger).__name__, len(trainer.loggers), trainer.log_dir, written))
    assert results[0] == results[1] == ("DummyLogger", 1, None, [])


def _recording_logger_class(base):
    class Recording(base):
        """Writes nothing locally (no save_dir): records every call the trainer and ModelCheckpoint make."""

        def __init__(self):
            super().__init__()
            self.calls = []

        @property
        def name(self):
            return "recorded"

        @property
        def version(self):
            return "first"

        @property
        def log_dir(self):  # not trainer.log_dir: Lightning takes that from save_dir for a logger of this kind
            return "elsewhere"

        @property
        def experiment(self):
            return self

        def add_image(self, tag, image, step):
            self.calls.append(("add_image", tag, step))

        def log_metrics(self, metrics, step=None):
            self.calls.append(("log_metrics", {k: round(float(v), 5) for k, v in metrics.items()}, step))

        def log_hyperparams(self, params, *args, **kwargs):
            self.calls.append(("log_hyperparams", dict(params)))

        def log_graph(self, model, input_array=None):
            self.calls.append(("log_graph", type(model).__name__))

        def save(self):
            self.calls.append(("save",))

        def finalize(self, status):
            self.calls.append(("finalize", status))

        def after_save_checkpoint(self, checkpoint_callback):
            assert isinstance(checkpoint_callback, weakref.ProxyType)
            self.calls.append(("after_save_checkpoint", os.path.basename(checkpoint_callback.last_model_path or "")))

    return Recording


@pytest.mark.parametrize("fail", [False, True], ids=["finished", "failed"])
def test_a_user_logger_receives_lightnings_calls(tmp_path, fail):
    """The same logger, on gpulayer's Logger and on Lightning's, gets the same calls with the same arguments; with
    no save_dir, checkpoints go to default_root_dir/name/version and trainer.log_dir is None, as in Lightning."""
    results = []
    for ours, base in ((True, gl.Logger), (False, lightning.loggers.Logger)):
        logger = _recording_logger_class(base)()
        root = tmp_path / str(ours)
        try:
            told = _exception_told(ours, logger.calls)
            trainer = _fit(ours, root, logger, fail=fail, callbacks=[_checkpoint(ours, save_last=True), told])
        except RuntimeError:
            assert fail
            where = None
        else:
            where = (trainer.log_dir, os.path.relpath(trainer.checkpoint_callback.dirpath, root))
        results.append((logger.calls if ours else _without_saves_after_evaluation_steps(logger.calls), where))
    assert results[0] == results[1]
    calls, where = results[0]
    assert calls[:3] == [("log_hyperparams", {"width": 4, "label": "demo"}), ("log_graph", "Imaged"), ("save",)]
    assert calls[-2:] == [("on_exception",), ("finalize", "failed")] if fail else calls[-1] == ("finalize", "success")
    if not fail:
        assert where == (None, "recorded/first/checkpoints")
        assert ("after_save_checkpoint", "last.ckpt") in calls


def _exception_told(ours, calls):
    """A callback that records ``on_exception`` among the logger's calls (Lightning finalizes the loggers after it)."""

    class Told(gl.Callback if ours else lightning.Callback):
        def on_exception(self, trainer, pl_module, exception):
            calls.append(("on_exception",))

    return Told()


def _without_saves_after_evaluation_steps(calls):
    """Lightning's calls less the ``save`` after each evaluation step row (``val_step``, logged with
    ``on_step=True``): GPUlayer saves those rows with the evaluation's end row, so no file is written per step."""
    return [
        call
        for index, call in enumerate(calls)
        if not (call == ("save",) and calls[index - 1][0] == "log_metrics" and "val_step" in calls[index - 1][1])
    ]


def _checkpoint(ours, **options):
    if ours:  # gpulayer-callbacks sits above the trainer: its tests alone (CI's isolation step) skip this one
        return pytest.importorskip("gpulayer.callbacks").ModelCheckpoint(**options)
    return lightning.callbacks.ModelCheckpoint(**options)


@pytest.mark.parametrize(
    ("logger", "named"),
    [
        ("tensorboard", "logger='tensorboard'"),
        (TensorBoardLogger, "the class TensorBoardLogger: pass an instance"),
        ([gl.CSVLogger("."), object()], "item 1 is not a logger"),
        (lambda: None, "it lacks name, version"),
    ],
)
def test_a_value_that_is_no_logger_is_refused_naming_logger(tmp_path, logger, named):
    with pytest.raises(TypeError, match="accepted values are True, False, None, a logger") as raised:
        gl.Trainer(accelerator="cpu", logger=logger, default_root_dir=tmp_path)
    assert named in str(raised.value) and str(raised.value).startswith("logger=")
    assert os.listdir(tmp_path) == []


def _fit_on_rank(runtime, root):
    _fit(True, root, TensorBoardLogger(root), devices=2, use_distributed_sampler=False)
    import lightning_utilities.core.rank_zero as rank_zero

    return rank_zero.rank_zero_only.rank


@needs_tensorboard
@pytest.mark.multiprocess
def test_on_two_ranks_only_rank_zero_writes_tensorboard_files(tmp_path):
    # RANK is not set in the harness's ranks: Lightning's rank_zero_only would think each of them is rank 0.
    ranks = run_ranks(_fit_on_rank, tmp_path, world_size=2, timeout=120)
    assert sorted(os.listdir(tmp_path / "lightning_logs")) == ["version_0"]
    events = [name for name in os.listdir(tmp_path / "lightning_logs" / "version_0") if name.startswith("events")]
    assert len(events) == 1
    assert ranks == [0, 1]


def _graph_run(ours, root, datamodule_transfer):
    """``TensorBoardLogger(log_graph=True)`` with ``example_input_array``: Lightning's logger traces the module after
    the stage's ``on_before_batch_transfer`` and transfer hooks (a DataModule's where it overrides one)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    base = gl.Module if ours else lightning.LightningModule
    data_base = gl.DataModule if ours else lightning.LightningDataModule
    seen = []

    class Traced(_module_class(base)):
        def __init__(self):
            super().__init__()
            self.example_input_array = torch.ones(2, 4)

        def forward(self, x):
            return self.layer(x)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            seen.append(("module", "on_before_batch_transfer", tuple(batch.shape) if torch.is_tensor(batch) else None))
            return batch

    class Data(data_base):
        def train_dataloader(self):
            return _loaders()[0]

        def on_after_batch_transfer(self, batch, dataloader_idx):
            seen.append(
                ("datamodule", "on_after_batch_transfer", tuple(batch.shape) if torch.is_tensor(batch) else None)
            )
            return batch

    torch.manual_seed(0)
    options = dict(
        accelerator="cpu", max_epochs=1, default_root_dir=root, logger=TensorBoardLogger(root, log_graph=True)
    )
    datamodule = Data() if datamodule_transfer else None
    loaders = () if datamodule_transfer else (_loaders()[0],)
    if ours:
        with warnings.catch_warnings():  # torch's deprecation (2.10 on) of torch.jit.trace, which add_graph uses
            warnings.filterwarnings("ignore", "`torch.jit.trace(_method)?` is deprecated")  # in any category
            gl.Trainer(**options).fit(Traced(), *loaders, datamodule=datamodule)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lightning.Trainer(enable_progress_bar=False, enable_model_summary=False, **options)
            trainer.fit(Traced(), *loaders, datamodule=datamodule)
    events = EventAccumulator(str(root / "lightning_logs" / "version_0"), size_guidance={"graph": 0})
    events.Reload()
    nodes = sorted(node.name for node in events.Graph().node)
    return nodes, [call for call in seen if call[2] == (2, 4)]  # the example input's calls, not the batches'


@needs_tensorboard
@pytest.mark.parametrize("datamodule_transfer", [False, True], ids=["module", "datamodule"])
def test_tensorboard_log_graph_traces_the_same_graph_through_the_same_hooks(tmp_path, datamodule_transfer):
    ours = _graph_run(True, tmp_path / "gpulayer", datamodule_transfer)
    theirs = _graph_run(False, tmp_path / "lightning", datamodule_transfer)
    assert ours == theirs
    assert ours[0] and ours[1]
