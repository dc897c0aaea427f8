"""LearningRateMonitor against Lightning 2.6's: whole runs with a CSV logger (GPUlayer's default) under both,
comparing metrics.csv line for line, the lr values in ``callback_metrics`` after every batch, and the
monitor's own history (``lrs``, ``last_momentum_values``, ``last_weight_decay_values``)."""

import logging
import os
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gpulayer
from gpulayer.callbacks.lr_monitor import LearningRateMonitor

MOMENTUM_WARNING = "You have set log_momentum=True, but some optimizers do not have momentum"
NO_LOGGER_ERROR = "Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger."


# ---- what configure_optimizers returns, per scenario -----------------------------------------------------------
def sgd_with_step_lr(module):
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def adam_with_step_interval(module):
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01, weight_decay=0.001)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def two_param_groups(module):
    optimizer = torch.optim.SGD(
        [{"params": module.layer.parameters()}, {"params": module.head.parameters(), "lr": 0.01, "weight_decay": 0.1}],
        lr=0.1,
        momentum=0.5,
    )
    return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def named_param_groups(module):
    optimizer = torch.optim.Adam(
        [{"params": module.layer.parameters(), "name": "body"}, {"params": module.head.parameters(), "name": "head"}],
        lr=0.01,
    )
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 2}}


def one_named_param_group(module):
    return torch.optim.Adam([{"params": module.parameters(), "name": "everything"}], lr=0.01)


def named_scheduler(module):
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "name": "my_lr"}}


def without_scheduler(module):
    return torch.optim.Adam(module.parameters(), lr=0.02)


def three_schedulers(module):
    """Two unnamed schedulers of one SGD: lr-SGD and lr-SGD-1; a named one after them: Lightning's custom-1."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    return [optimizer], [
        torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
        {"scheduler": torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9), "interval": "step"},
        {"scheduler": torch.optim.lr_scheduler.MultiplicativeLR(optimizer, lambda epoch: 0.95), "name": "custom"},
    ]


def adagrad_without_momentum(module):
    return torch.optim.Adagrad(module.parameters(), lr=0.1)


def head_joins_later(module):
    """The head's parameters join as a second param group after epoch 0 (see ``Scenario.grow_at_epoch``)."""
    optimizer = torch.optim.SGD(module.layer.parameters(), lr=0.1)
    return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def duplicate_group_names(module):
    return torch.optim.SGD(
        [{"params": module.layer.parameters(), "name": "same"}, {"params": module.head.parameters(), "name": "same"}],
        lr=0.1,
    )


# ---- one run under either framework ----------------------------------------------------------------------------
def two_adams_stepped_by_hand(module):
    """Manual optimization: the layer's and the head's Adam, each with a scheduler: lr-Adam and lr-Adam-1."""
    optimizers = [torch.optim.Adam(part.parameters(), lr=0.01) for part in (module.layer, module.head)]
    return optimizers, [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5) for optimizer in optimizers]


def sgd_and_adam_stepped_by_hand(module):
    return [
        torch.optim.SGD(module.layer.parameters(), lr=0.1, momentum=0.9),
        torch.optim.Adam(module.head.parameters()),
    ]


