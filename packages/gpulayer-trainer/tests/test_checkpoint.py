"""Checkpoints: Lightning's layout, atomic writes, safe loading, and resuming to the weights of an unbroken run."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Callback, Module, Trainer, seed_everything
from gpulayer.trainer.checkpoint import checkpoint_io, hpc
from gpulayer.trainer.checkpoint.checkpoint_io import UnsafeCheckpointError


class Regressor(Module):
    def __init__(self, hidden=8, dropout=0.2):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, hidden), torch.nn.Dropout(dropout), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)]


def _loader(shuffle=True):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(40, 4, generator=generator), torch.randn(40, 1, generator=generator))
    return DataLoader(data, batch_size=4, shuffle=shuffle)


class SaveAt(Callback):
    """Saves a checkpoint at one (epoch, batch) point: after a batch, or at the end of an epoch."""

    def __init__(self, path, epoch, batch_idx=None):
        self.path, self.epoch, self.batch_idx = path, epoch, batch_idx

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch_idx):
            trainer.save_checkpoint(self.path)

    def on_train_epoch_end(self, trainer, pl_module):
        if self.batch_idx is None and trainer.current_epoch == self.epoch:
            trainer.save_checkpoint(self.path)


def _trainer(tmp_path, **kwargs):
    options = dict(accelerator="cpu", max_epochs=3, log_every_n_steps=0, enable_checkpointing=False)
    return Trainer(default_root_dir=tmp_path, **(options | kwargs))


def _weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("epoch", "batch_idx"), [(0, None), (1, 3), (1, 9), (0, 0)], ids=str)
def test_a_resumed_run_ends_with_the_weights_of_an_unbroken_run(tmp_path, shuffle, epoch, batch_idx):
    path = tmp_path / "point.ckpt"
    seed_everything(1)
    unbroken = Regressor()
    trainer = _trainer(tmp_path, callbacks=[SaveAt(path, epoch, batch_idx)])
    trainer.fit(unbroken, _loader(shuffle), _loader(False))
    assert path.exists()

    seed_everything(99)  # a different process state: everything that matters must come from the checkpoint
    resumed = Regressor()
    again = _trainer(tmp_path)
    again.fit(resumed, _loader(shuffle), _loader(False), ckpt_path=path)
    torch.testing.assert_close(_weights(resumed), _weights(unbroken), rtol=0, atol=0)
    assert (again.global_step, again.current_epoch) == (trainer.global_step, trainer.current_epoch) == (30, 3)


class DrawsAtTheEnd(Callback):
    """Draws from torch's RNG once training has ended, as a callback that samples a generation would: an
    unbroken run draws it later, so a run resumed after a stop must go on from the RNG states at the stop."""

    def on_train_end(self, trainer, pl_module):
        torch.rand(3)


def _fit_steps(folder, steps, seed, ckpt_path=None, **options):
    """``Regressor`` trained to ``max_steps=steps`` with shuffled 10-batch epochs; returns the Trainer and module."""
    seed_everything(seed)
    model = Regressor()
    trainer = _trainer(folder, max_epochs=None, max_steps=steps, callbacks=[DrawsAtTheEnd()], **options)
    trainer.fit(model, _loader(), _loader(False), ckpt_path=ckpt_path)
    return trainer, model


def _assert_same_end(trainer, model, unbroken_trainer, unbroken):
    """The weights, bit for bit, and the counters (``batches_that_stepped`` is the logger's step)."""
    torch.testing.assert_close(_weights(model), _weights(unbroken), rtol=0, atol=0)
    counters = ("global_step", "epochs_completed", "batches_that_stepped", "total_batches")
    ends = [{name: t.fit_loop.state_dict()[name] for name in counters} for t in (trainer, unbroken_trainer)]
    assert ends[0] == ends[1]


# The resumed run has no checkpoint callback to take the saved one's state: Lightning's warning says so.
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`:UserWarning")
@pytest.mark.parametrize("then_steps", [8, 14], ids=lambda steps: f"6->{steps}")
@pytest.mark.parametrize("saved_by", ["save_checkpoint after fit", "the default checkpoint at the stop"])
def test_a_run_max_steps_stopped_mid_epoch_resumes_to_the_weights_of_an_unbroken_run(tmp_path, saved_by, then_steps):
    """``max_steps=6`` stops the 10-batch epoch at batch 5, and that ends the epoch (Lightning's counters:
    ``current_epoch`` 1). A new Trainer with ``max_steps=then_steps`` goes on in the stopped epoch, as an unbroken
    run would (14 crosses into the next one), and ends with its weights and counters."""
    unbroken = _fit_steps(tmp_path / "unbroken", then_steps, seed=1)
    stopped, _ = _fit_steps(
        tmp_path / "stopped", 6, seed=1, enable_checkpointing=saved_by != "save_checkpoint after fit"
    )
    assert (stopped.global_step, stopped.current_epoch) == (6, 1)
    if stopped.checkpoint_callback is None:
        path = tmp_path / "after-fit.ckpt"
        stopped.save_checkpoint(path)
    else:
        path = stopped.checkpoint_callback.best_model_path
        assert path.endswith("epoch=0-step=6.ckpt")
    # seed 99: a different process state, so everything that matters must come from the checkpoint
    _assert_same_end(*_fit_steps(tmp_path / "resumed", then_steps, seed=99, ckpt_path=path), *unbroken)


def test_a_resume_that_trains_nothing_keeps_the_stop_to_go_on_from(tmp_path):
    """Resumed with the same ``max_steps=6``, the run ends at once with the stopped run's weights and counters
    (``current_epoch`` 1, as Lightning); the file it saves still goes on to the unbroken run's end."""
    stopped, stopped_model = _fit_steps(tmp_path / "stopped", 6, seed=1)
    stopped.save_checkpoint(tmp_path / "stopped.ckpt")
    again, model = _fit_steps(tmp_path / "again", 6, seed=99, ckpt_path=tmp_path / "stopped.ckpt")
    _assert_same_end(again, model, stopped, stopped_model)
    assert (again.global_step, again.current_epoch) == (6, 1)
    again.save_checkpoint(tmp_path / "again.ckpt")
    resumed = _fit_steps(tmp_path / "resumed", 14, seed=99, ckpt_path=tmp_path / "again.ckpt")
    _assert_same_end(*resumed, *_fit_steps(tmp_path / "unbroken", 14, seed=1))


def test_the_file_has_lightnings_top_level_layout(tmp_path):
    path = tmp_path / "end.ckpt"
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(Regressor(hidden=6), _loader())
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    assert list(checkpoint)[:5] == [
        "epoch",
        "global_step",
        "pytorch-lightning_version",
        "gpulayer_version",
        "state_dict",
    ]
    assert {"loops", "callbacks", "optimizer_states", "lr_schedulers", "hparams_name", "hyper_parameters"} <= set(
        checkpoint
    )
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (2, 20)
    assert checkpoint["hyper_parameters"] == {"hidden": 6, "dropout": 0.2} and checkpoint["hparams_name"] == "kwargs"
    trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    weights = torch.load(tmp_path / "weights.ckpt", weights_only=True)
    assert not {"optimizer_states", "lr_schedulers", "callbacks"} & set(weights)


def test_a_gpulayer_checkpoint_loads_in_lightning_and_a_lightning_one_in_gpulayer(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import lightning.pytorch as pl

        class LightningRegressor(pl.LightningModule):
            def __init__(self, hidden=8, dropout=0.2):
                super().__init__()
                self.save_hyperparameters()
                self.net = torch.nn.Sequential(
                    torch.nn.Linear(4, hidden), torch.nn.Dropout(dropout), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
                )

            def training_step(self, batch, batch_idx):
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.05)

        ours = tmp_path / "ours.ckpt"
        trainer = _trainer(tmp_path, max_epochs=1)
        model = Regressor(hidden=5)
        trainer.fit(model, _loader())
        trainer.save_checkpoint(ours)
        in_lightning = LightningRegressor.load_from_checkpoint(ours)
        assert in_lightning.hparams.hidden == 5
        torch.testing.assert_close(_weights(in_lightning), _weights(model), rtol=0, atol=0)

        theirs = tmp_path / "theirs.ckpt"
        lightning_trainer = pl.Trainer(
            accelerator="cpu",
            max_epochs=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            default_root_dir=tmp_path,
        )
        lightning_model = LightningRegressor(hidden=7)
        lightning_trainer.fit(lightning_model, _loader())
        lightning_trainer.save_checkpoint(theirs)
    in_gpulayer = Regressor.load_from_checkpoint(theirs)
    assert in_gpulayer.hparams.hidden == 7 and in_gpulayer.training
    torch.testing.assert_close(_weights(in_gpulayer), _weights(lightning_model), rtol=0, atol=0)


_EVIL = """
import os
class Evil:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
"""


def test_a_checkpoint_holding_code_is_refused_and_the_code_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    namespace = {}
    exec(textwrap.dedent(_EVIL.format(marker=marker)), namespace)
    trainer = _trainer(tmp_path, max_epochs=1)
    model = Regressor()
    trainer.fit(model, _loader())
    path = tmp_path / "evil.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["payload"] = namespace["Evil"]()
    torch.save(checkpoint, path)

    with pytest.raises(UnsafeCheckpointError, match=r"os\.system|posix\.system") as refused:
        _trainer(tmp_path).fit(Regressor(), _loader(), ckpt_path=path)
    assert "weights_only=False" in str(refused.value)
    with pytest.raises(UnsafeCheckpointError):
        Regressor.load_from_checkpoint(path)
    assert not marker.exists()


def test_a_missing_checkpoint_is_named(tmp_path):
    missing = tmp_path / "nowhere.ckpt"
    with pytest.raises(FileNotFoundError, match=r"nowhere\.ckpt"):
        _trainer(tmp_path).fit(Regressor(), _loader(), ckpt_path=missing)


def test_a_weights_only_checkpoint_cannot_resume_fit(tmp_path):
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(Regressor(), _loader())
    trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    with pytest.raises(KeyError, match="optimizer_states"):
        _trainer(tmp_path).fit(Regressor(), _loader(), ckpt_path=tmp_path / "weights.ckpt")


def test_default_checkpointing_keeps_the_newest_epoch_file_and_best_resumes_from_it(tmp_path):
    trainer = Trainer(accelerator="cpu", max_epochs=2, log_every_n_steps=0, default_root_dir=tmp_path)
    trainer.fit(Regressor(), _loader(), _loader(False))
    folder = tmp_path / "lightning_logs" / "version_0" / "checkpoints"  # Lightning's place with its CSV logger
    assert sorted(os.listdir(folder)) == ["epoch=1-step=20.ckpt"]
    assert trainer.checkpoint_callback.best_model_path == str(folder / "epoch=1-step=20.ckpt")
    result = trainer.validate(dataloaders=_loader(False), ckpt_path="best", verbose=False)
    assert trainer.ckpt_path.endswith("epoch=1-step=20.ckpt") and "val_loss" in result[0]


def test_the_default_checkpoint_answers_what_lightnings_loggers_read_as_model_checkpoint_does():
    """MLFlowLogger and WandbLogger read a checkpoint callback's settings and scores after each save; with
    gpulayer-trainer alone the default checkpoint is the trainer's own, which answers as ``ModelCheckpoint()``."""
    from gpulayer.trainer.default_checkpoint import DefaultCheckpoint

    lightning = pytest.importorskip("lightning.pytorch.callbacks")
    read = ["monitor", "mode", "save_last", "save_top_k", "save_weights_only", "_every_n_train_steps"]
    read += ["best_model_path", "last_model_path", "best_model_score", "current_score", "best_k_models"]
    ours, theirs = DefaultCheckpoint(), lightning.ModelCheckpoint()
    assert {name: getattr(ours, name) for name in read} == {name: getattr(theirs, name) for name in read}


def test_validate_test_and_predict_load_weights_from_a_checkpoint(tmp_path):
    trainer = _trainer(tmp_path, max_epochs=1)
    trained = Regressor()
    trainer.fit(trained, _loader())
    trainer.save_checkpoint(tmp_path / "w.ckpt")
    fresh = Regressor()
    before = trainer.validate(fresh, _loader(False), verbose=False)
    after = trainer.validate(fresh, _loader(False), ckpt_path=tmp_path / "w.ckpt", verbose=False)
    torch.testing.assert_close(_weights(fresh), _weights(trained), rtol=0, atol=0)
    assert before != after


_KILLED_MID_SAVE = """
import sys, torch
from gpulayer.trainer.checkpoint import checkpoint_io

def half_then_block(obj, file):
    file.write(b"x" * 1_000_000)
    file.flush()
    print("half written", flush=True)
    sys.stdin.read()  # the parent kills this process here

checkpoint_io.torch.save = half_then_block
checkpoint_io.TEMPORARY_SUFFIX = sys.argv[2]  # ".ckpt": a writer of a GPUlayer from before the rename
checkpoint_io.save_atomic({"state": torch.zeros(3)}, sys.argv[1])
"""


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "run.ckpt"
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(Regressor(), _loader())
    trainer.save_checkpoint(path)
    before = path.read_bytes()
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_SAVE, str(path), checkpoint_io.TEMPORARY_SUFFIX],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as child:
        try:
            assert child.stdout.readline() == b"half written\n"
            assert any(name.startswith(".tmp-") for name in os.listdir(tmp_path)), "the save was under way"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
    assert path.read_bytes() == before
    resumed = _trainer(tmp_path, max_epochs=2)
    resumed.fit(Regressor(), _loader(), ckpt_path=path)
    assert resumed.global_step == 20


@contextlib.contextmanager
def _writer_stopped_mid_save(path, suffix=checkpoint_io.TEMPORARY_SUFFIX):
    """A process that has written half of ``path``'s temporary file (named ``.tmp-*<suffix>``) and waits (on its
    stdin) to finish the save; killed, if still running, when the block ends."""
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_SAVE, str(path), suffix], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        try:
            assert child.stdout.readline() == b"half written\n"
            yield child
        finally:
            child.kill()


def _temporaries(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith(".tmp-"))


@pytest.mark.parametrize("suffix", [".ckpt.partial", ".ckpt"], ids=["named now", "named before the rename"])
def test_the_next_save_removes_a_dead_writers_temporary_and_never_a_live_ones(tmp_path, suffix):
    # The live writer starts first: a writer's own save sweeps the folder too, and this test's save must be the one.
    with _writer_stopped_mid_save(tmp_path / "live.ckpt", suffix) as live:  # another job in the folder, writing
        (being_written,) = _temporaries(tmp_path)
        with _writer_stopped_mid_save(tmp_path / "dead.ckpt", suffix):
            (left_by_dead,) = set(_temporaries(tmp_path)) - {being_written}
        assert left_by_dead.endswith(suffix) and left_by_dead in _temporaries(tmp_path)
        checkpoint_io.save_atomic({"step": 1}, tmp_path / "mine.ckpt")
        assert _temporaries(tmp_path) == [being_written], "only the dead writer's file should be gone"
        live.stdin.close()  # the live writer finishes its save, undisturbed
        assert live.wait(timeout=60) == 0
    assert _temporaries(tmp_path) == []
    assert (tmp_path / "live.ckpt").stat().st_size == 1_000_000
    assert checkpoint_io.load(tmp_path / "mine.ckpt") == {"step": 1}


def test_no_checkpoint_pattern_finds_a_dead_writers_temporary(tmp_path):
    # Where users and Lightning look for the newest checkpoint: a glob, "last", the hpc_ckpt_N.ckpt counter.
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(Regressor(), _loader())
    trainer.save_checkpoint(tmp_path / "hpc_ckpt_1.ckpt")
    with _writer_stopped_mid_save(tmp_path / "hpc_ckpt_2.ckpt"):
        pass
    with _writer_stopped_mid_save(tmp_path / "checkpoints" / "last.ckpt"):
        pass
    assert len(_temporaries(tmp_path)) == len(_temporaries(tmp_path / "checkpoints")) == 1
    assert [path.name for path in tmp_path.rglob("*.ckpt")] == ["hpc_ckpt_1.ckpt"]
    assert sorted(tmp_path.glob("*.ckpt"))[-1].name == "hpc_ckpt_1.ckpt"
    assert list((tmp_path / "checkpoints").glob("*.ckpt")) == []
    assert hpc.hpc_resume_path(str(tmp_path)).endswith("hpc_ckpt_1.ckpt")
    resumed = _trainer(tmp_path, max_epochs=1, enable_checkpointing=True, logger=False)
    with warnings.catch_warnings(), pytest.warns(UserWarning, match=r"no last\*\.ckpt found"):
        warnings.filterwarnings("ignore", "Checkpoint directory .* exists and is not empty", UserWarning)
        resumed.fit(Regressor(), _loader(), ckpt_path="last")
    assert resumed.ckpt_path is None


def test_a_restarted_worker_resumes_from_a_checkpoint_never_from_a_dead_writers_temporary(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"  # the default checkpoint's folder, without a logger
    options = dict(enable_checkpointing=True, logger=False)
    _trainer(tmp_path, max_epochs=1, **options).fit(Regressor(), _loader())
    with _writer_stopped_mid_save(folder / "next.ckpt"):  # the newest file in the folder: half a checkpoint
        pass
    assert len(_temporaries(folder)) == 1
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    resumed = _trainer(tmp_path, max_epochs=2, **options)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Checkpoint directory .* exists and is not empty", UserWarning)
        resumed.fit(Regressor(), _loader())
    assert resumed.global_step == 20
    assert "epoch=1-step=20.ckpt" in os.listdir(folder)
    assert _temporaries(folder) == [], "the save after epoch 1 removes the leftover"


class _Stream(torch.utils.data.IterableDataset):
    """A deterministic stream without a length or a state: it can be replayed, not positioned."""

    def __iter__(self):
        generator = torch.Generator().manual_seed(0)
        for _ in range(40):
            yield torch.randn(4, generator=generator), torch.randn(1, generator=generator)


def test_a_loader_without_length_resumes_by_replaying_with_a_warning(tmp_path):
    path = tmp_path / "stream.ckpt"
    seed_everything(1)
    unbroken = Regressor(dropout=0.0)
    trainer = _trainer(tmp_path, max_epochs=2, callbacks=[SaveAt(path, 1, 4)])
    trainer.fit(unbroken, DataLoader(_Stream(), batch_size=4))
    resumed = Regressor(dropout=0.0)
    with pytest.warns(UserWarning, match="read again and skipped"):
        _trainer(tmp_path, max_epochs=2).fit(resumed, DataLoader(_Stream(), batch_size=4), ckpt_path=path)
    torch.testing.assert_close(_weights(resumed), _weights(unbroken), rtol=0, atol=0)


def test_default_checkpointing_into_a_used_folder_counts_versions_and_keeps_the_resumed_file(tmp_path):
    """Lightning's default ModelCheckpoint: a second run into the same folder warns and writes ``-v1`` names; a run
    resumed from a file in that folder never deletes it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import lightning.pytorch as pl

        class LightningRegressor(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.05)

        options = dict(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False)
        for _ in range(2):
            pl.Trainer(default_root_dir=tmp_path / "lightning", enable_model_summary=False, **options).fit(
                LightningRegressor(), _loader()
            )
        first = tmp_path / "lightning" / "checkpoints" / "epoch=0-step=10.ckpt"
        pl.Trainer(
            default_root_dir=tmp_path / "lightning", enable_model_summary=False, **(options | {"max_epochs": 2})
        ).fit(LightningRegressor(), _loader(), ckpt_path=first)
    ours = dict(accelerator="cpu", max_epochs=1, logger=False, log_every_n_steps=0, default_root_dir=tmp_path / "ours")
    Trainer(**ours).fit(Regressor(), _loader())
    with pytest.warns(UserWarning, match="exists and is not empty"):
        Trainer(**ours).fit(Regressor(), _loader())
    with pytest.warns(UserWarning, match="exists and is not empty"):
        Trainer(**(ours | {"max_epochs": 2})).fit(
            Regressor(), _loader(), ckpt_path=tmp_path / "ours" / "checkpoints" / "epoch=0-step=10.ckpt"
        )
    assert sorted(os.listdir(tmp_path / "ours" / "checkpoints")) == sorted(
        os.listdir(tmp_path / "lightning" / "checkpoints")
    )
