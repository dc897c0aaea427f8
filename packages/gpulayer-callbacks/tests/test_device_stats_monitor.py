"""DeviceStatsMonitor against Lightning 2.6.6 (``lightning/pytorch/callbacks/device_stats_monitor.py``): the same
runs under both frameworks into a recording logger, comparing each row's step and keys in order (the values are the
machine's CPU and memory use, which move: they are checked to be percentages), Lightning's errors, and that
GPUlayer's fit loop calls the monitor only at the log steps. On a GPU, the keys of ``torch.cuda.memory_stats``."""

import sys
import warnings
from importlib.util import find_spec

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.callbacks.device_stats_monitor import DeviceStatsMonitor

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import lightning.pytorch.callbacks.device_stats_monitor as lightning_monitor
    from lightning.pytorch.callbacks import DeviceStatsMonitor as LightningDeviceStatsMonitor
    from lightning.pytorch.utilities.exceptions import MisconfigurationException as LightningMisconfiguration

    from gpulayer.trainer.exceptions import MisconfigurationException

FRAMEWORKS = frameworks(DeviceStatsMonitor=(LightningDeviceStatsMonitor, DeviceStatsMonitor))
CPU_KEYS = ["cpu_percent", "cpu_swap_percent", "cpu_vm_percent"]
NO_LOGGER = "Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`."
NO_PSUTIL = "`DeviceStatsMonitor` cannot log CPU stats as `psutil` is not installed."
needs_psutil = pytest.mark.skipif(
    find_spec("psutil") is None, reason="psutil is not installed: the CPU's stats are read with it (pip install psutil)"
)


def _module(framework, stop_at=None):
    class Small(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == stop_at:
                self.trainer.should_stop = True
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            pass

        test_step = validation_step

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Small()


def _recording_logger(framework, root):
    class Recording(framework.CSVLogger):
        """Every row of device statistics: (step, {hook: sorted stat names}), its values kept apart."""

        def __init__(self):
            super().__init__(root)
            self.rows, self.values = [], []

        def log_metrics(self, metrics, step=None):
            if any(".on_" in key.split("/")[0] for key in metrics):  # <the monitor's class>.<hook>/<stat>
                hooks = {}
                for key in metrics:
                    hook, stat = key.split("/", 1)
                    hooks.setdefault(hook, []).append(stat)
                self.rows.append((step, {hook: sorted(stats) for hook, stats in hooks.items()}))
                self.values.extend(metrics.values())
            super().log_metrics(metrics, step)

    return Recording()


def _loader(samples):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))
    return DataLoader(data, batch_size=4)


def _run(name, root, *, monitor=None, trainer=None, stop_at=None, test=False, accelerator="cpu"):
    """A fit of 2 epochs of 5 batches with 3 validation batches (and a test run of 3): the rows the monitor logged."""
    framework = FRAMEWORKS[name]
    logger = _recording_logger(framework, root / name)
    options = {
        "accelerator": accelerator,
        "devices": 1,
        "max_epochs": 2,
        "logger": logger,
        "enable_checkpointing": False,
        "default_root_dir": root / name,
        "callbacks": [framework.DeviceStatsMonitor(**(monitor or {}))],
    }
    model = _module(framework, stop_at)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = framework.Trainer(**options | framework.options | (trainer or {}))
        run.fit(model, _loader(20), _loader(12))
        if test:
            run.test(model, _loader(12), verbose=False)
    return logger


def _both(tmp_path, **kwargs):
    expected = _run("lightning", tmp_path, **kwargs)
    actual = _run("gpulayer", tmp_path, **kwargs)
    assert actual.rows == expected.rows
    assert all(isinstance(value, float) and 0 <= value <= 100 for value in actual.values)
    return actual.rows


def _hooks(rows):
    return [(step, hook) for step, row in rows for hook in row]


@needs_psutil
@pytest.mark.parametrize("cpu_stats", [None, True])
def test_cpu_stats_at_lightnings_hooks_and_steps(tmp_path, cpu_stats):
    rows = _both(tmp_path, monitor={"cpu_stats": cpu_stats}, trainer={"log_every_n_steps": 2}, test=True)
    assert {tuple(stats) for _, row in rows for stats in row.values()} == {tuple(CPU_KEYS)}
    validation, train, test = (f"DeviceStatsMonitor.on_{name}_batch_" for name in ("validation", "train", "test"))
    # Every 2nd batch of each run (the sanity check's included) at the batches that stepped, which validation at an
    # epoch's end reads before its last batch's step is counted.
    assert _hooks(rows) == [
        *[(0, validation + at) for at in ("start", "end")],
        *[(step, train + at) for step in (1, 3) for at in ("start", "end")],
        *[(4, validation + at) for at in ("start", "end")],
        *[(step, train + at) for step in (5, 7, 9) for at in ("start", "end")],
        *[(9, validation + at) for at in ("start", "end")],
        *[(10, test + at) for at in ("start", "end")],
    ]