def _module_class(base, configure, grow_at_epoch=None, stop_at_batch=None):
    manual = configure in (two_adams_stepped_by_hand, sgd_and_adam_stepped_by_hand)

    class Monitored(base):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)
            self.head = nn.Linear(4, 1)
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.mse_loss(self.layer(x) + self.head(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            if self.current_epoch == 0 and batch_idx == stop_at_batch:
                self.trainer.should_stop = True
            if manual:
                self._step_by_hand(loss)
            return loss

        def _step_by_hand(self, loss):
            for optimizer in self.optimizers():
                optimizer.zero_grad()
            self.manual_backward(loss)
            for optimizer in self.optimizers():
                optimizer.step()
            if self.trainer.is_last_batch:
                for scheduler in self.lr_schedulers() or []:
                    scheduler.step()

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.mse_loss(self.layer(x) + self.head(x), y))

        def on_train_epoch_end(self):
            if self.current_epoch == grow_at_epoch:
                self.trainer.optimizers[0].add_param_group({"params": self.head.parameters(), "lr": 0.05})

        def configure_optimizers(self):
            return configure(self)

    return Monitored


def _recorder_class(base):
    class Recorder(base):
        """Every value ``callback_metrics`` holds besides the module's own, after every batch and epoch."""

        def __init__(self):
            self.trace = []

        def _record(self, trainer, where):
            metrics = trainer.callback_metrics
            self.trace.append(
                (
                    where,
                    trainer.global_step,
                    {k: (v.item(), str(v.dtype)) for k, v in metrics.items() if "loss" not in k},
                )
            )

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._record(trainer, f"batch {batch_idx}")

        def on_train_epoch_end(self, trainer, pl_module):
            self._record(trainer, "epoch end")

    return Recorder


def _loaders():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(20, 4, generator=generator), torch.randn(20, 1, generator=generator))
    return DataLoader(data, batch_size=4), DataLoader(data, batch_size=10)


def _run(framework, root, configure, monitor, trainer_arguments, grow_at_epoch=None, stop_at_batch=None):
    """Fit 3 epochs of 5 batches; returns (metrics.csv lines, the recorder's trace, the monitor's history)."""
    ours = framework is gpulayer
    torch.manual_seed(0)
    model = _module_class(
        gpulayer.Module if ours else framework.LightningModule, configure, grow_at_epoch, stop_at_batch
    )()
    monitor_class = LearningRateMonitor if ours else framework.callbacks.LearningRateMonitor
    lr_monitor = monitor_class(**monitor)
    recorder = _recorder_class(gpulayer.Callback if ours else framework.Callback)()
    options = (
        dict(
            accelerator="cpu",
            devices=1,
            max_epochs=3,
            enable_checkpointing=False,
            default_root_dir=root,
            callbacks=[lr_monitor, recorder],
        )
        | trainer_arguments
    )
    if ours:
        trainer = gpulayer.Trainer(**options)
    else:
        # Lightning's default logger is this CSVLogger only where tensorboard is not installed: say it outright.
        options = {"logger": framework.loggers.CSVLogger(root)} | options
        trainer = framework.Trainer(enable_progress_bar=False, enable_model_summary=False, **options)
    trainer.fit(model, *_loaders())
    csv = root / "lightning_logs" / "version_0" / "metrics.csv"
    lines = csv.read_text().splitlines() if csv.exists() else None
    history = (lr_monitor.lrs, lr_monitor.last_momentum_values, lr_monitor.last_weight_decay_values)
    return lines, recorder.trace, history


def _lightning():
    import lightning.pytorch as pl

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    return pl


