"""Timer against Lightning 2.6.6 (``lightning/pytorch/callbacks/timer.py``): the same run under both frameworks on a
clock that moves only when a step runs (1 s per training step, 0.25 s per validation step), so each stop falls at
a known step: where training stopped, the weights, each stage's times, the state and its checkpoint, the verbose
message, and Lightning's errors. Two gloo ranks whose clocks differ stop at the same step."""

import time
import warnings
from datetime import timedelta

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks import Timer
from gpulayer.runtime.testing import run_ranks

from .conftest import FakeClock, frameworks, info_messages

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import Timer as LightningTimer
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

FRAMEWORKS = frameworks(
    Timer=(LightningTimer, Timer),
    log_name=("lightning.pytorch.utilities.rank_zero", "gpulayer.trainer.loops.timer"),
)
ORIGIN = 1000.0  # the fake clock's reading when a run starts
STAGES = ("train", "sanity_check", "validate", "test", "predict")


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock(ORIGIN)
    monkeypatch.setattr(time, "monotonic", fake)
    return fake


def _module(framework, clock, step_seconds=1.0):
    class Ticking(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            clock.advance(step_seconds)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            clock.advance(0.25)
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        test_step = validation_step

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Ticking()


def _loader(samples):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))
    return DataLoader(data, batch_size=2)


def _saver(framework, path, epoch):
    """Saves a checkpoint at the end of epoch ``epoch`` (a checkpoint-type callback, so it runs after the Timer)."""

    class Saver(framework.Checkpoint):
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == epoch:
                trainer.save_checkpoint(path)

    return Saver()


def _since_origin(value):
    return None if value is None else value - ORIGIN


def _timer_record(timer):
    return {
        "elapsed": {stage: timer.time_elapsed(stage) for stage in STAGES},
        "remaining": timer.time_remaining(),
        "start": {stage: _since_origin(timer.start_time(stage)) for stage in STAGES},
        "end": {stage: _since_origin(timer.end_time(stage)) for stage in STAGES},
        "state": timer.state_dict(),
    }


def _run(name, root, clock, *, timer=None, trainer=None, save_at=None, ckpt_path=None, test=False):
    """One fit (then a test run, if asked) under framework ``name`` from the clock's origin; what it did."""
    framework = FRAMEWORKS[name]
    clock.now = ORIGIN
    callbacks = [] if timer is None else [framework.Timer(**timer)]
    if save_at is not None:
        callbacks.append(_saver(framework, root / f"{name}.ckpt", save_at))
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 4,
        "logger": False,
        "enable_checkpointing": save_at is not None,
        "default_root_dir": root / name,
        "callbacks": callbacks,
    }
    model = _module(framework, clock)
    with warnings.catch_warnings(), info_messages(framework.log_name) as messages:
        warnings.simplefilter("ignore")
        run = framework.Trainer(**options | framework.options | (trainer or {}))
        run.fit(model, _loader(16), _loader(4), ckpt_path=ckpt_path)
        fitted = {"global_step": run.global_step, "current_epoch": run.current_epoch, "should_stop": run.should_stop}
        if test:
            run.test(model, _loader(4), verbose=False)
    timers = [c for c in run.callbacks if isinstance(c, framework.Timer)]
    return fitted | {
        "weights": {key: value.tolist() for key, value in model.state_dict().items()},
        "timers": [_timer_record(t) for t in timers],
        "messages": [m for m in messages if m.startswith("Time limit")],
    }


def _both(tmp_path, clock, **kwargs):
    expected = _run("lightning", tmp_path, clock, **kwargs)
    actual = _run("gpulayer", tmp_path, clock, **kwargs)
    assert actual == expected
    return actual


@pytest.mark.parametrize(
    ("timer", "trainer", "stopped_at"),
    [
        pytest.param({"duration": "00:00:00:05"}, {}, 5, id="string-step"),
        pytest.param({"duration": timedelta(seconds=5), "interval": "epoch"}, {}, 8, id="timedelta-epoch"),
        pytest.param({"duration": {"seconds": 13.5}, "interval": "epoch"}, {}, 16, id="dict-epoch-second"),
        pytest.param({"duration": {"seconds": 0}}, {}, 0, id="zero-at-fit-start"),
        pytest.param({"duration": {"seconds": 3}, "verbose": False}, {}, 3, id="quiet"),
        pytest.param({"duration": "00:00:00:05"}, {"min_steps": 7}, 8, id="min-steps"),
        pytest.param({}, {}, 32, id="no-duration"),
        pytest.param(None, {"max_time": "00:00:00:06"}, 6, id="max-time"),
        pytest.param({"duration": {"seconds": 3}}, {"max_time": "00:00:00:06"}, 3, id="max-time-ignored"),
        pytest.param({"duration": {"seconds": 9}}, {"val_check_interval": 0.5}, 9, id="mid-epoch-validation"),
    ],
)
def test_training_stops_at_the_step_lightning_stops_at(tmp_path, clock, timer, trainer, stopped_at):
    result = _both(tmp_path, clock, timer=timer, trainer=trainer, test=True)
    assert result["global_step"] == stopped_at
    assert len(result["timers"]) == 1


