"""``async_save=True`` on one device: the checkpoint callbacks' files are written behind training, and nothing a user
sees through the Trainer changes: the same files with the same contents, the same bookkeeping, the loggers told
after each file is in place, ``ckpt_path="best"``; a write that fails fails ``fit`` and keeps the earlier files. With
``save_last=True`` training does not wait for the top-k file before ``last.ckpt`` is queued behind it."""

import os
import sys
import threading

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.callbacks import ModelCheckpoint
from gpulayer.trainer import Callback, Logger, Module, SingleDeviceStrategy, Trainer
from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.background_writes import BackgroundWrites


class Net(Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(16, 16)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)]


class Recording(Logger):
    """What ``after_save_checkpoint`` sees, as Lightning's MLflow and W&B loggers read it: the files the callback
    names (best, last, the top k) that are in place."""

    def __init__(self, root):
        super().__init__()
        self.root, self.seen = root, []

    name, version = "recording", 0

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def after_save_checkpoint(self, checkpoint_callback):
        named = [checkpoint_callback.best_model_path, checkpoint_callback.last_model_path]
        named += list(checkpoint_callback.best_k_models)
        self.seen.append(sorted({_relative(path, self.root) for path in named if path and os.path.isfile(path)}))


def _relative(path, root):
    return os.path.relpath(path, root) if path else path


def _fit(root, async_save, callbacks=(), **checkpoint_options):
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(48, 16)), batch_size=8)
    checkpoint = ModelCheckpoint(dirpath=root / "checkpoints", **checkpoint_options)
    logger = Recording(root)
    trainer = Trainer(
        default_root_dir=root,
        max_epochs=3,
        strategy=SingleDeviceStrategy(async_save=async_save),
        callbacks=[checkpoint, *callbacks],
        logger=logger,
        enable_progress_bar=False,
        log_every_n_steps=2,
    )
    trainer.fit(Net(), data, data)
    return trainer, checkpoint, logger


def _files(root):
    """Every file under ``root/checkpoints``: a checkpoint's contents with ``root`` taken out of its paths, a link's
    target."""
    found = {}
    for path in sorted((root / "checkpoints").iterdir()):
        if path.is_symlink():
            found[path.name] = ("link", os.readlink(path))
        else:
            found[path.name] = _plain(checkpoint_io.load(path), str(root))
    return found


def _plain(value, root):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.flatten().tolist())
    if isinstance(value, dict):
        return {_plain(key, root): _plain(item, root) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, root) for item in value]
    return value.replace(root, "ROOT") if isinstance(value, str) else value


# Each with whether a checkpoint event writes two files (a top-k file, then a copied last).
CONFIGURATIONS = {
    "top 2 by val_loss, last copied, every 2 steps": (
        dict(monitor="val_loss", save_top_k=2, save_last=True, every_n_train_steps=2),
        True,
    ),
    "every epoch, last linked": (dict(save_top_k=-1, save_last="link"), False),
    "no monitor, the newest kept": (dict(every_n_train_steps=4), False),
}


@pytest.mark.parametrize(("options", "two_files"), CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
def test_the_same_files_bookkeeping_and_logger_calls_as_synchronous_saves(tmp_path, options, two_files):
    synchronous = _fit(tmp_path / "sync", False, **options)
    asynchronous = _fit(tmp_path / "async", True, **options)
    assert _files(tmp_path / "async") == _files(tmp_path / "sync")
    for name in ("best_model_path", "last_model_path", "kth_best_model_path"):
        theirs, ours = (getattr(run[1], name) for run in (synchronous, asynchronous))
        assert _relative(ours, tmp_path / "async") == _relative(theirs, tmp_path / "sync"), name
    told, told_synchronously = asynchronous[2].seen, synchronous[2].seen
    if two_files:  # told once the event's files are in place, a logger told of the first sees the second too
        assert len(told) == len(told_synchronously)
        assert all(set(seen) <= set(ours) for seen, ours in zip(told_synchronously, told, strict=True))
        assert told != told_synchronously
    else:
        assert told == told_synchronously
    assert asynchronous[0].global_step == synchronous[0].global_step == 18


def test_fit_returns_with_every_file_in_place_and_best_loads(tmp_path):
    trainer, checkpoint, _ = _fit(tmp_path, True, monitor="val_loss", save_top_k=1)
    assert trainer.strategy.background_writes is None  # saves after fit are synchronous
    assert not [name for name in os.listdir(checkpoint.dirpath) if checkpoint_io.is_temporary(name)]
    best = Net.load_from_checkpoint(checkpoint.best_model_path)
    assert torch.equal(best.layer.weight, torch.load(checkpoint.best_model_path)["state_dict"]["layer.weight"])
    data = DataLoader(TensorDataset(torch.randn(16, 16)), batch_size=8)
    assert trainer.validate(trainer.lightning_module, data, ckpt_path="best", verbose=False)


class UserSaves(Callback):
    """``trainer.save_checkpoint`` of the user's at each epoch's start: synchronous, after the writes in flight."""

    def on_train_epoch_start(self, trainer, pl_module):
        trainer.save_checkpoint(os.path.join(trainer.default_root_dir, f"user-{trainer.current_epoch}.ckpt"))


@pytest.mark.parametrize("callbacks", [(), (UserSaves(),)], ids=["alone", "with the user's own saves"])
def test_a_write_that_fails_fails_fit_and_keeps_the_earlier_checkpoints(tmp_path, callbacks):
    """The second epoch's file cannot be written (a folder stands at its path): fit fails with the write's error,
    the first epoch's file still loads, and nothing that follows a save (the link, the loggers) ran for it; a user's
    synchronous save in between, which waits for that write, does not swallow its failure."""
    folder = tmp_path / "checkpoints"
    (folder / "epoch=1-step=12.ckpt").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match=r"epoch=1-step=12\.ckpt"), pytest.warns(UserWarning, match="not empty"):
        _fit(tmp_path, True, callbacks, save_top_k=-1, save_last="link", enable_version_counter=False)
    assert checkpoint_io.load(folder / "epoch=0-step=6.ckpt")["global_step"] == 6
    assert os.readlink(folder / "last.ckpt") == "epoch=0-step=6.ckpt"
    assert not [name for name in os.listdir(folder) if checkpoint_io.is_temporary(name)]