def _run_lightning(root, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(_lightning(), root / "lightning", *args, **kwargs)


MOMENTUM, DECAY = dict(log_momentum=True), dict(log_weight_decay=True)
STEP, EPOCH = dict(logging_interval="step"), dict(logging_interval="epoch")


def every(n, **more):
    return dict(log_every_n_steps=n, **more)


# id: (configure_optimizers, monitor arguments, trainer arguments, the lr columns of metrics.csv)
SCENARIOS = {
    "sgd-momentum-steplr": (sgd_with_step_lr, MOMENTUM, every(2), "lr-SGD,lr-SGD-momentum"),
    "sgd-steplr-interval-step": (sgd_with_step_lr, STEP, every(3), "lr-SGD"),
    "sgd-steplr-interval-epoch": (sgd_with_step_lr, EPOCH, every(1), "lr-SGD"),
    "sgd-steplr-never-step-logs": (sgd_with_step_lr, {}, every(0), "lr-SGD"),
    "adam-step-scheduler": (
        adam_with_step_interval,
        MOMENTUM | DECAY,
        every(1),
        "lr-Adam,lr-Adam-momentum,lr-Adam-weight_decay",
    ),
    "adam-step-scheduler-every-3": (adam_with_step_interval, {}, every(3), "lr-Adam"),
    "adam-step-scheduler-interval-epoch": (
        adam_with_step_interval,
        EPOCH | MOMENTUM,
        every(2),
        "lr-Adam,lr-Adam-momentum",
    ),
    # A step-interval scheduler logs only on the step cadence, which log_every_n_steps=0 turns off.
    "adam-step-scheduler-never": (adam_with_step_interval, {}, every(0), ""),
    "adam-step-scheduler-never-interval-step": (adam_with_step_interval, STEP, every(0), ""),
    # Accumulating batches count as the batch about to step: rows before both batches of a window.
    "adam-accumulate-2-every-1": (
        adam_with_step_interval,
        MOMENTUM,
        every(1, accumulate_grad_batches=2),
        "lr-Adam,lr-Adam-momentum",
    ),
    "adam-accumulate-2-every-2": (adam_with_step_interval, {}, every(2, accumulate_grad_batches=2), "lr-Adam"),
    "two-param-groups": (
        two_param_groups,
        MOMENTUM | DECAY,
        every(2),
        "lr-SGD/pg1,lr-SGD/pg1-momentum,lr-SGD/pg1-weight_decay,lr-SGD/pg2,lr-SGD/pg2-momentum,lr-SGD/pg2-weight_decay",
    ),
    "two-param-groups-interval-step": (two_param_groups, STEP, every(1), "lr-SGD/pg1,lr-SGD/pg2"),
    "named-param-groups": (
        named_param_groups,
        DECAY,
        every(2),
        "lr-Adam/body,lr-Adam/body-weight_decay,lr-Adam/head,lr-Adam/head-weight_decay",
    ),
    "one-named-param-group": (
        one_named_param_group,
        MOMENTUM,
        every(3),
        "lr-Adam/everything,lr-Adam/everything-momentum",
    ),
    "named-scheduler": (named_scheduler, MOMENTUM, every(2), "my_lr,my_lr-momentum"),
    "named-scheduler-interval-step": (named_scheduler, STEP, every(2), "my_lr"),
    # An optimizer without a scheduler logs at both points.
    "without-scheduler": (without_scheduler, MOMENTUM, every(2), "lr-Adam,lr-Adam-momentum"),
    "without-scheduler-interval-step": (without_scheduler, STEP, every(1, accumulate_grad_batches=2), "lr-Adam"),
    "without-scheduler-interval-epoch": (without_scheduler, EPOCH, every(3), "lr-Adam"),
    "without-scheduler-never": (without_scheduler, {}, every(0), "lr-Adam"),
    "three-schedulers": (three_schedulers, {}, every(2), "custom-1,lr-SGD,lr-SGD-1"),
    "three-schedulers-interval-step": (three_schedulers, STEP, every(3), "custom-1,lr-SGD,lr-SGD-1"),
    "max-steps-mid-epoch": (adam_with_step_interval, {}, every(2, max_steps=7, max_epochs=-1), "lr-Adam"),
    # Manual optimization: several optimizers, global_step advancing by two a batch.
    "manual-two-adams": (two_adams_stepped_by_hand, {}, every(2), "lr-Adam,lr-Adam-1"),
    "manual-two-adams-interval-step": (two_adams_stepped_by_hand, STEP, every(1), "lr-Adam,lr-Adam-1"),
    "manual-sgd-and-adam": (sgd_and_adam_stepped_by_hand, {}, every(3), "lr-Adam,lr-SGD"),
}


def _lr_columns(header):
    return ",".join(c for c in header.split(",") if c not in ("epoch", "step") and "loss" not in c)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_metrics_csv_callback_metrics_and_history_match_lightnings(tmp_path, scenario):
    configure, monitor, trainer_arguments, lr_columns = SCENARIOS[scenario]
    theirs = _run_lightning(tmp_path, configure, monitor, trainer_arguments)
    ours = _run(gpulayer, tmp_path / "gpulayer", configure, monitor, trainer_arguments)
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]
    assert ours[2] == theirs[2]
    assert _lr_columns(ours[0][0]) == lr_columns


