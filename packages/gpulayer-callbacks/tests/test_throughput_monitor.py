"""ThroughputMonitor against Lightning 2.6.6 (``lightning/pytorch/callbacks/throughput_monitor.py``): the same runs
under both frameworks on a ``time.perf_counter`` that moves only when a step runs (1 s per training step, 0.25 s per
validation step, 0.5 s per test step, 0.125 s per predict step, 0.0625 s as each validation starts), so every
logged row is compared exactly: its step, its keys and its values (counts and rates), and ``logged_metrics``.
``Throughput`` itself is compared with Lightning's on a sequence of updates, on one device and on four."""

import time
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.callbacks.throughput import Throughput, get_available_flops, measure_flops
from gpulayer.callbacks.throughput_monitor import ThroughputMonitor
from gpulayer.runtime.testing import run_ranks

from .conftest import FakeClock, frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.fabric.utilities.throughput import Throughput as LightningThroughput
    from lightning.fabric.utilities.throughput import get_available_flops as lightning_available_flops
    from lightning.fabric.utilities.throughput import measure_flops as lightning_measure_flops
    from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor

FRAMEWORKS = frameworks(ThroughputMonitor=(LightningThroughputMonitor, ThroughputMonitor))
STAGES = ("train", "validate", "test", "predict")
NO_FLOPS = "When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute or property"


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock(100.0)
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


def _module(framework, clock, flops=None, stop_at=None, ticks=True):
    class Measured(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            if flops is not None:
                self.flops_per_batch = flops

        def _tick(self, seconds):
            if ticks:
                clock.advance(seconds)

        def training_step(self, batch, batch_idx):
            self._tick(1.0)
            if batch_idx == stop_at:
                self.trainer.should_stop = True
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            self._tick(0.25)

        def on_validation_epoch_start(self):
            self._tick(0.0625)

        def test_step(self, batch, batch_idx):
            self._tick(0.5)

        def predict_step(self, batch, batch_idx):
            self._tick(0.125)
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Measured()


def _recording_logger(framework, root):
    class Recording(framework.CSVLogger):
        """Every row with a throughput key: (step, the row)."""

        def __init__(self):
            super().__init__(root)
            self.rows = []

        def log_metrics(self, metrics, step=None):
            if any(key.startswith(STAGES) for key in metrics):
                self.rows.append((step, dict(metrics)))
            super().log_metrics(metrics, step)

    return Recording()


def _loader(samples, batch_size):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))
    return DataLoader(data, batch_size=batch_size)


def _batch_size(batch):
    return batch[0].shape[0]


def _items(batch):
    return batch[0].shape[0] * 3  # three tokens a sample