class OpenTheGate(Callback):
    """At step 3, a step after the first save: notes which of that event's files are being written and which are on
    disk, then lets the writer go on."""

    def __init__(self, gate):
        self.gate, self.seen = gate, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 3:
            writes, folder = trainer.strategy.background_writes, trainer.checkpoint_callback.dirpath
            paths = [os.path.join(folder, name) for name in ("epoch=0-step=2.ckpt", "last.ckpt")]
            self.seen = [(writes.is_being_written(path), os.path.exists(path)) for path in paths]
            self.gate.set()


def test_training_goes_on_while_the_file_before_last_is_written(tmp_path, monkeypatch):
    """``save_last=True``: the first background write waits for a gate the test holds until the step after the
    save; meanwhile the training thread never waits on a write (the first file, and ``last`` queued behind it, are
    both in flight at that step), and ``last.ckpt``, written after its event's file, is whole and loads."""
    gate, waits_while_held = threading.Event(), []
    write, wait = checkpoint_io.save_atomic, BackgroundWrites.wait

    def gated_write(checkpoint, path):
        if threading.current_thread() is not threading.main_thread():
            assert gate.wait(timeout=120), "nobody opened the gate"  # a guard against a hang, not a synchronisation
        write(checkpoint, path)

    def watched_wait(self):
        if self._in_flight and not gate.is_set():  # the training thread would wait on the held write: noted, let go
            waits_while_held.append(sys._getframe(1).f_code.co_name)
            gate.set()
        wait(self)

    monkeypatch.setattr(checkpoint_io, "save_atomic", gated_write)
    monkeypatch.setattr(BackgroundWrites, "wait", watched_wait)
    release = OpenTheGate(gate)
    trainer, checkpoint, _ = _fit(tmp_path, True, (release,), save_top_k=-1, save_last=True, every_n_train_steps=2)
    assert waits_while_held == []
    assert release.seen == [(True, False), (True, False)]  # both in flight, neither on disk yet
    last = checkpoint_io.load(checkpoint.last_model_path)
    assert last["global_step"] == 18
    assert last["callbacks"][checkpoint.state_key]["last_model_path"] == checkpoint.last_model_path
    loaded = Net.load_from_checkpoint(checkpoint.last_model_path)
    assert torch.equal(loaded.layer.weight, trainer.lightning_module.layer.weight)
    assert not [name for name in os.listdir(checkpoint.dirpath) if checkpoint_io.is_temporary(name)]


@pytest.mark.parametrize("async_save", [False, True], ids=["synchronous", "async_save"])
def test_a_failed_write_is_not_followed_by_its_events_last_checkpoint(tmp_path, async_save):
    """The second epoch's file cannot be written: ``last.ckpt`` queued behind it is not written either, and keeps
    the first epoch's checkpoint, as a synchronous save (which stops at the failure) leaves it."""
    folder = tmp_path / "checkpoints"
    (folder / "epoch=1-step=12.ckpt").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match=r"epoch=1-step=12\.ckpt"), pytest.warns(UserWarning, match="not empty"):
        _fit(tmp_path, async_save, save_top_k=-1, save_last=True, enable_version_counter=False)
    assert checkpoint_io.load(folder / "last.ckpt")["global_step"] == 6
    assert not [name for name in os.listdir(folder) if checkpoint_io.is_temporary(name)]


def test_async_save_takes_a_bool_and_shows_in_the_repr():
    assert repr(SingleDeviceStrategy(async_save=True)) == "SingleDeviceStrategy(async_save=True)"
    with pytest.raises(TypeError, match=r"SingleDeviceStrategy\(async_save='yes'\): accepted values are True and"):
        SingleDeviceStrategy(async_save="yes")