def test_a_param_group_added_mid_run_renames_lr_sgd_to_pg1_and_keeps_its_history(tmp_path):
    arguments = (head_joins_later, dict(log_momentum=True), dict(log_every_n_steps=2))
    theirs = _run_lightning(tmp_path, *arguments, grow_at_epoch=0)
    ours = _run(gpulayer, tmp_path / "gpulayer", *arguments, grow_at_epoch=0)
    assert ours == theirs
    assert list(ours[2][0]) == ["lr-SGD/pg1", "lr-SGD/pg2"] and len(ours[2][0]["lr-SGD/pg1"]) == 3


def test_should_stop_before_min_epochs_logs_before_every_batch(tmp_path):
    """Lightning's cadence is also met whenever ``should_stop`` is set; here it stays set while min_epochs runs."""
    arguments = (adam_with_step_interval, dict(), dict(log_every_n_steps=3, min_epochs=2))
    theirs = _run_lightning(tmp_path, *arguments, stop_at_batch=1)
    ours = _run(gpulayer, tmp_path / "gpulayer", *arguments, stop_at_batch=1)
    assert ours == theirs


def test_log_momentum_without_momentum_or_betas_warns_and_logs_zero(tmp_path):
    arguments = (adagrad_without_momentum, dict(log_momentum=True), dict(log_every_n_steps=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        theirs = _run(_lightning(), tmp_path / "lightning", *arguments)
    assert any(MOMENTUM_WARNING in str(warning.message) for warning in caught)
    with pytest.warns(RuntimeWarning, match=MOMENTUM_WARNING):
        ours = _run(gpulayer, tmp_path / "gpulayer", *arguments)
    assert ours == theirs
    assert ours[2][1] == {"lr-Adagrad-momentum": 0}


def test_fast_dev_run_writes_no_log_file_and_fills_callback_metrics(tmp_path):
    """Lightning and GPUlayer swap the logger for one that discards everything: no file, same metrics."""
    arguments = (sgd_with_step_lr, dict(log_momentum=True), dict(log_every_n_steps=1, fast_dev_run=2))
    theirs = _run_lightning(tmp_path, *arguments)
    ours = _run(gpulayer, tmp_path / "gpulayer", *arguments)
    assert ours == theirs
    assert ours[0] is None
    assert ours[1][-1][2] == {
        "lr-SGD": (pytest.approx(0.1), "torch.float32"),
        "lr-SGD-momentum": (pytest.approx(0.9), "torch.float32"),
    }


def test_no_logger_is_refused_at_train_start_as_in_lightning(tmp_path):
    arguments = (sgd_with_step_lr, dict(), dict(logger=False))
    with pytest.raises(Exception, match="has no logger") as theirs:
        _run_lightning(tmp_path, *arguments)
    with pytest.raises(ValueError, match="has no logger") as ours:
        _run(gpulayer, tmp_path / "gpulayer", *arguments)
    assert NO_LOGGER_ERROR in str(theirs.value) and NO_LOGGER_ERROR in str(ours.value)


def test_duplicate_param_group_names_are_refused_as_in_lightning(tmp_path):
    arguments = (duplicate_group_names, dict(), dict(log_every_n_steps=1))
    with pytest.raises(Exception, match="duplicated parameter group names") as theirs:
        _run_lightning(tmp_path, *arguments)
    with pytest.raises(ValueError, match="duplicated parameter group names") as ours:
        _run(gpulayer, tmp_path / "gpulayer", *arguments)
    assert str(ours.value) == str(theirs.value)


def test_an_unknown_logging_interval_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"logging_interval='batch': accepted values are 'step', 'epoch' or None"):
        LearningRateMonitor(logging_interval="batch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match="logging_interval should be"):
            _lightning().callbacks.LearningRateMonitor(logging_interval="batch")


# ---- the lean path: a batch that logs nothing costs nothing ------------------------------------------------------
READS = ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")


class CountingLogger(gpulayer.CSVLogger):
    """Records the step of every row the monitor hands it."""

    def __init__(self, save_dir):
        super().__init__(save_dir)
        self.calls = []

    def log_metrics(self, metrics, step=None):
        if any(name.startswith("lr-") for name in metrics):
            self.calls.append(step)
        super().log_metrics(metrics, step)


class FileWatcher(gpulayer.Callback):
    """metrics.csv's size and mtime (None: no file yet) after the monitor ran, before and after each batch."""

    def __init__(self):
        self.seen = []

    def _record(self, trainer):
        path = os.path.join(trainer.log_dir, "metrics.csv")
        self.seen.append((os.stat(path).st_size, os.stat(path).st_mtime_ns) if os.path.exists(path) else None)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._record(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._record(trainer)


class QuietModule(gpulayer.Module):
    """Logs only at epoch end, so every step row in metrics.csv would be the monitor's."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return adam_with_step_interval(self)


def test_a_batch_off_the_cadence_logs_nothing_writes_nothing_and_reads_no_tensor(tmp_path, monkeypatch):
    reads = []
    inside_monitor = []

    def counting(name, original):
        def read(self, *args, **kwargs):
            if inside_monitor:
                reads.append(name)
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))

    class WatchedMonitor(LearningRateMonitor):
        def on_train_batch_start(self, *args):
            inside_monitor.append(True)
            try:
                super().on_train_batch_start(*args)
            finally:
                inside_monitor.clear()

    logger, watcher = CountingLogger(tmp_path), FileWatcher()
    trainer = gpulayer.Trainer(
        accelerator="cpu",
        max_epochs=2,
        log_every_n_steps=4,
        logger=logger,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[WatchedMonitor(logging_interval="step", log_momentum=True), watcher],
    )
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(40, 4, generator=generator), torch.randn(40, 1, generator=generator))
    trainer.fit(QuietModule(), DataLoader(data, batch_size=4))

    assert reads == []
    assert logger.calls == [3, 7, 11, 15, 19]  # rows only before the 4th, 8th, … step
    # No batch wrote metrics.csv: its rows reach the file at epoch ends, with the trainer's epoch row.
    first_epoch, second_epoch = set(watcher.seen[:20]), set(watcher.seen[20:])
    assert first_epoch == {None} and len(second_epoch) == 1 and None not in second_epoch
    rows = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()
    assert rows[0] == "epoch,lr-Adam,lr-Adam-momentum,step,train_loss"
    assert [row.split(",")[3] for row in rows[1:]] == ["3", "7", "9", "11", "15", "19", "19"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_logging_on_a_gpu_never_waits_for_the_device(tmp_path):
    """``torch.tensor(value, device="cuda")`` would synchronise the stream; the monitor's hooks must not."""

    def sync_debug_mode(mode):
        with warnings.catch_warnings():  # its prototype warning, an error here, is raised after the mode is set
            warnings.filterwarnings("ignore", "Synchronization debug mode is a prototype", UserWarning)
            torch.cuda.set_sync_debug_mode(mode)

    class StrictMonitor(LearningRateMonitor):
        def _log(self, *args):
            sync_debug_mode("error")
            try:
                super()._log(*args)
            finally:
                sync_debug_mode("default")

    monitor = StrictMonitor(log_momentum=True, log_weight_decay=True)
    trainer = gpulayer.Trainer(
        accelerator="cuda",
        devices=1,
        max_epochs=2,
        log_every_n_steps=1,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[monitor],
    )
    trainer.fit(QuietModule(), _loaders()[0])
    assert len(monitor.lrs["lr-Adam"]) == 10
    assert trainer.callback_metrics["lr-Adam"].device.type == "cuda"
