"""BasePredictionWriter against Lightning 2.6.6: the same predict runs under both frameworks call the writer with the
same arguments at the same points among the predict hooks, and write the same files; the loop keeps no output
for a batch writer when predictions are not returned; under DDP each rank writes its own share."""

import os
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks import BasePredictionWriter
from gpulayer.runtime.testing import run_ranks

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import BasePredictionWriter as LightningWriter
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

FRAMEWORKS = frameworks(Writer=(LightningWriter, BasePredictionWriter))


def _plain(value):
    """Tensors as lists, containers as lists, so that runs compare with ``==``."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _writer(framework, folder, interval, trace):
    """A writer that saves each call's arguments to a file in ``folder`` and notes the call in ``trace``."""

    class Writer(framework.Writer):
        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
            trace.append(("write_on_batch_end", batch_idx, dataloader_idx, _plain(batch_indices)))
            record = {"prediction": prediction, "batch_indices": batch_indices, "batch": batch}
            torch.save(record, os.path.join(folder, f"batch-{dataloader_idx}-{batch_idx}.pt"))

        def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
            trace.append(("write_on_epoch_end", _plain(predictions), _plain(batch_indices)))
            torch.save({"predictions": predictions, "batch_indices": batch_indices}, os.path.join(folder, "epoch.pt"))

    return Writer(interval)


def _probe(framework, trace):
    """Notes the predict hooks around the writer's, and what the loop holds at each."""

    class Probe(framework.Callback):
        def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            loop = trainer.predict_loop
            trace.append(("on_predict_batch_start", batch_idx, dataloader_idx, _plain(loop.current_batch_indices)))

        def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            trace.append(("on_predict_batch_end", batch_idx, dataloader_idx))

        def on_predict_epoch_end(self, trainer, pl_module):
            loop = trainer.predict_loop
            trace.append(("on_predict_epoch_end", _plain(loop.predictions), _plain(loop.epoch_batch_indices)))

        def on_predict_end(self, trainer, pl_module):
            loop = trainer.predict_loop
            trace.append(("on_predict_end", _plain(loop.predictions), _plain(loop.epoch_batch_indices)))

    return Probe()


def _module(framework, loaders):
    class Doubler(framework.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0))

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            (x,) = batch
            return x * self.scale + dataloader_idx

    return Doubler()


def _dataset(n):
    return TensorDataset(torch.arange(float(n)).unsqueeze(1))


LOADERS = {
    "sequential": lambda: DataLoader(_dataset(10), batch_size=3),
    "drop-last": lambda: DataLoader(_dataset(10), batch_size=4, drop_last=True),
    "shuffled": lambda: DataLoader(
        _dataset(9), batch_size=2, sampler=RandomSampler(_dataset(9), generator=torch.Generator().manual_seed(5))
    ),
    "two-loaders": lambda: [DataLoader(_dataset(5), batch_size=2), DataLoader(_dataset(4), batch_size=3)],
    "no-batch-sampler": lambda: DataLoader(_dataset(3), batch_size=None),
}


