"""``ModelCheckpoint`` against Lightning 2.6's: the same scripted run under both trainers must
leave the same checkpoint files and the same bookkeeping (paths relative to the run's root folder).

The scripted module logs a monitored value taken from a list: by epoch, or by validation run when validation
runs several times an epoch. Data: 5 training batches and 2 validation batches per epoch, 4 epochs.
"""

from __future__ import annotations

import os
import re
import warnings
from datetime import timedelta

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.callbacks.model_checkpoint import ModelCheckpoint
from gpulayer.trainer import Callback, MisconfigurationException, Module, Trainer

FRAMEWORKS = ("lightning", "gpulayer")
DOWN_UP = [0.5, 0.3, 0.4, 0.2]
RISING = [0.1, 0.2, 0.3, 0.4]


def _loaders() -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(28, 4, generator=generator), torch.randn(28, 1, generator=generator)
    train, val = TensorDataset(x[:20], y[:20]), TensorDataset(x[20:], y[20:])
    return DataLoader(train, batch_size=4), DataLoader(val, batch_size=4)


def _module_class(base: type) -> type:
    class Scripted(base):
        """Logs ``values[i]`` as ``name``: in validation (i = epoch, or validation run with ``per="run"``) or at
        train epoch end (``where="train"``); ``fail_at_step`` raises in ``training_step``."""

        def __init__(
            self, values=(), name="val_loss", where="validation", per="epoch", fail_at_step=None, manual=False
        ):
            super().__init__()
            self.layer = nn.Linear(4, 1)
            self.values, self.name, self.where, self.per = list(values), name, where, per
            self.fail_at_step = fail_at_step
            self.validation_runs = 0
            self.automatic_optimization = not manual  # then two optimizers step by hand: global_step += 2 a batch

        def _value(self, index):
            return torch.tensor(float(self.values[min(index, len(self.values) - 1)]))

        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == self.fail_at_step:
                raise RuntimeError("scripted failure")
            x, y = batch
            loss = F.mse_loss(self.layer(x), y)
            if not self.automatic_optimization:
                for optimizer in self.optimizers():
                    optimizer.zero_grad()
                self.manual_backward(loss)
                for optimizer in self.optimizers():
                    optimizer.step()
            return loss

        def validation_step(self, batch, batch_idx):
            if self.where == "validation" and self.values:
                index = self.validation_runs if self.per == "run" else self.trainer.current_epoch
                self.log(self.name, self._value(index))

        def on_validation_epoch_end(self):
            if not self.trainer.sanity_checking:
                self.validation_runs += 1

        def on_train_epoch_end(self):
            if self.where == "train":
                self.log(self.name, self._value(self.trainer.current_epoch))

        def configure_optimizers(self):
            if self.automatic_optimization:
                return torch.optim.SGD(self.parameters(), lr=0.1)
            return [torch.optim.SGD([self.layer.weight], lr=0.1), torch.optim.SGD([self.layer.bias], lr=0.1)]

    return Scripted


def _fit(framework, root, checkpoints=({},), module=None, validate=True, fit=None, built=None, **trainer_arguments):
    """One ``fit`` under ``framework`` with one ``ModelCheckpoint(**kwargs)`` per entry of ``checkpoints``
    (a ``dirpath`` is taken relative to ``root``; ``CHECKPOINT_NAME_LAST`` is set on the instance); returns the
    callbacks (also appended to ``built``, for runs that raise)."""
    settings = dict(max_epochs=4, logger=False, accelerator="cpu", devices=1, default_root_dir=str(root))
    settings |= dict(num_sanity_val_steps=0) | trainer_arguments
    if framework == "lightning":
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import ModelCheckpoint as Checkpoint

        base, trainer_class = pl.LightningModule, pl.Trainer
        settings |= dict(enable_progress_bar=False, enable_model_summary=False)
    else:
        base, trainer_class, Checkpoint = Module, Trainer, ModelCheckpoint
    torch.manual_seed(0)
    model = _module_class(base)(**(module or {}))
    callbacks = built if built is not None else []
    for kwargs in checkpoints:
        kwargs = _rooted(dict(kwargs), root)
        last_name = kwargs.pop("CHECKPOINT_NAME_LAST", None)
        callbacks.append(Checkpoint(**kwargs))
        if last_name is not None:
            callbacks[-1].CHECKPOINT_NAME_LAST = last_name
    train, val = _loaders()
    trainer_class(callbacks=callbacks, **settings).fit(model, train, val if validate else None, **(fit or {}))
    return callbacks


