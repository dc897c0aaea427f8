"""Bad input: a wrong argument to ``Trainer``, a callback, ``launch()`` or ``gpulayer launch`` is refused before
any work, by an error naming the argument, the value and what is accepted; nothing is written.

Each case runs in an empty working folder, with ``default_root_dir``/``dirpath`` set to a folder that must not
exist afterwards.
"""

from __future__ import annotations

import os
import sys

import pytest

from gpulayer.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from gpulayer.runtime import launch
from gpulayer.runtime.testing import descendants, run_command
from gpulayer.trainer import Trainer

# (case, arguments, error, what the message shows for argument and value, what it says is accepted). The middle
# part defaults to ``name=repr(value)`` for a single argument.
TRAINER = [
    ("accelerator misspelled", {"accelerator": "tpu"}, ValueError, None, "'auto', 'cpu', 'gpu', 'cuda'"),
    ("devices=0", {"devices": 0}, ValueError, None, "a positive int"),
    ("devices as a word", {"devices": "two"}, TypeError, None, "a positive int, a numeric string, or 'auto'"),
    ("precision fp16", {"precision": "fp16"}, ValueError, None, "'16-mixed', 'bf16-mixed'"),
    ("max_epochs below -1", {"max_epochs": -2}, ValueError, None, "ints >= -1"),
    ("max_epochs as text", {"max_epochs": "10"}, TypeError, None, "ints >= -1"),
    ("max_time 1h", {"max_time": "1h"}, ValueError, None, "'DD:HH:MM:SS'"),
    ("limit_train_batches 1.5", {"limit_train_batches": 1.5}, ValueError, None, "a float in [0.0, 1.0]"),
    ("val_check_interval 1.5", {"val_check_interval": 1.5}, ValueError, None, "a float in [0.0, 1.0]"),
    ("check_val_every_n_epoch=0", {"check_val_every_n_epoch": 0}, ValueError, None, "ints >= 1"),
    ("accumulate_grad_batches schedule", {"accumulate_grad_batches": {0: 4}}, TypeError, None, "ints >= 1"),
    ("gradient_clip_algorithm l2", {"gradient_clip_algorithm": "l2"}, ValueError, None, "'norm', 'value'"),
    ("num_nodes=0", {"num_nodes": 0}, ValueError, None, "ints >= 1"),
    ("fast_dev_run=-1", {"fast_dev_run": -1}, ValueError, None, "True, False or an int >= 0"),
    ("strategy deepspeed", {"strategy": "deepspeed"}, ValueError, None, "'ddp'"),
    ("logger by name", {"logger": "csv"}, TypeError, None, "a gpulayer.trainer.Logger"),
    ("check_finite_loss as text", {"check_finite_loss": "no"}, TypeError, None, "True or False"),
    (
        "callback class, not instance",
        {"callbacks": [EarlyStopping]},
        TypeError,
        "callbacks[0] is the class gpulayer.callbacks.early_stopping.EarlyStopping",
        "pass EarlyStopping(...)",
    ),
    (
        "checkpoint callback with checkpointing off",
        {"enable_checkpointing": False, "callbacks": [ModelCheckpoint(dirpath="unused")]},
        ValueError,
        "enable_checkpointing=False",
        "remove one of them",
    ),
]