def test_the_stop_validates_and_times_each_stage(tmp_path, clock):
    """A stop after step 5: validation runs right after it (2 steps, 0.5 s), so training took 5.5 s; the test run
    after ``fit`` took 0.5 s; nothing timed the sanity check or prediction."""
    result = _both(tmp_path, clock, timer={"duration": {"seconds": 5}}, test=True)
    (timer,) = result["timers"]
    assert timer["elapsed"] == {"train": 5.5, "sanity_check": 0, "validate": 0.5, "test": 0.5, "predict": 0}
    assert timer["remaining"] == -0.5
    assert timer["start"] == {"train": 0.5, "sanity_check": None, "validate": 5.5, "test": 6.0, "predict": None}
    assert result["messages"] == ["Time limit reached. Elapsed time is 0:00:05. Signaling Trainer to stop."]


def test_max_time_beside_a_timer_is_ignored_with_lightnings_message(tmp_path, clock):
    logged = {}
    for name, framework in FRAMEWORKS.items():
        logger = "gpulayer.trainer.defaults" if name == "gpulayer" else framework.log_name
        with warnings.catch_warnings(), info_messages(logger) as messages:
            warnings.simplefilter("ignore")
            trainer = framework.Trainer(
                callbacks=[framework.Timer()], max_time={"hours": 1}, logger=False, default_root_dir=tmp_path
            )
        ignoring = [message for message in messages if message.startswith("Ignoring")]
        logged[name] = (ignoring, [type(c).__name__ for c in trainer.callbacks].count("Timer"))
    assert logged["gpulayer"] == logged["lightning"]
    assert logged["gpulayer"] == (["Ignoring `Trainer(max_time=...)`, callbacks list already contains a Timer."], 1)


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_a_resumed_run_carries_the_time_spent_as_lightning_does(tmp_path, clock, interval):
    """Saved at the end of epoch 0 (8 steps and 2 validation steps: 8.5 s of training; the sanity check is not
    training), then resumed with 12 s: 3.5 s remain, so the resumed run stops after step 12 (step) or at epoch 1's
    end (epoch)."""
    timer = {"duration": {"seconds": 12}, "interval": interval}
    _both(tmp_path, clock, timer=timer, save_at=0)
    saved = {name: torch.load(tmp_path / f"{name}.ckpt", weights_only=True) for name in FRAMEWORKS}
    assert saved["gpulayer"]["callbacks"]["Timer"] == saved["lightning"]["callbacks"]["Timer"]
    assert saved["gpulayer"]["callbacks"]["Timer"]["time_elapsed"]["train"] == 8.5
    resumed = {}
    for name in FRAMEWORKS:
        resumed[name] = _run(name, tmp_path / "resumed", clock, timer=timer, ckpt_path=tmp_path / f"{name}.ckpt")
    assert resumed["gpulayer"] == resumed["lightning"]
    assert resumed["gpulayer"]["global_step"] == (12 if interval == "step" else 16)


def test_a_resumed_run_with_no_time_left_stops_at_fit_start(tmp_path, clock):
    """Saved at the end of epoch 0 with 8.5 s spent, resumed with 8 s: no step more. ``current_epoch`` is 1, as
    after an unbroken run stopped at that epoch's end (GPUlayer's end-of-epoch resume, porting guide); Lightning
    leaves the saved epoch unfinished and reports 0."""
    _both(tmp_path, clock, timer={"duration": {"seconds": 30}}, save_at=0)
    resumed = {}
    for name in FRAMEWORKS:
        ckpt_path = tmp_path / f"{name}.ckpt"
        resumed[name] = _run(name, tmp_path / "resumed", clock, timer={"duration": {"seconds": 8}}, ckpt_path=ckpt_path)
    assert (resumed["lightning"].pop("current_epoch"), resumed["gpulayer"].pop("current_epoch")) == (0, 1)
    assert resumed["gpulayer"] == resumed["lightning"]
    assert resumed["gpulayer"]["global_step"] == 8  # the checkpoint's: not one more step
    assert resumed["gpulayer"]["messages"] == [
        "Time limit reached. Elapsed time is 0:00:08. Signaling Trainer to stop."
    ]