def _run(name, root, clock, *, monitor=None, trainer=None, module=None, entry="fit", repeat=1):
    """One run under ``name``: the rows the monitor logged, and the throughput keys of ``logged_metrics``."""
    framework = FRAMEWORKS[name]
    clock.now = 100.0
    logger = _recording_logger(framework, root / name)
    monitor = framework.ThroughputMonitor(**({"batch_size_fn": _batch_size} | (monitor or {})))
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 2,
        "logger": logger,
        "enable_checkpointing": False,
        "default_root_dir": root / name,
        "callbacks": [monitor],
    }
    model = _module(framework, clock, **(module if module is not None else {"flops": 100}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("always" if name == "gpulayer" else "ignore", NO_FLOPS)
        run = framework.Trainer(**options | framework.options | (trainer or {}))
        for _ in range(repeat):
            if entry == "fit":
                run.fit(model, _loader(24, 4), _loader(24, 8))
            elif entry == "predict":
                run.predict(model, _loader(24, 4))
            else:
                getattr(run, entry)(model, _loader(20, 4), verbose=False)
    logged = {key: value for key, value in run.logged_metrics.items() if key.startswith(STAGES)}
    return logger.rows, logged


def _both(tmp_path, clock, **kwargs):
    expected = _run("lightning", tmp_path, clock, **kwargs)
    actual = _run("gpulayer", tmp_path, clock, **kwargs)
    assert actual == expected
    return actual


def test_fit_logs_each_stage_at_its_log_steps_with_lightnings_keys_and_values(tmp_path, clock):
    rows, logged = _both(
        tmp_path,
        clock,
        monitor={"length_fn": _items, "window_size": 3},
        trainer={"log_every_n_steps": 2, "num_sanity_val_steps": 2},
    )
    train = [(step, row) for step, row in rows if "train/time" in row]
    validate = [(step, row) for step, row in rows if "validate/time" in row]
    assert [step for step, _ in train] == [1, 3, 5, 7, 9, 11]  # the log steps of 2 epochs of 6 batches
    assert [step for step, _ in validate] == [2, 2]  # the 2nd validation batch, counted within the training epoch
    assert train[0][1] == {
        "train/time": 2.0,
        "train/batches": 2,
        "train/samples": 8,
        "train/lengths": 24,
        "epoch": 0,
    }
    # The totals run on across epochs, and validation's time is left out of training's: 1 s a batch all along.
    assert train[3][1] == {
        "train/time": 8.0,
        "train/batches": 8,
        "train/samples": 32,
        "train/lengths": 96,
        "train/device/batches_per_sec": 1.0,
        "train/device/samples_per_sec": 4.0,
        "train/device/items_per_sec": 12.0,
        "train/device/flops_per_sec": 100.0,
        "epoch": 1,
    }
    # Validation's clock starts at on_validation_start (the module's hook then takes 0.0625 s); no rates: the
    # window of 3 is not full at its 2nd batch.
    assert validate[0][1] == {
        "validate/time": 0.5625,
        "validate/batches": 2,
        "validate/samples": 16,
        "validate/lengths": 48,
    }
    assert logged == {key: value for key, value in train[-1][1].items() if key != "epoch"} | validate[-1][1]


def test_validation_twice_an_epoch_counts_its_batches_within_the_training_epoch(tmp_path, clock):
    rows, _ = _both(
        tmp_path,
        clock,
        monitor={"window_size": 2},
        trainer={"log_every_n_steps": 1, "val_check_interval": 0.5, "num_sanity_val_steps": 0},
    )
    validate = [(step, row["validate/batches"]) for step, row in rows if "validate/time" in row]
    # The step counts the training epoch's validation batches; the totals restart with each validation run.
    assert validate == [(1, 1), (2, 2), (3, 3), (4, 1), (5, 2), (6, 3)] * 2
    assert {row.get("validate/device/flops_per_sec") for _, row in rows if "validate/time" in row} == {None, 400.0}
    train = [row for _, row in rows if "train/time" in row]
    assert [row["train/time"] for row in train] == [float(n) for n in range(1, 13)]


def test_accumulation_logs_only_at_batches_that_step_with_the_separator(tmp_path, clock):
    rows, _ = _both(
        tmp_path,
        clock,
        monitor={"separator": "|", "window_size": 2},
        trainer={"log_every_n_steps": 1, "accumulate_grad_batches": 4, "limit_val_batches": 0},
    )
    # 6 batches an epoch, windows of 4: batches 3 and 5 (the epoch's last) step; the totals run on across epochs.
    assert [(step, row["train|batches"]) for step, row in rows] == [(0, 4), (1, 6), (2, 10), (3, 12)]
    assert rows[1][1]["train|device|batches_per_sec"] == 1.0


def test_a_stop_logs_its_batch_and_no_log_steps_log_nothing(tmp_path, clock):
    rows, _ = _both(tmp_path, clock, module={"flops": 10, "stop_at": 2}, trainer={"log_every_n_steps": 5})
    assert [(step, row["train/batches"]) for step, row in rows if "train/batches" in row] == [(2, 3)]
    assert _both(tmp_path, clock, trainer={"log_every_n_steps": 0}) == ([], {})


@pytest.mark.parametrize("entry", ["validate", "test", "predict"])
def test_evaluation_entry_points_count_on_across_runs_of_one_trainer(tmp_path, clock, entry):
    rows, _ = _both(
        tmp_path, clock, entry=entry, repeat=2, monitor={"window_size": 2}, trainer={"log_every_n_steps": 2}
    )
    prefix = {"validate": "validate", "test": "test", "predict": "predict"}[entry]
    # 5 or 6 batches a run; the step counts the loop's batches across both runs, and so do the totals.
    assert [step for step, _ in rows] == ([2, 4, 6, 8, 10, 12] if entry == "predict" else [2, 4, 7, 9])
    assert rows[-1][1][f"{prefix}/batches"] == rows[-1][0]


def test_without_flops_per_batch_lightnings_warning_and_no_flops(tmp_path, clock):
    with pytest.warns(UserWarning, match=NO_FLOPS):
        rows, _ = _run("gpulayer", tmp_path, clock, module={}, trainer={"log_every_n_steps": 3})
    expected, _ = _run("lightning", tmp_path, clock, module={}, trainer={"log_every_n_steps": 3})
    assert rows == expected and not any("flops" in key for _, row in rows for key in row)


@pytest.mark.parametrize(
    ("monitor", "module", "error", "message"),
    [
        pytest.param({}, {"flops": 1, "ticks": False}, ValueError, "Expected the value to increase", id="clock-still"),
        pytest.param(
            {"batch_size_fn": lambda batch: 0},
            {"flops": 1},
            ValueError,
            r"Expected samples \(0\) to be greater or equal than batches \(1\)",
            id="no-samples",
        ),
        pytest.param(
            {"length_fn": lambda batch: 1},
            {"flops": 1},
            ValueError,
            r"Expected lengths \(1\) to be greater or equal than samples \(4\)",
            id="short-lengths",
        ),
    ],
)
def test_bad_counts_raise_lightnings_errors_at_the_batch(tmp_path, clock, monitor, module, error, message):
    for name in ("lightning", "gpulayer"):
        with pytest.raises(error, match=message):
            _run(name, tmp_path, clock, monitor=monitor, module=module)


@pytest.mark.parametrize(
    ("kwargs", "lightning_error", "error", "message"),
    [
        ({"window_size": 1}, AssertionError, ValueError, "window_size=1: accepted values are integers of at least 2"),
        ({"windows": 3}, TypeError, TypeError, r"unknown keyword arguments \['windows'\]"),
    ],
)
def test_bad_arguments_raise_at_construction_where_lightning_raises_at_fit(
    tmp_path, clock, kwargs, lightning_error, error, message
):
    with pytest.raises(lightning_error):
        _run("lightning", tmp_path, clock, monitor=kwargs)
    with pytest.raises(error, match=message):
        ThroughputMonitor(_batch_size, **kwargs)


@pytest.mark.parametrize("world_size", [1, 4])
def test_throughput_matches_lightnings_on_one_device_and_several(world_size):
    ours = Throughput(available_flops=50.0, world_size=world_size, window_size=4, separator="|")
    theirs = LightningThroughput(available_flops=50.0, world_size=world_size, window_size=4, separator="|")
    for i in range(1, 9):
        update = {"time": i * 0.75 + i * i / 8, "batches": i, "samples": 3 * i, "lengths": 7 * i, "flops": 11 * i}
        ours.update(**update)
        theirs.update(**update)
        assert ours.compute() == theirs.compute()
        assert list(ours.compute()) == list(theirs.compute())
    assert "batches_per_sec" in ours.compute() if world_size > 1 else "device|mfu" in ours.compute()
    ours.reset()
    theirs.reset()
    ours.update(time=1.0, batches=1, samples=1)
    theirs.update(time=1.0, batches=1, samples=1)
    assert ours.compute() == theirs.compute()


def test_measure_flops_counts_as_lightnings():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        x = torch.randn(5, 8)
    for loss in (None, torch.Tensor.sum):
        ours = measure_flops(model, lambda: model(x), loss)
        assert ours == lightning_measure_flops(model, lambda: model(x), loss) > 0


def _two_ranks(runtime, root):
    clock = FakeClock(100.0)
    time.perf_counter = clock  # this rank's process only
    framework = FRAMEWORKS["gpulayer"]
    logger = _recording_logger(framework, root)
    trainer = framework.Trainer(
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        logger=logger,
        enable_checkpointing=False,
        log_every_n_steps=3,
        callbacks=[ThroughputMonitor(_batch_size, window_size=2)],
    )
    trainer.fit(_module(framework, clock, flops=100), _loader(24, 4))
    return logger.rows


@pytest.mark.multiprocess
def test_two_ranks_log_on_rank_zero_with_global_rates_scaled_by_the_world_size(tmp_path):
    """3 batches a rank, each rank's clock 1 s a batch: rank 0 counts its own batches and samples, and adds the
    global rates (its own times two); rank 1 logs nothing."""
    rank_zero, rank_one = run_ranks(_two_ranks, tmp_path, world_size=2, timeout=120)
    assert rank_one == []
    assert rank_zero == [
        (
            2,
            {
                "train/time": 3.0,
                "train/batches": 3,
                "train/samples": 12,
                "train/device/batches_per_sec": 1.0,
                "train/device/samples_per_sec": 4.0,
                "train/batches_per_sec": 2.0,
                "train/samples_per_sec": 8.0,
                "train/flops_per_sec": 200.0,
                "train/device/flops_per_sec": 100.0,
                "epoch": 0,
            },
        )
    ]


GPU_NAMES = [
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 PCIe",
    "NVIDIA H100 NVL",
    "NVIDIA H200",
    "NVIDIA H200 NVL1",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA L4",
    "Tesla L40",
    "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA GeForce RTX 3090 Ti",
    "Tesla T4",
    "Tesla V100-SXM2-16GB",
    "NVIDIA B200",
]


@pytest.mark.parametrize(("capability", "matmuls"), [((7, 0), "high"), ((9, 0), "highest"), ((9, 0), "high")])
def test_available_flops_of_each_gpu_name_and_dtype_are_lightnings(monkeypatch, capability, matmuls):
    """The chip tables and name rules (TF32 for float32 on Ampere and later), on names a GPU reports, read without
    a GPU, with Lightning's warnings."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: matmuls)
    device = torch.device("cuda", 0)
    for name in GPU_NAMES:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int8, "int4"):
            with warnings.catch_warnings(record=True) as theirs:
                warnings.simplefilter("always")
                expected = lightning_available_flops(device, dtype)
            with warnings.catch_warnings(record=True) as ours:
                warnings.simplefilter("always")
                assert get_available_flops(device, dtype) == expected, (name, dtype)
            assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert get_available_flops(torch.device("cpu"), torch.float32) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_rows_and_mfu_are_lightnings(tmp_path, clock):
    """On a GPU (synchronized before each reading of the clock) in bf16-mixed: the same rows, ``device/mfu`` among
    them where Lightning knows the GPU's peak FLOP/s."""
    rows, _ = _both(
        tmp_path,
        clock,
        monitor={"window_size": 3},
        module={"flops": 10**12},
        trainer={"accelerator": "cuda", "precision": "bf16-mixed", "log_every_n_steps": 2},
    )
    assert [step for step, row in rows if "train/time" in row] == [1, 3, 5, 7, 9, 11]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a GPU missing from Lightning's table: no mfu
        peak = lightning_available_flops(torch.device("cuda", 0), torch.bfloat16)
    assert rows[-2][1].get("train/device/mfu") == (None if peak is None else 10**12 / peak)