def _rooted(kwargs, root):
    return kwargs | {"dirpath": os.path.join(root, kwargs["dirpath"])} if kwargs.get("dirpath") else kwargs


def _snapshot(callback, root) -> dict:
    """The files under the callback's ``dirpath`` (symlinks with their target) and its bookkeeping."""

    def relative(path):
        return os.path.relpath(path, root) if path else path

    def number(tensor):
        return None if tensor is None else float(tensor)

    files = []
    for folder, _, names in os.walk(callback.dirpath):
        for name in names:
            path = os.path.join(folder, name)
            files.append(relative(path) + (f" -> {os.readlink(path)}" if os.path.islink(path) else ""))
    return {
        "files": sorted(files),
        "dirpath": relative(callback.dirpath),
        "best_model_path": relative(callback.best_model_path),
        "best_model_score": number(callback.best_model_score),
        "best_k_models": {relative(path): number(score) for path, score in callback.best_k_models.items()},
        "kth_best_model_path": relative(callback.kth_best_model_path),
        "kth_value": number(callback.kth_value),
        "last_model_path": relative(callback.last_model_path),
        "current_score": number(callback.current_score),
    }


def _lightning(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


def _both(tmp_path, **scenario) -> dict[str, list[dict]]:
    """Snapshots of each framework's callbacks after the same scenario, each in its own root folder."""
    snapshots = {}
    for framework in FRAMEWORKS:
        root = str(tmp_path / framework)
        if framework == "lightning":
            callbacks = _lightning(_fit, framework, root, **scenario)
        else:
            callbacks = _fit(framework, root, **scenario)
        snapshots[framework] = [_snapshot(callback, root) for callback in callbacks]
    return snapshots


def _assert_same(tmp_path, **scenario) -> list[dict]:
    snapshots = _both(tmp_path, **scenario)
    assert snapshots["gpulayer"] == snapshots["lightning"]
    return snapshots["gpulayer"]


def _names(snapshot):
    return [os.path.basename(path.split(" -> ")[0]) for path in snapshot["files"]]


MONITOR = {"monitor": "val_loss"}
SCENARIOS = {
    "default": {},
    "no monitor, keep all": dict(checkpoints=[dict(save_top_k=-1)]),
    "no monitor, none, save_last": dict(checkpoints=[dict(save_top_k=0, save_last=True)]),
    "min top 1": dict(checkpoints=[MONITOR], module=dict(values=DOWN_UP)),
    "min top 2 with replacement": dict(checkpoints=[MONITOR | dict(save_top_k=2)], module=dict(values=DOWN_UP)),
    "min keep all": dict(checkpoints=[MONITOR | dict(save_top_k=-1)], module=dict(values=DOWN_UP)),
    "min top 0": dict(checkpoints=[MONITOR | dict(save_top_k=0)], module=dict(values=DOWN_UP)),
    "max top 2": dict(
        checkpoints=[dict(monitor="acc", mode="max", save_top_k=2)], module=dict(values=DOWN_UP, name="acc")
    ),
    "ties do not replace": dict(checkpoints=[MONITOR | dict(save_top_k=2)], module=dict(values=[0.3, 0.3, 0.3, 0.1])),
    "NaN ranks last": dict(
        checkpoints=[MONITOR | dict(save_top_k=2)], module=dict(values=[float("nan"), 0.3, 0.4, 0.2])
    ),
    "min and max side by side": dict(
        checkpoints=[MONITOR | dict(dirpath="low"), MONITOR | dict(dirpath="high", mode="max", save_top_k=2)],
        module=dict(values=DOWN_UP),
    ),
    # Kept from Lightning's ModelCheckpoint: last.ckpt is refreshed only with a top-k save, so here it stays at epoch 0.
    "save_last lags with a monitor": dict(checkpoints=[MONITOR | dict(save_last=True)], module=dict(values=RISING)),
    "save_last link": dict(checkpoints=[MONITOR | dict(save_last="link")], module=dict(values=DOWN_UP)),
    "save_last link, no monitor": dict(checkpoints=[dict(save_last="link", save_top_k=-1)]),
    "save_last link with top 0 writes a file": dict(checkpoints=[dict(save_last="link", save_top_k=0)]),
    "save_last with a filename template": dict(checkpoints=[dict(save_last=True, filename="{epoch}")]),
    "templated last name": dict(checkpoints=[dict(save_last=True, save_top_k=-1, CHECKPOINT_NAME_LAST="{epoch}-last")]),
    "format specs": dict(
        checkpoints=[MONITOR | dict(filename="run-{epoch:02d}-{step:04d}-{val_loss:.2f}", save_top_k=2)],
        module=dict(values=DOWN_UP),
    ),
    "full float without a spec": dict(
        checkpoints=[MONITOR | dict(filename="{val_loss}")], module=dict(values=[0.123456789])
    ),
    "missing key renders 0": dict(checkpoints=[dict(filename="{epoch}-{missing:d}", save_top_k=-1)]),
    "slash in a metric name makes a folder": dict(
        checkpoints=[dict(monitor="val/loss", filename="m-{epoch}-{val/loss:.3f}", save_top_k=2)],
        module=dict(values=DOWN_UP, name="val/loss"),
    ),
    "auto_insert_metric_name False": dict(
        checkpoints=[
            dict(
                monitor="val/loss", filename="e{epoch}-loss{val/loss:.3f}", auto_insert_metric_name=False, save_top_k=-1
            )
        ],
        module=dict(values=DOWN_UP, name="val/loss"),
    ),
    "train metric at epoch end": dict(
        checkpoints=[dict(monitor="train_metric", save_top_k=2)],
        module=dict(values=DOWN_UP, name="train_metric", where="train"),
    ),
    "every_n_epochs 2": dict(checkpoints=[dict(every_n_epochs=2, save_top_k=-1)]),
    "every_n_epochs 2 with a monitor": dict(
        checkpoints=[MONITOR | dict(every_n_epochs=2, save_top_k=-1)], module=dict(values=DOWN_UP)
    ),
    "every_n_train_steps 3": dict(checkpoints=[dict(every_n_train_steps=3, save_top_k=-1)]),
    # Manual optimization, two optimizers: global_step advances by 2 a batch, so only every third step lands on it.
    "every_n_train_steps 3, manual optimization": dict(
        checkpoints=[dict(every_n_train_steps=3, save_top_k=-1, save_last=True)], module=dict(manual=True)
    ),
    "every_n_train_steps 3, no validation": dict(
        checkpoints=[dict(every_n_train_steps=3, save_top_k=-1, save_last=True)], validate=False
    ),
    "every_n_train_steps 3, stale metric at validation end": dict(
        checkpoints=[MONITOR | dict(every_n_train_steps=3, save_top_k=-1, save_on_train_epoch_end=False)],
        module=dict(values=DOWN_UP),
    ),
    # Kept from Lightning's ModelCheckpoint._save_none_monitor_checkpoint: without a monitor, a same-named file
    # from this run is overwritten, never versioned.
    "no monitor overwrites a same-named file": dict(
        checkpoints=[dict(filename="{epoch}", every_n_train_steps=2, save_top_k=-1)]
    ),
    "train_time_interval 0 saves every step": dict(
        checkpoints=[dict(train_time_interval=timedelta(0), save_top_k=-1)], max_epochs=2
    ),
    "save_on_train_epoch_end False, val twice an epoch": dict(
        checkpoints=[MONITOR | dict(save_top_k=2, save_on_train_epoch_end=False)],
        module=dict(values=[0.5, 0.3, 0.4, 0.2, 0.6, 0.1, 0.7, 0.8], per="run"),
        val_check_interval=0.4,
    ),
    "save_on_train_epoch_end True, val twice an epoch": dict(
        checkpoints=[MONITOR | dict(save_top_k=2, save_on_train_epoch_end=True)],
        module=dict(values=[0.5, 0.3, 0.4, 0.2, 0.6, 0.1, 0.7, 0.8], per="run"),
        val_check_interval=0.4,
    ),
    "val_check_interval 1 counts as once an epoch": dict(checkpoints=[dict(save_top_k=-1)], val_check_interval=1),
    "check_val_every_n_epoch 2": dict(checkpoints=[dict(save_top_k=-1)], check_val_every_n_epoch=2),
    "fast_dev_run saves only last at train end": dict(checkpoints=[dict(save_last=True)], fast_dev_run=2),
    "max_steps mid-epoch": dict(checkpoints=[dict(save_top_k=-1, save_last=True)], max_steps=7),
    "sanity check saves nothing": dict(
        checkpoints=[MONITOR | dict(save_top_k=-1)], module=dict(values=DOWN_UP), num_sanity_val_steps=2
    ),
    "version counter, two callbacks, one folder": dict(
        # mode="max" only makes the state keys differ, as Lightning requires of two callbacks in one Trainer.
        checkpoints=[
            dict(dirpath="shared", save_top_k=-1),
            dict(dirpath="shared", save_top_k=-1, mode="max", save_last=True),
        ],
        max_epochs=2,
    ),
    "no version counter, two callbacks, one folder": dict(
        checkpoints=[dict(dirpath="shared", enable_version_counter=False, mode=mode) for mode in ("min", "max")],
        max_epochs=2,
    ),
    "with a CSV logger": dict(checkpoints=[MONITOR | dict(save_top_k=2)], module=dict(values=DOWN_UP), logger=True),
    "verbose": dict(checkpoints=[MONITOR | dict(verbose=True, save_top_k=1)], module=dict(values=DOWN_UP)),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_same_files_and_bookkeeping_as_lightning(tmp_path, scenario):
    _assert_same(tmp_path, **SCENARIOS[scenario])


def test_default_arguments_behave_as_the_trainers_default_checkpoint(tmp_path):
    """``enable_checkpointing`` makes a ``ModelCheckpoint()`` where gpulayer-callbacks is installed (Lightning's
    ``isinstance`` holds), and the trainer's stand-in without it, which behaves the same: same folder, files, best
    path and state key."""
    from gpulayer.trainer.default_checkpoint import DefaultCheckpoint

    assert type(Trainer(accelerator="cpu", logger=False).checkpoint_callback) is ModelCheckpoint
    stand_in = DefaultCheckpoint()
    default = Trainer(
        max_epochs=3, accelerator="cpu", devices=1, default_root_dir=str(tmp_path / "default"), callbacks=[stand_in]
    )
    default.fit(_module_class(Module)(), *_loaders())
    explicit = ModelCheckpoint()
    ours = Trainer(
        max_epochs=3, accelerator="cpu", devices=1, default_root_dir=str(tmp_path / "ours"), callbacks=[explicit]
    )
    ours.fit(_module_class(Module)(), *_loaders())
    assert default.checkpoint_callback is stand_in and ours.checkpoint_callback is explicit
    assert (
        stand_in.state_key
        == explicit.state_key
        == (
            "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
            "'train_time_interval': None}"
        )
    )
    for callback, root in ((stand_in, tmp_path / "default"), (explicit, tmp_path / "ours")):
        assert os.path.relpath(callback.dirpath, root) == os.path.join("lightning_logs", "version_0", "checkpoints")
        assert os.listdir(callback.dirpath) == ["epoch=2-step=15.ckpt"]
        assert os.path.relpath(callback.best_model_path, root).endswith("checkpoints/epoch=2-step=15.ckpt")
        assert callback.last_model_path == ""
        assert explicit.state_key in torch.load(callback.best_model_path, weights_only=True)["callbacks"]


def test_a_deferred_step_save_is_made_at_the_next_validation_end(tmp_path):
    """Deliberate difference: at step 4 ``val_loss`` is not logged yet, so the save waits for validation.
    Lightning drops it when the callback saves at train epoch end (the default); GPUlayer saves at step 5."""
    snapshots = _both(
        tmp_path, checkpoints=[MONITOR | dict(every_n_train_steps=4, save_top_k=-1)], module=dict(values=DOWN_UP)
    )
    later = ["epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt", "epoch=3-step=16.ckpt", "epoch=3-step=20.ckpt"]
    assert _names(snapshots["lightning"][0]) == later
    assert _names(snapshots["gpulayer"][0]) == ["epoch=0-step=5.ckpt", *later]
    assert snapshots["gpulayer"][0]["best_model_path"] == snapshots["lightning"][0]["best_model_path"]


def test_a_templated_last_link_is_removed_when_it_is_replaced(tmp_path):
    """Deliberate difference: with ``CHECKPOINT_NAME_LAST="{epoch}-last"`` and ``save_last="link"`` the previous
    link dangles once its target is replaced; Lightning cannot see it (its exists() follows links) and keeps it."""
    scenario = dict(checkpoints=[dict(save_last="link", CHECKPOINT_NAME_LAST="{epoch}-last")])
    snapshots = _both(tmp_path, **scenario)
    lightning_links = [name for name in snapshots["lightning"][0]["files"] if "-last.ckpt" in name]
    assert len(lightning_links) == 4  # three of them dangling
    assert snapshots["gpulayer"][0]["files"] == [
        "checkpoints/epoch=3-last.ckpt -> epoch=3-step=20.ckpt",
        "checkpoints/epoch=3-step=20.ckpt",
    ]
    assert {k: v for k, v in snapshots["gpulayer"][0].items() if k != "files"} == {
        k: v for k, v in snapshots["lightning"][0].items() if k != "files"
    }


@pytest.mark.parametrize("enable_version_counter", [True, False])
def test_a_second_run_into_the_same_folder_gets_version_suffixes(tmp_path, enable_version_counter):
    scenario = dict(checkpoints=[dict(enable_version_counter=enable_version_counter)], max_epochs=2)
    snapshots = {}
    for framework in FRAMEWORKS:
        root = str(tmp_path / framework)
        _lightning(_fit, framework, root, **scenario)
        if framework == "lightning":
            (callback,) = _lightning(_fit, framework, root, **scenario)
        else:
            with pytest.warns(UserWarning, match="exists and is not empty"):
                (callback,) = _fit(framework, root, **scenario)
        snapshots[framework] = _snapshot(callback, root)
    assert snapshots["gpulayer"] == snapshots["lightning"]
    suffixed = ["epoch=1-step=10-v1.ckpt", "epoch=1-step=10.ckpt"]
    assert _names(snapshots["gpulayer"]) == (suffixed if enable_version_counter else ["epoch=1-step=10.ckpt"])


@pytest.mark.parametrize("weights_only", [True, False])
def test_save_weights_only_and_the_callback_state_in_the_file(tmp_path, weights_only):
    scenario = dict(
        checkpoints=[MONITOR | dict(save_top_k=2, save_weights_only=weights_only)], module=dict(values=DOWN_UP)
    )
    contents = {}
    for framework in FRAMEWORKS:
        root = str(tmp_path / framework)
        (callback,) = _lightning(_fit, framework, root, **scenario)
        checkpoint = torch.load(os.path.join(callback.dirpath, "epoch=1-step=10.ckpt"), weights_only=True)
        states = {key: dict(state) for key, state in checkpoint.get("callbacks", {}).items()}
        for state in states.values():
            for name in ("dirpath", "best_model_path", "kth_best_model_path", "last_model_path"):
                state[name] = os.path.relpath(state[name], root) if state[name] else state[name]
            state["best_k_models"] = {os.path.relpath(p, root): float(v) for p, v in state["best_k_models"].items()}
            for name in ("best_model_score", "current_score", "kth_value"):
                state[name] = float(state[name])
        resumable = {"callbacks", "optimizer_states", "lr_schedulers"} & set(checkpoint)
        contents[framework] = ("state_dict" in checkpoint, sorted(resumable), states)
    assert contents["gpulayer"] == contents["lightning"]
    assert contents["gpulayer"][1] == ([] if weights_only else ["callbacks", "lr_schedulers", "optimizer_states"])


RESUMES = {
    "top 2 with last, from last.ckpt": (MONITOR | dict(dirpath="ckpts", save_top_k=2, save_last=True), "last"),
    # The file it resumed from is the one a better score would replace: it is kept.
    "top 1, from the best file": (MONITOR | dict(dirpath="ckpts"), "best"),
    "no monitor, keep all": (dict(dirpath="ckpts", save_top_k=-1), "best"),
}


@pytest.mark.parametrize("resume", RESUMES)
def test_a_resumed_run_continues_the_top_k_bookkeeping(tmp_path, resume):
    kwargs, which = RESUMES[resume]
    module = dict(values=[0.5, 0.3, 0.4, 0.2, 0.35, 0.1])
    snapshots = {}
    for framework in FRAMEWORKS:
        root = str(tmp_path / framework)
        (first,) = _lightning(_fit, framework, root, checkpoints=[kwargs], module=module, max_epochs=2)
        path = first.last_model_path if which == "last" else first.best_model_path
        scenario = dict(checkpoints=[kwargs], module=module, max_epochs=6, fit={"ckpt_path": path})
        if framework == "lightning":
            (callback,) = _lightning(_fit, framework, root, **scenario)
        else:
            with pytest.warns(UserWarning, match="exists and is not empty"):
                (callback,) = _fit(framework, root, **scenario)
        snapshots[framework] = _snapshot(callback, root)
    assert snapshots["gpulayer"] == snapshots["lightning"]


def test_a_dead_writers_leftover_is_removed_and_never_counted_in_the_top_k(tmp_path):
    # A save killed mid-file leaves a temporary file; the next run into the folder ends as Lightning's run into an
    # empty folder: the same files, the same top-k books.
    kwargs = MONITOR | dict(dirpath="ckpts", save_top_k=2, save_last=True)
    module = dict(values=DOWN_UP)
    snapshots = {}
    for framework in FRAMEWORKS:
        root = tmp_path / framework
        if framework == "lightning":
            (callback,) = _lightning(_fit, framework, str(root), checkpoints=[kwargs], module=module)
        else:
            (root / "ckpts").mkdir(parents=True)
            for name in (".tmp-dead0000.ckpt.partial", ".tmp-dead0001.ckpt"):  # named now, and before the rename
                (root / "ckpts" / name).write_bytes(b"half a checkpoint")  # no writer holds it
            with pytest.warns(UserWarning, match="exists and is not empty"):
                (callback,) = _fit(framework, str(root), checkpoints=[kwargs], module=module)
        snapshots[framework] = _snapshot(callback, str(root))
    assert snapshots["gpulayer"] == snapshots["lightning"]
    assert len(snapshots["gpulayer"]["best_k_models"]) == 2


def test_a_resume_into_another_folder_restores_only_the_best_path(tmp_path):
    snapshots = {}
    for framework in FRAMEWORKS:
        root = str(tmp_path / framework)
        first_kwargs = MONITOR | dict(dirpath="first", save_top_k=2)
        (first,) = _lightning(
            _fit, framework, root, checkpoints=[first_kwargs], module=dict(values=DOWN_UP), max_epochs=2
        )
        scenario = dict(
            checkpoints=[MONITOR | dict(dirpath="second", save_top_k=2)],
            module=dict(values=DOWN_UP),
            fit={"ckpt_path": first.best_model_path},
        )
        if framework == "lightning":
            (callback,) = _lightning(_fit, framework, root, **scenario)
        else:
            with pytest.warns(UserWarning, match="dirpath has changed"):
                (callback,) = _fit(framework, root, **scenario)
        snapshots[framework] = _snapshot(callback, root) | {"first": sorted(os.listdir(first.dirpath))}
    assert snapshots["gpulayer"] == snapshots["lightning"]


def test_only_rank_zero_touches_files_and_every_rank_keeps_the_same_books(tmp_path, monkeypatch):
    scenario = dict(checkpoints=[MONITOR | dict(save_top_k=2, save_last="link")], module=dict(values=DOWN_UP))
    (rank_zero,) = _fit("gpulayer", str(tmp_path / "zero"), **scenario)
    monkeypatch.setattr(Trainer, "is_global_zero", property(lambda self: False))
    (other_rank,) = _fit("gpulayer", str(tmp_path / "other"), **scenario)
    assert not os.path.exists(tmp_path / "other")
    books = _snapshot(other_rank, str(tmp_path / "other")) | {"files": None}
    assert books == _snapshot(rank_zero, str(tmp_path / "zero")) | {"files": None}


def test_save_on_exception_saves_the_step_and_last(tmp_path):
    scenario = dict(
        checkpoints=[dict(save_on_exception=True, save_last=True)], module=dict(fail_at_step=7), max_epochs=3
    )
    snapshots = {}
    for framework in FRAMEWORKS:
        root, built = str(tmp_path / framework), []
        with pytest.raises(RuntimeError, match="scripted failure"):
            _lightning(_fit, framework, root, built=built, **scenario)
        snapshots[framework] = _snapshot(built[0], root)
    assert snapshots["gpulayer"] == snapshots["lightning"]
    assert _names(snapshots["gpulayer"]) == ["epoch=0-step=5.ckpt", "epoch=1-step=7.ckpt", "last.ckpt"]


def test_an_exception_in_on_fit_end_reaches_on_exception_and_saves_as_lightning_does(tmp_path):
    files, heard = {}, {}
    for framework in FRAMEWORKS:
        if framework == "lightning":
            import lightning.pytorch as pl
            from lightning.pytorch.callbacks import ModelCheckpoint as Checkpoint

            callback_base, base, trainer_class = pl.Callback, pl.LightningModule, pl.Trainer
            extra = dict(enable_progress_bar=False, enable_model_summary=False)
        else:
            callback_base, base, trainer_class, Checkpoint, extra = Callback, Module, Trainer, ModelCheckpoint, {}

        class FailsAtFitEnd(callback_base):
            def __init__(self):
                self.exceptions = []

            def on_fit_end(self, trainer, pl_module):
                raise RuntimeError("fails in on_fit_end")

            def on_exception(self, trainer, pl_module, exception):
                self.exceptions.append(str(exception))

        failing = FailsAtFitEnd()
        checkpoint = Checkpoint(dirpath=tmp_path / framework / "ckpt", save_on_exception=True, save_top_k=0)
        trainer = _lightning(
            trainer_class, accelerator="cpu", max_epochs=1, logger=False, callbacks=[failing, checkpoint],
            default_root_dir=tmp_path / framework, **extra,
        )  # fmt: skip
        with pytest.raises(RuntimeError, match="fails in on_fit_end"):
            _lightning(trainer.fit, _module_class(base)(), _loaders()[0])
        files[framework] = sorted(path.name for path in (tmp_path / framework / "ckpt").iterdir())
        heard[framework] = (failing.exceptions, trainer.interrupted)
    assert files["gpulayer"] == files["lightning"] and files["gpulayer"]
    assert heard["gpulayer"] == heard["lightning"] == (["fails in on_fit_end"], True)


def _lightning_class():
    from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

    return LightningModelCheckpoint


REJECTED = {
    "save_top_k below -1": (dict(save_top_k=-2), "save_top_k=-2"),
    "unknown mode": (dict(mode="median"), "mode='median'"),
    "negative every_n_train_steps": (dict(every_n_train_steps=-1), "every_n_train_steps=-1"),
    "negative every_n_epochs": (dict(every_n_epochs=-1), "every_n_epochs=-1"),
    "two triggers": (dict(every_n_train_steps=2, every_n_epochs=1), "at most one"),
    "step and time triggers": (dict(every_n_train_steps=2, train_time_interval=timedelta(seconds=1)), "at most one"),
    "top 2 without a monitor": (dict(save_top_k=2), "monitor=None"),
}


@pytest.mark.parametrize("case", REJECTED)
def test_arguments_lightning_rejects_are_rejected_at_construction(case):
    kwargs, message = REJECTED[case]
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException):
        _lightning(_lightning_class(), **kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelCheckpoint(**kwargs)


def test_arguments_lightning_accepts_silently_are_refused_by_name():
    with pytest.raises(ValueError, match="save_last='yes'"):
        ModelCheckpoint(save_last="yes")
    with pytest.raises(TypeError, match="train_time_interval=60"):
        ModelCheckpoint(train_time_interval=60)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(monitor="val_loss"),
        dict(monitor="acc", mode="max", every_n_epochs=3),
        dict(every_n_train_steps=3),
        dict(train_time_interval=timedelta(minutes=30)),
        dict(every_n_epochs=0, save_top_k=0),
    ],
)
def test_the_state_key_and_triggers_are_lightnings(kwargs):
    theirs, ours = _lightning(_lightning_class(), **kwargs), ModelCheckpoint(**kwargs)
    assert ours.state_key == theirs.state_key
    assert ours.every_n_epochs == theirs.every_n_epochs
    assert (ours._every_n_train_steps, ours._train_time_interval) == (
        theirs._every_n_train_steps,
        theirs._train_time_interval,
    )