def _predict(name, root, interval, loaders, return_predictions=None, trainer_options=None):
    framework = FRAMEWORKS[name]
    folder = root / name
    folder.mkdir(parents=True)
    trace = []
    options = {"accelerator": "cpu", "devices": 1, "logger": False, "default_root_dir": folder}
    callbacks = [_probe(framework, trace), _writer(framework, folder, interval, trace)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = framework.Trainer(callbacks=callbacks, **options | framework.options | (trainer_options or {}))
        returned = trainer.predict(
            _module(framework, loaders), LOADERS[loaders](), return_predictions=return_predictions
        )
    files = {path.name: _plain(list(torch.load(path, weights_only=True).values())) for path in folder.glob("*.pt")}
    indices_warnings = [str(w.message) for w in caught if "batch indices" in str(w.message)]
    return {"returned": _plain(returned), "trace": trace, "files": files, "warnings": indices_warnings}


@pytest.mark.parametrize("interval", ["batch", "epoch", "batch_and_epoch"])
@pytest.mark.parametrize("loaders", list(LOADERS))
@pytest.mark.parametrize("return_predictions", [None, False])
def test_the_writer_is_called_and_writes_as_under_lightning(tmp_path, interval, loaders, return_predictions):
    expected = _predict("lightning", tmp_path, interval, loaders, return_predictions)
    actual = _predict("gpulayer", tmp_path, interval, loaders, return_predictions)
    assert actual == expected
    assert actual["files"], "the writer wrote nothing"
    assert ("epoch.pt" in actual["files"]) == (interval != "batch")


def test_the_documented_batch_indices(tmp_path):
    """Through GPUlayer alone: a sequential loader's indices, batch by batch, the remainder kept (predict never
    drops the last batch), and one list per loader at the epoch's end even for one loader."""
    result = _predict("gpulayer", tmp_path, "batch_and_epoch", "drop-last")
    written = [entry[3] for entry in result["trace"] if entry[0] == "write_on_batch_end"]
    assert written == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    (epoch,) = [entry for entry in result["trace"] if entry[0] == "write_on_epoch_end"]
    assert epoch[2] == [written]
    assert len(epoch[1]) == 3  # predictions: one list of batches, the loader's level dropped


def test_a_limit_on_batches_writes_only_the_batches_run(tmp_path):
    options = {"limit_predict_batches": 2}
    expected = _predict("lightning", tmp_path / "limited", "batch_and_epoch", "sequential", False, options)
    actual = _predict("gpulayer", tmp_path / "limited", "batch_and_epoch", "sequential", False, options)
    assert actual == expected
    assert sorted(actual["files"]) == ["batch-0-0.pt", "batch-0-1.pt", "epoch.pt"]


def test_without_a_writer_the_loader_records_nothing(tmp_path):
    trainer = gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path)
    trainer.predict(_module(FRAMEWORKS["gpulayer"], "sequential"), LOADERS["sequential"]())
    assert type(trainer.predict_dataloaders.batch_sampler) is torch.utils.data.BatchSampler
    assert trainer.predict_loop.epoch_batch_indices == []


class _Watcher(gl.Callback):
    """Holds a weak reference to each output; as each batch ends, counts the earlier outputs still alive."""

    def __init__(self):
        self.outputs, self.alive = [], []

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.alive.append(sum(ref() is not None for ref in self.outputs))
        self.outputs.append(weakref.ref(outputs))


class _BatchWriter(BasePredictionWriter):
    def __init__(self):
        super().__init__("batch")
        self.held = []  # what the loop holds for the writer, per batch: outputs kept, indices kept

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        loop = trainer.predict_loop
        self.held.append((len(loop.predictions), len(loop.epoch_batch_indices[0])))


@pytest.mark.parametrize("return_predictions", [False, True])
def test_a_long_predict_without_returned_predictions_keeps_no_output(tmp_path, return_predictions):
    """With ``return_predictions=False`` and a batch writer, the outputs alive at each batch's end do not grow with
    the run: the loop keeps no list of them (nor of the batch indices), and none outlives ``predict``. Returned,
    every output is kept: the control that shows the test can fail."""
    watcher, writer = _Watcher(), _BatchWriter()
    trainer = gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path, callbacks=[watcher, writer])
    batches = 50
    returned = trainer.predict(
        _module(FRAMEWORKS["gpulayer"], "sequential"),
        DataLoader(_dataset(batches), batch_size=1),
        return_predictions=return_predictions,
    )
    if return_predictions:
        assert watcher.alive == list(range(batches))
        assert len(returned) == batches
    else:
        assert max(watcher.alive) == 1  # the loop's last output, until the next replaces it; never a list
        assert not any(ref() is not None for ref in watcher.outputs)
        assert writer.held == [(0, 0)] * batches
        assert returned is None
        assert trainer.predict_loop.predictions == []


@pytest.mark.parametrize("write_interval", ["x", None, 3, "BATCH", "Epoch"])
def test_a_bad_write_interval_is_refused_as_lightning_refuses_it(write_interval):
    """Lightning's message, naming the argument; Lightning lets another case of a value through its check and
    then fails on it with a ValueError that names no argument, which GPUlayer refuses with the same message."""
    with pytest.raises(ValueError) as ours:
        BasePredictionWriter(write_interval)
    assert str(ours.value) == "`write_interval` should be one of ['batch', 'epoch', 'batch_and_epoch']."
    with pytest.raises((MisconfigurationException, ValueError)) as theirs:
        LightningWriter(write_interval)
    if isinstance(theirs.value, MisconfigurationException):
        assert str(theirs.value) == str(ours.value)
    assert isinstance(ours.value, gl.MisconfigurationException)