CALLBACKS = [
    # EarlyStopping keeps Lightning's message word for word (a differential test pins it): the value unquoted.
    (
        "EarlyStopping mode maximum",
        EarlyStopping,
        {"monitor": "val_loss", "mode": "maximum"},
        ValueError,
        "can be min, max",
    ),
    ("EarlyStopping monitor=None", EarlyStopping, {"monitor": None}, TypeError, "a str"),
    ("EarlyStopping patience as text", EarlyStopping, {"monitor": "val_loss", "patience": "3"}, TypeError, "numbers"),
    (
        "EarlyStopping min_delta as text",
        EarlyStopping,
        {"monitor": "val_loss", "min_delta": "0.01"},
        TypeError,
        "numbers",
    ),
    ("ModelCheckpoint mode maximum", ModelCheckpoint, {"mode": "maximum"}, ValueError, "'min' and 'max'"),
    ("ModelCheckpoint save_top_k=-2", ModelCheckpoint, {"save_top_k": -2}, ValueError, "ints >= -1"),
    ("ModelCheckpoint save_top_k as text", ModelCheckpoint, {"save_top_k": "3"}, TypeError, "ints >= -1"),
    ("ModelCheckpoint top 3, no monitor", ModelCheckpoint, {"save_top_k": 3}, ValueError, "use -1 (keep all), 0"),
    (
        "ModelCheckpoint steps and epochs",
        ModelCheckpoint,
        {"every_n_train_steps": 100, "every_n_epochs": 1},
        ValueError,
        "set at most one of them",
    ),
    ("ModelCheckpoint every_n_epochs=-1", ModelCheckpoint, {"every_n_epochs": -1}, ValueError, "ints >= 0"),
    ("ModelCheckpoint interval in seconds", ModelCheckpoint, {"train_time_interval": 3600}, TypeError, "a timedelta"),
    ("ModelCheckpoint save_last 'true'", ModelCheckpoint, {"save_last": "true"}, ValueError, "None, True, False"),
    ("LearningRateMonitor 'steps'", LearningRateMonitor, {"logging_interval": "steps"}, ValueError, "'step', 'epoch'"),
    ("LearningRateMonitor 'batch'", LearningRateMonitor, {"logging_interval": "batch"}, ValueError, "'step', 'epoch'"),
]
SHOWN = {  # how a message shows an argument and its value, where that is not name=repr(value)
    "EarlyStopping mode maximum": "`mode` can be min, max, got maximum",
    "ModelCheckpoint top 3, no monitor": "save_top_k=3 with monitor=None",
    "ModelCheckpoint steps and epochs": "every_n_train_steps=100, every_n_epochs=1",
}

LAUNCH = [
    ("nproc_per_node=0", {"nproc_per_node": 0}, ValueError, "a whole number of at least 1"),
    ("nproc_per_node as text", {"nproc_per_node": "2"}, ValueError, "a whole number of at least 1"),
    ("nnodes as a word", {"nnodes": "two"}, ValueError, "or 'MIN:MAX'"),
    ("two nodes, no endpoint", {"nnodes": 2}, ValueError, "needs rdzv_endpoint='HOST:PORT'"),
    ("rdzv_backend etcd", {"rdzv_backend": "etcd"}, ValueError, "'c10d', 'static'"),
    ("max_restarts=-1", {"max_restarts": -1}, ValueError, "a whole number of at least 0"),
    ("monitor_interval=0", {"monitor_interval": 0}, ValueError, "a number of seconds above 0"),
    ("node_rank beyond nnodes", {"node_rank": 1}, ValueError, "must be in [0, 1)"),
    ("missing script", {"target": "train.py"}, FileNotFoundError, "the path of a script"),
]

# (case, flags, the flag and value as the message shows them, what it says is accepted)
CLI = [
    ("--nproc-per-node 0", ["--nproc-per-node", "0"], "--nproc-per-node '0'", "'gpu', 'cpu' or 'auto'"),
    ("--nproc-per-node two", ["--nproc-per-node", "two"], "--nproc-per-node 'two'", "a whole number of at least 1"),
    ("--nnodes 0", ["--nnodes", "0"], "--nnodes '0'", "a whole number of at least 1, or MIN:MAX"),
    ("--rdzv-backend etcd", ["--rdzv-backend", "etcd"], "--rdzv-backend", "invalid choice: 'etcd' (choose from"),
    ("--max-restarts -1", ["--max-restarts", "-1"], "--max-restarts -1", "a whole number of at least 0"),
    ("--max-restarts abc", ["--max-restarts", "abc"], "--max-restarts", "invalid int value: 'abc'"),
    ("--monitor-interval 0", ["--monitor-interval", "0"], "--monitor-interval 0", "seconds above 0"),
    ("--node-rank 2", ["--node-rank", "2"], "--node-rank 2", "a rank in [0, 1)"),
    ("--rdzv-conf without =", ["--rdzv-conf", "timeout"], "--rdzv-conf 'timeout'", "KEY=VALUE"),
]


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """An empty working folder, and the root a case points its files at; both must stay empty."""
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def _written(workspace) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(folder, name), workspace)
        for folder, folders, files in os.walk(workspace)
        for name in folders + files
        if os.path.join(folder, name) not in (str(workspace / "cwd"), str(workspace / "script.py"))
    )