def test_a_long_train_time_interval_is_accepted_and_saves_nothing_within_it(tmp_path):
    interval = timedelta(hours=1)
    (callback,) = _fit("gpulayer", str(tmp_path), checkpoints=[dict(train_time_interval=interval)], max_epochs=2)
    assert callback.state_key.endswith("'train_time_interval': datetime.timedelta(seconds=3600)}")
    assert not os.path.exists(callback.dirpath)


NAMES = [
    (dict(filename="{epoch}"), dict(epoch=0), {}),
    (dict(filename="{epoch:03d}"), dict(epoch=5), {}),
    (dict(filename="{epoch}-{val_loss:.2f}"), dict(epoch=2, val_loss=0.123456), {}),
    (dict(filename="{epoch}-{val_loss:.2f}"), dict(epoch=2, val_loss=0.12), dict(filename="{epoch:d}")),
    (
        dict(filename="epoch={epoch}-validation_loss={val_loss:.2f}", auto_insert_metric_name=False),
        dict(epoch=2, val_loss=0.123456),
        {},
    ),
    (dict(filename="{missing:d}"), {}, {}),
    (dict(), dict(epoch=torch.tensor(3), step=torch.tensor(20)), {}),
    (dict(filename="{epoch}-{epoch_test}"), dict(epoch=1, epoch_test=7), {}),
    (dict(filename="{val.acc:.1f}-{val/loss:.3f}"), {"val.acc": 0.25, "val/loss": torch.tensor(0.5)}, {}),
    (dict(filename="{val_loss}"), dict(val_loss=torch.tensor(0.123456789)), {}),
    (dict(filename="{epoch}"), dict(epoch=4), dict(ver=3, prefix="pre")),
    (dict(dirpath="some/dir"), dict(epoch=1, step=2), {}),
]