@needs_psutil
@pytest.mark.parametrize(
    ("trainer", "stop_at"),
    [
        pytest.param({"log_every_n_steps": 1, "accumulate_grad_batches": 2}, None, id="accumulating"),
        pytest.param({"log_every_n_steps": 4, "num_sanity_val_steps": 0}, 1, id="stop"),
        pytest.param({"log_every_n_steps": 0}, None, id="never"),
    ],
)
def test_cadences_of_lightning(tmp_path, trainer, stop_at):
    rows = _both(tmp_path, trainer=trainer, stop_at=stop_at)
    assert (rows == []) == (trainer["log_every_n_steps"] == 0)


def test_cpu_stats_false_on_the_cpu_logs_nothing(tmp_path):
    assert _both(tmp_path, monitor={"cpu_stats": False}, trainer={"log_every_n_steps": 1}) == []


def test_fit_without_a_logger_is_lightnings_error(tmp_path):
    with pytest.raises(LightningMisconfiguration, match=NO_LOGGER.replace("(", r"\(").replace(")", r"\)")):
        _run("lightning", tmp_path, trainer={"logger": False})
    with pytest.raises(MisconfigurationException) as ours:
        _run("gpulayer", tmp_path, trainer={"logger": False})
    assert str(ours.value) == NO_LOGGER


def test_fit_on_the_cpu_without_psutil_is_lightnings_error(tmp_path, monkeypatch):
    monkeypatch.setattr(lightning_monitor, "_PSUTIL_AVAILABLE", False)
    with pytest.raises(ModuleNotFoundError, match=NO_PSUTIL):
        _run("lightning", tmp_path)
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now fails
    with pytest.raises(ModuleNotFoundError, match=NO_PSUTIL):
        _run("gpulayer", tmp_path)
    # Without CPU stats asked for, psutil is not needed.
    assert _run("gpulayer", tmp_path, monitor={"cpu_stats": False}, trainer={"log_every_n_steps": 1}).rows == []


@needs_psutil
def test_the_fit_loop_calls_the_monitor_only_at_log_steps(tmp_path):
    """Lightning calls the batch hooks at every batch and logs at the log steps; GPUlayer's loop plans the log steps
    and calls the hooks there alone (the epoch's last batch is planned for other rules too)."""
    calls = []

    class Counting(DeviceStatsMonitor):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            calls.append(("start", batch_idx))
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    Counting.on_train_batch_start.follows_cadence = True
    trainer = FRAMEWORKS["gpulayer"].Trainer(
        accelerator="cpu",
        max_epochs=1,
        log_every_n_steps=4,
        logger=_recording_logger(FRAMEWORKS["gpulayer"], tmp_path),
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        callbacks=[Counting()],
    )
    trainer.fit(_module(FRAMEWORKS["gpulayer"]), _loader(40))
    assert calls == [("start", 3), ("start", 7), ("start", 9)]
    assert [(step, list(row)) for step, row in trainer.logger.rows] == [
        (step, [f"{Counting.__qualname__}.on_train_batch_{at}"]) for step in (3, 7) for at in ("start", "end")
    ]


@pytest.mark.cuda
@needs_psutil
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_memory_stats_as_lightning_logs_them(tmp_path):
    """On a GPU: every key of ``torch.cuda.memory_stats`` (the CPU's as well with ``cpu_stats=True``), at the same
    hooks and steps as Lightning's."""
    for cpu_stats in (None, True):
        kwargs = {"monitor": {"cpu_stats": cpu_stats}, "trainer": {"log_every_n_steps": 3}, "accelerator": "cuda"}
        expected = _run("lightning", tmp_path / "l", **kwargs)
        actual = _run("gpulayer", tmp_path / "g", **kwargs)
        assert _hooks(actual.rows) == _hooks(expected.rows) != []
        stats = set(actual.rows[0][1]["DeviceStatsMonitor.on_train_batch_start"])
        assert {"allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms"} <= stats
        assert (set(CPU_KEYS) <= stats) == bool(cpu_stats)
        for (_, ours), (_, theirs) in zip(actual.rows, expected.rows, strict=True):
            assert {hook: set(names) for hook, names in ours.items()} == {
                hook: set(names) for hook, names in theirs.items()
            }