def test_the_default_interval_and_an_enum_value_are_taken_as_lightning_takes_them():
    from lightning.pytorch.callbacks.prediction_writer import WriteInterval as LightningInterval

    from gpulayer.callbacks.prediction_writer import WriteInterval

    assert BasePredictionWriter().interval == LightningWriter().interval == "batch"
    assert BasePredictionWriter(WriteInterval.EPOCH).interval is WriteInterval.EPOCH
    for member in LightningInterval:
        ours = BasePredictionWriter(member.value).interval
        assert (ours.value, ours.on_batch, ours.on_epoch) == (member.value, member.on_batch, member.on_epoch)


def test_the_base_writes_nothing_until_overridden(tmp_path):
    trainer = gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path, callbacks=BasePredictionWriter())
    with pytest.raises(NotImplementedError):
        trainer.predict(_module(FRAMEWORKS["gpulayer"], "sequential"), LOADERS["sequential"]())


def test_a_dataloader_iter_predict_step_is_refused_at_setup_as_lightning_refuses_it(tmp_path):
    errors = []
    for name, framework in FRAMEWORKS.items():

        class Iterating(framework.Module):
            def predict_step(self, dataloader_iter):
                return next(dataloader_iter)

        trainer = framework.Trainer(
            accelerator="cpu", logger=False, default_root_dir=tmp_path / name, callbacks=framework.Writer()
        )
        with warnings.catch_warnings(), pytest.raises(NotImplementedError) as error:
            warnings.simplefilter("ignore")
            trainer.predict(Iterating(), LOADERS["sequential"]())
        errors.append(str(error.value))
    assert errors[0] == errors[1] == "The `PredictionWriterCallback` does not support using `dataloader_iter`."


def test_lightnings_writer_or_one_built_on_it_is_refused_naming_gpulayers(tmp_path):
    own = r"Lightning's BasePredictionWriter .*: use gpulayer\.callbacks\.BasePredictionWriter$"
    with pytest.raises(TypeError, match=own):
        gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path, callbacks=[LightningWriter()])

    class Theirs(LightningWriter):
        pass

    built_on = r"built on Lightning's BasePredictionWriter: .* build it on gpulayer\.callbacks\.BasePredictionWriter"
    with pytest.raises(TypeError, match=built_on):
        gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path, callbacks=[Theirs()])


def _two_rank_predict(runtime, folder: str) -> dict:
    """One rank's predict under DDP: an epoch and batch writer saving this rank's files."""
    rank = runtime.global_rank
    trace = []
    path = Path(folder) / f"rank-{rank}"
    path.mkdir()
    writer = _writer(FRAMEWORKS["gpulayer"], path, "batch_and_epoch", trace)
    trainer = gl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", logger=False, default_root_dir=folder, callbacks=[writer]
    )
    returned = trainer.predict(
        _module(FRAMEWORKS["gpulayer"], "sequential"), DataLoader(_dataset(11), batch_size=2), return_predictions=False
    )
    return {"returned": returned, "files": sorted(p.name for p in path.iterdir())}


@pytest.mark.multiprocess
def test_under_ddp_each_rank_writes_its_own_share(tmp_path):
    """2 gloo ranks predict 11 samples: each rank's files hold the indices Lightning's predict sampler gives it
    (``UnrepeatedDistributedSamplerWrapper``: every other index, no padding); together they are the dataset, once."""
    ranks = run_ranks(_two_rank_predict, str(tmp_path), timeout=120)
    everything = []
    for rank, result in enumerate(ranks):
        theirs = list(UnrepeatedDistributedSamplerWrapper(range(11), num_replicas=2, rank=rank, shuffle=False))
        expected_batches = [theirs[i : i + 2] for i in range(0, len(theirs), 2)]
        folder = tmp_path / f"rank-{rank}"
        epoch = torch.load(folder / "epoch.pt", weights_only=True)
        assert epoch["batch_indices"] == [expected_batches]
        assert [p.flatten().tolist() for p in epoch["predictions"]] == [[2.0 * i for i in b] for b in expected_batches]
        for batch_idx, indices in enumerate(expected_batches):
            assert torch.load(folder / f"batch-0-{batch_idx}.pt", weights_only=True)["batch_indices"] == indices
        assert result == {
            "returned": None,
            "files": sorted([f"batch-0-{i}.pt" for i in range(len(expected_batches))] + ["epoch.pt"]),
        }
        everything += theirs
    assert sorted(everything) == list(range(11))