def _check(outcome, case, raised, error, shown, accepted, workspace, **measured):
    message = str(raised.value)
    written = _written(workspace)
    outcome(
        "Bad input",
        case,
        error=type(raised.value).__name__,
        message=message[:200],
        files_written=len(written),
        **measured,
        result=f"refused with {type(raised.value).__name__} naming {shown}, before any file was written",
    )
    assert isinstance(raised.value, error)  # the Trainer's also a MisconfigurationException where Lightning's is
    assert shown in message and accepted in message, message
    assert written == []


def _single(arguments: dict) -> str:
    [(name, value)] = arguments.items()
    return f"{name}={value!r}"


@pytest.mark.parametrize(("case", "arguments", "error", "shown", "accepted"), TRAINER, ids=[c[0] for c in TRAINER])
def test_trainer_refuses_a_bad_argument_before_any_file(outcome, workspace, case, arguments, error, shown, accepted):
    with pytest.raises(Exception) as raised:
        Trainer(**{"accelerator": "cpu", "default_root_dir": workspace / "run", **arguments})
    _check(outcome, case, raised, error, shown or _single(arguments), accepted, workspace)


@pytest.mark.parametrize(
    ("case", "callback", "arguments", "error", "accepted"), CALLBACKS, ids=[c[0] for c in CALLBACKS]
)
def test_a_callback_refuses_a_bad_argument_before_any_file(
    outcome, workspace, case, callback, arguments, error, accepted
):
    place = {"dirpath": workspace / "run"} if callback is ModelCheckpoint else {}
    with pytest.raises(Exception) as raised:
        callback(**arguments, **place)
    shown = SHOWN.get(case) or _single({k: v for k, v in arguments.items() if k != "monitor"} or arguments)
    _check(outcome, case, raised, error, shown, accepted, workspace)


@pytest.mark.parametrize(("case", "arguments", "error", "accepted"), LAUNCH, ids=[c[0] for c in LAUNCH])
def test_launch_refuses_a_bad_argument_before_any_process(outcome, workspace, case, arguments, error, accepted):
    arguments = dict(arguments)
    target = arguments.pop("target", print)
    before = descendants(os.getpid())
    with pytest.raises(Exception) as raised:
        launch(target, **arguments)
    started = sorted(set(descendants(os.getpid())) - set(before))
    shown = _single(arguments or {"target": target})
    _check(outcome, case, raised, error, shown, accepted, workspace, processes_started=len(started))
    assert started == []


@pytest.mark.multiprocess
@pytest.mark.parametrize(("case", "flags", "shown", "accepted"), CLI, ids=[c[0] for c in CLI])
def test_the_cli_refuses_a_bad_flag_with_exit_status_2(outcome, workspace, case, flags, shown, accepted):
    script = workspace / "script.py"
    script.write_text(f"open({str(workspace / 'ran')!r}, 'w').close()\n")
    argv = [sys.executable, "-m", "gpulayer.runtime", "launch", *flags, str(script)]
    finished = run_command(argv, timeout=60, cwd=os.getcwd())
    message = finished.stderr.strip().splitlines()[-1] if finished.stderr.strip() else ""
    written = _written(workspace)
    outcome(
        "Bad input",
        case,
        exit_status=finished.returncode,
        message=message[:200],
        files_written=len(written),
        script_ran=(workspace / "ran").exists(),
        result=f"`gpulayer launch` exits {finished.returncode} naming {shown}; the script never ran",
    )
    assert finished.returncode == 2, finished.stderr
    assert message.startswith("gpulayer launch: error: "), finished.stderr
    assert shown in message and accepted in message, message
    assert written == []