@pytest.mark.parametrize(("kwargs", "metrics", "call"), NAMES)
def test_checkpoint_names_are_lightnings(kwargs, metrics, call):
    theirs = _lightning(_lightning_class(), **kwargs).format_checkpoint_name(dict(metrics), **call)
    assert ModelCheckpoint(**kwargs).format_checkpoint_name(dict(metrics), **call) == theirs


def test_a_missing_monitor_warns_before_validation_and_fails_after_it(tmp_path):
    no_validation = dict(checkpoints=[dict(monitor="nope")], validate=False, max_epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (theirs,) = _fit("lightning", str(tmp_path / "lightning"), **no_validation)
    assert any("could not find the monitored key" in str(w.message) for w in caught)
    with pytest.warns(UserWarning, match="could not find the monitored key"):
        (ours,) = _fit("gpulayer", str(tmp_path / "gpulayer"), **no_validation)
    assert ours.best_model_path == theirs.best_model_path == "" and not os.path.exists(ours.dirpath)

    with_validation = dict(checkpoints=[dict(monitor="nope")], module=dict(values=DOWN_UP), max_epochs=1)
    with pytest.raises(Exception, match="could not find the monitored key"):
        _lightning(_fit, "lightning", str(tmp_path / "lightning-val"), **with_validation)
    with pytest.raises(MisconfigurationException, match="could not find the monitored key"):  # as Lightning
        _fit("gpulayer", str(tmp_path / "gpulayer-val"), **with_validation)


@pytest.mark.parametrize("folder", ["short", "f" * 130], ids=["short-folder", "paths-over-122-characters"])
def test_to_yaml_writes_lightnings_file(tmp_path, folder):
    scenario = dict(checkpoints=[MONITOR | dict(save_top_k=3)], module=dict(values=DOWN_UP))
    texts = {}
    for framework in FRAMEWORKS:
        # Roots of one length: past 122 characters a path key is written "? path" (PyYAML's rule, followed by both), so
        # a root one character longer on one side changed the file there alone on some temporary folders.
        root = str(tmp_path / framework[0] / folder)
        (callback,) = _lightning(_fit, framework, root, **scenario)
        callback.to_yaml()
        with open(os.path.join(callback.dirpath, "best_k_models.yaml")) as file:
            texts[framework] = file.read().replace(root, "<root>")
    assert texts["gpulayer"] == texts["lightning"]
    if folder != "short":  # (a short folder's keys are simple or not, by the length of the temporary folder)
        assert texts["gpulayer"].startswith("? ")