def test_a_timer_used_again_times_the_new_run(tmp_path, clock):
    """A deliberate difference: a Timer whose first fit ended before its duration (8.5 s of 40) stops a second fit
    after 40 s of that fit's training (epochs of 8.5 s: step 38). Lightning keeps the first fit's end time, so the
    second fit's elapsed time is negative and it never stops (all 80 steps)."""
    steps = {}
    for name, framework in FRAMEWORKS.items():
        timer = framework.Timer({"seconds": 40})
        for max_epochs in (1, 10):
            clock.now = ORIGIN
            options = {"max_epochs": max_epochs, "logger": False, "enable_checkpointing": False, "callbacks": [timer]}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer = framework.Trainer(**options | framework.options | {"default_root_dir": tmp_path / name})
                trainer.fit(_module(framework, clock), _loader(16), _loader(4))
        steps[name] = trainer.global_step
    assert steps == {"lightning": 80, "gpulayer": 38}


@pytest.mark.parametrize(
    "arguments",
    [
        {"duration": "1:00:00"},
        {"duration": "00:1:00:00"},
        {"duration": "00:00:00:00.5"},
        {"duration": "bogus"},
        {"interval": "batch"},
        {"interval": "STEP"},
        {"interval": None},
    ],
    ids=str,
)
def test_bad_arguments_are_refused_with_lightnings_message(arguments):
    with pytest.raises(MisconfigurationException) as theirs:
        LightningTimer(**arguments)
    with pytest.raises(ValueError) as ours:
        Timer(**arguments)
    assert isinstance(ours.value, gl.MisconfigurationException)
    # Lightning lists the intervals from a set, in an order that changes between processes.
    same_choices = str(theirs.value).replace("epoch, step", "step, epoch")
    assert str(ours.value) == same_choices


def test_accepted_durations_are_lightnings():
    for duration in (" 01:02:03:04 ", "100:00:00:01", timedelta(minutes=3), {"days": 1, "seconds": 2}, None):
        theirs, ours = LightningTimer(duration), Timer(duration)
        assert ours.time_remaining() == theirs.time_remaining()
    with pytest.raises(TypeError, match=r"Timer\(duration=5\): accepted values are None, a 'DD:HH:MM:SS' string"):
        Timer(5)


def _two_ranks(runtime, seconds_per_step: tuple[float, float], interval: str, duration: float) -> dict:
    """Each rank's clock moves at its own pace; the ranks must stop at the same step."""
    clock = FakeClock(ORIGIN)
    time.monotonic = clock  # this rank's process only
    framework = FRAMEWORKS["gpulayer"]
    trainer = gl.Trainer(
        accelerator="cpu",
        devices=2,
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        log_every_n_steps=3,
        callbacks=[Timer({"seconds": duration}, interval=interval)],
    )
    model = _module(framework, clock, seconds_per_step[trainer.global_rank])
    trainer.fit(model, _loader(32))
    return {"global_step": trainer.global_step, "current_epoch": trainer.current_epoch, "stop": trainer.should_stop}


@pytest.mark.multiprocess
def test_two_ranks_with_different_clocks_stop_at_the_same_step():
    """Rank 1's clock runs 3 s per step, rank 0's 1 s; 8 batches per rank and epoch, sync points every 3 steps and at
    each epoch's end. Step interval, 5 s: rank 1 is past it from step 2, and its stop is agreed at the sync point
    after step 3 (rank 0 would go on to step 5). Epoch interval, 10 s: rank 1 alone is past it at epoch 0's end
    (24 s against 8 s), and both stop there."""
    step = run_ranks(_two_ranks, (1.0, 3.0), "step", 5.0, world_size=2, timeout=120)
    assert step == [{"global_step": 3, "current_epoch": 1, "stop": True}] * 2
    epoch = run_ranks(_two_ranks, (1.0, 3.0), "epoch", 10.0, world_size=2, timeout=120)
    assert epoch == [{"global_step": 8, "current_epoch": 1, "stop": True}] * 2
