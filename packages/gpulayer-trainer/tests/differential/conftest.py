"""Differential harness: one scenario, run under Lightning 2.6 and under GPUlayer, recorded the same way.

A scenario is a few keyword arguments (see ``Scenario``). ``build_module_class`` and friends turn it into a
module, a recording callback and optionally a data module on either framework's base classes, so the same
bodies run under both. ``run_scenario`` returns a ``Result``; ``differences`` lists every field where two results
disagree. Tests use the fixtures at the bottom: ``differential(**scenario)`` runs both frameworks and fails
with every difference, ``run(framework, **scenario)`` runs one, ``assert_same(expected, actual)`` compares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import itertools
import logging
import math
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

SEED = 1234
DATA_SEED = 99
SEED_VARIABLES = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")
MAX_DIFF_LINES = 80

# Every hook of a LightningModule that the harness records. Data hooks and eval steps are recorded only when the
# scenario defines them: Lightning treats a hook as "defined" only when it is overridden.
MODULE_HOOKS = (
    "configure_callbacks",
    "prepare_data",
    "setup",
    "configure_model",
    "configure_optimizers",
    "on_fit_start",
    "on_fit_end",
    "on_train_start",
    "on_train_end",
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_validation_start",
    "on_validation_end",
    "on_validation_epoch_start",
    "on_validation_epoch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_validation_model_eval",
    "on_validation_model_train",
    "on_validation_model_zero_grad",
    "on_test_start",
    "on_test_end",
    "on_test_epoch_start",
    "on_test_epoch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_test_model_eval",
    "on_test_model_train",
    "on_predict_start",
    "on_predict_end",
    "on_predict_epoch_start",
    "on_predict_epoch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
    "on_predict_model_eval",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "training_step",
    "validation_step",
    "test_step",
    "predict_step",
    "optimizer_step",
    "optimizer_zero_grad",
    "on_before_zero_grad",
    "on_before_backward",
    "backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "configure_gradient_clipping",
    "lr_scheduler_step",
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "predict_dataloader",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "teardown",
)
CALLBACK_HOOKS = (
    "setup",
    "teardown",
    "on_fit_start",
    "on_fit_end",
    "on_sanity_check_start",
    "on_sanity_check_end",
    "on_train_start",
    "on_train_end",
    "on_train_epoch_start",
    "on_train_epoch_end",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_validation_start",
    "on_validation_end",
    "on_validation_epoch_start",
    "on_validation_epoch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_start",
    "on_test_end",
    "on_test_epoch_start",
    "on_test_epoch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_start",
    "on_predict_end",
    "on_predict_epoch_start",
    "on_predict_epoch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "on_exception",
)
DATAMODULE_HOOKS = ("prepare_data", "setup", "teardown", "on_exception")
LOADER_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")

# Where Lightning passes (batch_idx, dataloader_idx) positionally, counted after self (and after trainer, pl_module
# for callbacks). Recorded so that hook traces show which batch a hook saw.
_BATCH_ARGUMENTS = {
    "on_train_batch_start": (1, None),
    "on_train_batch_end": (2, None),
    "training_step": (1, None),
    "optimizer_step": (1, None),
    "validation_step": (1, 2),
    "test_step": (1, 2),
    "predict_step": (1, 2),
    "on_before_batch_transfer": (None, 1),
    "transfer_batch_to_device": (None, 2),
    "on_after_batch_transfer": (None, 1),
    **{f"on_{stage}_batch_start": (1, 2) for stage in ("validation", "test", "predict")},
    **{f"on_{stage}_batch_end": (2, 3) for stage in ("validation", "test", "predict")},
}
_STEP_STAGES = {"training_step": "train", "validation_step": "val", "test_step": "test", "predict_step": "predict"}


@dataclass
class Framework:
    """One framework's public names, and how the harness builds its Trainer."""

    name: str
    Trainer: type
    Module: type
    DataModule: type
    Callback: type
    seed_everything: Callable[..., int]
    trainer_defaults: dict[str, Any]
    warns_freely: bool = False  # Lightning warns about many harmless things: its runs ignore warnings


@dataclass
class Scenario:
    """What to run. Every field has a small default: 10 training samples in batches of 4 (the last has 2)."""

    trainer: dict[str, Any] = field(default_factory=lambda: {"max_epochs": 2})
    stages: tuple[str, ...] = ("fit",)
    train_size: int = 10
    val_sizes: tuple[int, ...] = (6,)  # () = no validation_step and no val loader; two sizes = two val loaders
    test_size: int = 6
    predict_size: int = 6
    batch_size: int = 4
    shuffle: bool = False
    dropout: float = 0.0
    configure_optimizers: Callable[[Any], Any] | None = None  # module -> return value; default plain SGD
    # Module hook bodies replacing the defaults. None leaves a hook to the framework's base class, unrecorded
    # (no validation_step; on_validation_model_train not overridden).
    module: dict[str, Callable[..., Any] | None] = field(default_factory=dict)
    callback: dict[str, Callable[..., Any]] = field(default_factory=dict)  # bodies run after recording the call
    # "module" hooks, a "datamodule", the data module passed positionally ("datamodule_positional": fit(model, dm),
    # test(model, dm)) or as "datamodule_as_dataloaders" (test(model, dataloaders=dm)), or loaders as "arguments".
    data_source: str = "module"
    estimate_stepping_batches: bool = False  # read trainer.estimated_stepping_batches in configure_optimizers
    documented_warning: bool = False  # Lightning documents a warning here: GPUlayer may warn too
    expect_error: bool = False  # an entry point raises: record up to there (and on_exception), stop the stages
    seed: int = SEED
    # Extra keyword arguments of an entry point, by stage label ("fit", "fit#2", ...): e.g. {"fit": {"ckpt_path": p}}.
    stage_arguments: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Called with the Trainer once every stage has run (e.g. to save a checkpoint); hooks it causes are recorded
    # under the stage label "after".
    after: Callable[[Any], Any] | None = None


@dataclass
class Result:
    """Everything one run recorded. ``differences`` compares two of these field by field."""

    precision: str = ""
    hooks: dict[str, list[str]] = field(default_factory=dict)  # stage -> "C.hook" / "M.hook" / "D.hook" calls
    calls: list[tuple[str, int, int, int]] = field(default_factory=list)  # (stage, epoch, batch_idx, global_step)
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)  # stage -> (global_step, current_epoch)
    callback_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # after each stage
    logged_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # after each stage
    progress_bar_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # after each stage
    returned: dict[str, Any] = field(default_factory=dict)  # validate/test/predict return values
    weights: dict[str, torch.Tensor] = field(default_factory=dict)  # after the last stage
    batch_end_outputs: list[Any] = field(default_factory=list)  # `outputs` of on_train_batch_end
    learning_rates: list[float] = field(default_factory=list)  # lr seen by each training_step
    estimated_stepping_batches: float | None = None
    extra: dict[str, list[Any]] = field(default_factory=dict)  # whatever scenario bodies `record`
    raised: bool = False  # an entry point raised (only with Scenario.expect_error)


class Recorder:
    """Collects one run's records; module, callback and data module all write here."""

    def __init__(self) -> None:
        self.result = Result()
        self.stage = ""
        self.sanity_checking = False

    def hook(self, prefix: str, name: str, args: tuple, kwargs: dict) -> None:
        self.result.hooks.setdefault(self.stage, []).append(
            prefix + "." + name + _describe_arguments(name, args, kwargs)
        )

    def extra(self, key: str, value: Any) -> None:
        self.result.extra.setdefault(key, []).append(value)


def _describe_arguments(name: str, args: tuple, kwargs: dict) -> str:
    """The arguments worth showing in a trace: `(fit)` for setup/teardown, `(b=1)` or `(b=1, dl=0)` for batch
    hooks, nothing otherwise."""
    if name in ("setup", "teardown"):
        stage = kwargs.get("stage", args[0] if args else None)
        return f"({getattr(stage, 'value', stage)})"
    batch_position, loader_position = _BATCH_ARGUMENTS.get(name, (None, None))
    parts = []
    if batch_position is not None:
        parts.append(f"b={_argument(args, kwargs, batch_position, 'batch_idx')}")
    if loader_position is not None:
        loader = _argument(args, kwargs, loader_position, "dataloader_idx")
        if loader is not None:
            parts.append(f"dl={loader}")
    return f"({', '.join(parts)})" if parts else ""


def _argument(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[position] if position < len(args) else None


def _recording(
    prefix: str, name: str, body: Callable[..., Any], skip: int = 0, signature: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """``body`` wrapped so that each call is recorded first. ``skip`` leading args (trainer, module) are not
    part of the hook's own argument positions.

    ``signature`` is the scenario's own body: the wrapper's ``__wrapped__`` points straight at it, so frameworks
    inspecting a step for ``batch_idx`` and ``dataloader_idx`` see its parameters (Lightning unwraps one level
    only). A base class body is not exposed that way: frameworks follow ``__wrapped__`` to decide whether a
    hook is overridden, and a recorded hook must count as overridden (Lightning calls `prepare_data`,
    `configure_model` and `on_validation_model_train` only then)."""

    def hook(self, *args, **kwargs):
        recorder = self._recorder
        recorder.hook(prefix, name, args[skip:], kwargs)
        if name == "on_sanity_check_start":
            recorder.sanity_checking = True
        result = body(self, *args, **kwargs)
        if name == "on_sanity_check_end":
            recorder.sanity_checking = False
        return result

    return functools.update_wrapper(hook, signature) if signature is not None else hook


def _data(size: int, offset: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(DATA_SEED + offset)
    return TensorDataset(torch.randn(size, 4, generator=generator), torch.randn(size, 2, generator=generator))


class _Loaders:
    """The scenario's data as DataLoader factories, called afresh by every `*_dataloader` hook."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.train = _data(scenario.train_size, 0)
        self.val = [_data(size, 10 + i) for i, size in enumerate(scenario.val_sizes)]
        self.test = _data(scenario.test_size, 20)
        self.predict = _data(scenario.predict_size, 30)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.scenario.batch_size, shuffle=self.scenario.shuffle)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        loaders = [DataLoader(data, batch_size=self.scenario.batch_size) for data in self.val]
        return loaders[0] if len(loaders) == 1 else loaders

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=self.scenario.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.predict, batch_size=self.scenario.batch_size)


# Default bodies of the scenario module. Tests replace any of them through `Scenario.module`.
def _forward(self, x):
    return self.net(x)


def _loss(self, batch):
    x, y = batch
    return F.mse_loss(self(x), y)


def _training_step(self, batch, batch_idx):
    loss = self.loss(batch)
    self.log("train_loss", loss)
    return loss


def _validation_step(self, batch, batch_idx, dataloader_idx=0):
    self.log("val_loss", self.loss(batch))


def _test_step(self, batch, batch_idx, dataloader_idx=0):
    self.log("test_loss", self.loss(batch))


def _predict_step(self, batch, batch_idx, dataloader_idx=0):
    return self(batch[0])


def _sgd(self):
    return self.sgd()


def _record_step(body: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Wrap a step body so it also appends (stage, epoch, batch_idx, global_step) to ``calls``."""

    def step(self, batch, batch_idx, *args, **kwargs):
        recorder = self._recorder
        stage = "sanity" if name == "validation_step" and recorder.sanity_checking else _STEP_STAGES[name]
        loader = kwargs.get("dataloader_idx", args[0] if args else None)
        if loader is not None:
            stage += f"/{loader}"
        trainer = self.trainer
        recorder.result.calls.append((stage, trainer.current_epoch, batch_idx, trainer.global_step))
        if name == "training_step" and self.created_optimizers:
            recorder.result.learning_rates.append(self.created_optimizers[0].param_groups[0]["lr"])
        return body(self, batch, batch_idx, *args, **kwargs)

    return step


def _estimating(body: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap configure_optimizers so it first reads ``trainer.estimated_stepping_batches`` (as schedulers do)."""

    def configure_optimizers(self):
        self._recorder.result.estimated_stepping_batches = self.trainer.estimated_stepping_batches
        return body(self)

    return configure_optimizers


def _record_outputs(body: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap on_train_batch_end so it also appends its ``outputs`` (tensors as floats) to ``batch_end_outputs``."""

    def on_train_batch_end(self, outputs, batch, batch_idx, *args, **kwargs):
        self._recorder.result.batch_end_outputs.append(_as_floats(outputs))
        return body(self, outputs, batch, batch_idx, *args, **kwargs)

    return on_train_batch_end


def _as_floats(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    if isinstance(value, dict):
        return {key: _as_floats(item) for key, item in value.items()}
    return _plain(value)


def build_module_class(framework: Framework, scenario: Scenario) -> type:
    """The scenario's module on ``framework.Module``: every hook recorded, scenario bodies where given."""
    base = framework.Module
    bodies: dict[str, Callable[..., Any]] = {
        "training_step": _training_step,
        "predict_step": _predict_step,
        "configure_optimizers": scenario.configure_optimizers or _sgd,
        "test_step": _test_step,
    }
    if scenario.val_sizes:
        bodies["validation_step"] = _validation_step
    if scenario.data_source == "module":
        loaders = dict.fromkeys(LOADER_HOOKS)
        if not scenario.val_sizes:
            del loaders["val_dataloader"]
        for name in loaders:
            bodies[name] = _loader_hook(name)
    bodies.update(scenario.module)
    if scenario.estimate_stepping_batches:
        bodies["configure_optimizers"] = _estimating(bodies["configure_optimizers"])

    def init(self, recorder: Recorder, loaders: _Loaders) -> None:
        base.__init__(self)
        self._recorder = recorder
        self._loaders = loaders
        self.net = nn.Sequential(nn.Dropout(scenario.dropout), nn.Linear(4, 2))
        self.created_optimizers: list[torch.optim.Optimizer] = []

    def sgd(self, lr: float = 0.1, **kwargs: Any) -> torch.optim.Optimizer:
        """A fresh SGD over all parameters, remembered so the harness can read its learning rate."""
        optimizer = torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9, **kwargs)
        self.created_optimizers.append(optimizer)
        return optimizer

    def record(self, key: str, value: Any) -> None:
        self._recorder.extra(key, value)

    namespace: dict[str, Any] = {
        "__init__": init,
        "forward": _forward,
        "loss": _loss,
        "sgd": sgd,
        "record": record,
        "__module__": __name__,
    }
    for name in MODULE_HOOKS:
        if name in scenario.module and scenario.module[name] is None:
            continue
        body = bodies.get(name)
        own = body is not None
        if not own:
            if name in LOADER_HOOKS or name in ("validation_step", "test_step") or not hasattr(base, name):
                continue  # not defined by the scenario; overriding would change what the framework runs
            body = getattr(base, name)
        signature = bodies.get(name) if own else None
        if name in _STEP_STAGES:
            body = _record_step(body, name)
        elif name == "on_train_batch_end":
            body = _record_outputs(body)
        namespace[name] = _recording("M", name, body, signature=signature)
    for name, body in scenario.module.items():
        if name not in MODULE_HOOKS and body is not None:
            namespace[name] = body  # e.g. a removed 1.x hook, to see it refused
    return type(f"{framework.name.capitalize()}ScenarioModule", (base,), namespace)


def _loader_hook(name: str) -> Callable[..., Any]:
    def hook(self):
        return getattr(self._loaders, name)()

    hook.__name__ = name
    return hook


def build_callback_class(framework: Framework, scenario: Scenario) -> type:
    """A callback that records every hook, then runs the scenario's body for it (if any)."""
    base = framework.Callback

    def init(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def nothing(self, *args, **kwargs):
        return None

    namespace: dict[str, Any] = {"__init__": init, "__module__": __name__}
    for name in CALLBACK_HOOKS:
        if not hasattr(base, name):
            continue
        body = scenario.callback.get(name)
        namespace[name] = _recording("C", name, body or nothing, skip=2, signature=body)
    return type(f"{framework.name.capitalize()}RecordingCallback", (base,), namespace)


def build_datamodule_class(framework: Framework, scenario: Scenario) -> type:
    """A data module serving the scenario's data; its prepare/setup/teardown/loader hooks are recorded."""
    base = framework.DataModule

    def init(self, recorder: Recorder, loaders: _Loaders) -> None:
        base.__init__(self)
        self._recorder = recorder
        self._loaders = loaders

    def nothing(self, *args, **kwargs):
        return None

    namespace: dict[str, Any] = {"__init__": init, "__module__": __name__}
    for name in DATAMODULE_HOOKS:
        if hasattr(base, name):
            namespace[name] = _recording("D", name, nothing)
    for name in LOADER_HOOKS:
        if name == "val_dataloader" and not scenario.val_sizes:
            continue
        namespace[name] = _recording("D", name, _loader_hook(name))
    return type(f"{framework.name.capitalize()}ScenarioDataModule", (base,), namespace)


def _floats(metrics: Any) -> dict[str, float]:
    return {key: float(value) for key, value in dict(metrics).items()}


def _plain(value: Any) -> Any:
    """Detached copies of tensors inside dicts/lists, so later training cannot change what was recorded."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


def run_scenario(framework: Framework, scenario: Scenario, root: Path) -> Result:
    """Seed, build module/callback/data module and Trainer, run every stage of ``scenario``, return the record."""
    recorder = Recorder()
    result = recorder.result
    quiet = framework.warns_freely or scenario.documented_warning
    with warnings.catch_warnings() if quiet else contextlib.nullcontext():
        if quiet:
            warnings.simplefilter("ignore")
        framework.seed_everything(scenario.seed)
        loaders = _Loaders(scenario)
        module = build_module_class(framework, scenario)(recorder, loaders)
        callback = build_callback_class(framework, scenario)(recorder)
        datamodule = None
        if scenario.data_source.startswith("datamodule"):
            datamodule = build_datamodule_class(framework, scenario)(recorder, loaders)
        arguments = {
            **framework.trainer_defaults,
            "default_root_dir": root,
            "callbacks": [callback],
            **scenario.trainer,
        }
        trainer = framework.Trainer(**arguments)
        result.precision = str(trainer.precision)
        runs: Counter[str] = Counter()
        for stage in scenario.stages:
            runs[stage] += 1
            label = stage if runs[stage] == 1 else f"{stage}#{runs[stage]}"  # a repeated entry point: "fit#2"
            recorder.stage = label
            try:
                returned = _run_stage(trainer, module, datamodule, loaders, stage, scenario.stage_arguments.get(label))
            except Exception:
                if not scenario.expect_error:
                    raise
                result.raised = True
                result.counters[label] = (trainer.global_step, trainer.current_epoch)
                break
            if stage != "fit":
                result.returned[label] = _plain(returned)
            result.counters[label] = (trainer.global_step, trainer.current_epoch)
            result.callback_metrics[label] = _floats(trainer.callback_metrics)
            result.logged_metrics[label] = _floats(trainer.logged_metrics)
            result.progress_bar_metrics[label] = _floats(trainer.progress_bar_metrics)
        if scenario.after is not None and not result.raised:
            recorder.stage = "after"
            scenario.after(trainer)
        result.weights = {key: value.detach().clone() for key, value in module.state_dict().items()}
    return result


def _run_stage(
    trainer: Any, module: Any, datamodule: Any, loaders: _Loaders, stage: str, arguments: dict[str, Any] | None = None
) -> Any:
    """Call the Trainer entry point for ``stage`` with the scenario's data source (and ``arguments``)."""
    source = loaders.scenario.data_source
    if source == "datamodule_positional":
        return getattr(trainer, stage)(module, datamodule, **(arguments or {}))
    if source == "datamodule_as_dataloaders":
        keyword = "train_dataloaders" if stage == "fit" else "dataloaders"
        return getattr(trainer, stage)(module, **{keyword: datamodule}, **(arguments or {}))
    if datamodule is not None:
        data: dict[str, Any] = {"datamodule": datamodule}
    elif loaders.scenario.data_source == "arguments":
        data = {
            "fit": {
                "train_dataloaders": loaders.train_dataloader(),
                "val_dataloaders": loaders.val_dataloader() if loaders.val else None,
            },
            "validate": {"dataloaders": loaders.val_dataloader() if loaders.val else None},
            "test": {"dataloaders": loaders.test_dataloader()},
            "predict": {"dataloaders": loaders.predict_dataloader()},
        }[stage]
    else:
        data = {}
    return getattr(trainer, stage)(module, **data, **(arguments or {}))


# ---- comparison ------------------------------------------------------------------------------------------------


def differences(expected: Result, actual: Result) -> list[str]:
    """Every field where ``actual`` differs from ``expected``, as readable lines (empty when they agree)."""
    problems: list[str] = []
    for item in dataclasses.fields(Result):
        want, got = getattr(expected, item.name), getattr(actual, item.name)
        if item.name == "hooks":
            for stage in sorted(set(want) | set(got)):
                _compare_sequences(f"hooks[{stage}]", want.get(stage, []), got.get(stage, []), problems)
        elif item.name == "calls":
            _compare_sequences("calls", [str(c) for c in want], [str(c) for c in got], problems)
        else:
            _compare(item.name, want, got, problems)
    return problems


def _compare_sequences(label: str, want: list[str], got: list[str], problems: list[str]) -> None:
    if want != got:
        diff = list(difflib.unified_diff(want, got, "lightning", "gpulayer", n=2, lineterm=""))
        if len(diff) > MAX_DIFF_LINES:
            diff = [*diff[:MAX_DIFF_LINES], f"... {len(diff) - MAX_DIFF_LINES} more diff lines"]
        problems.append(f"{label} differ:\n    " + "\n    ".join(diff))


def _compare(label: str, want: Any, got: Any, problems: list[str]) -> None:
    """Structure and keys exactly, tensors with assert_close's default tolerances, floats to 1e-5 relative."""
    if isinstance(want, dict) and isinstance(got, dict):
        if list(want) != list(got) and set(want) != set(got):
            problems.append(f"{label}: keys {sorted(want)} (lightning) != {sorted(got)} (gpulayer)")
            return
        for key in want:
            _compare(f"{label}[{key!r}]", want[key], got[key], problems)
    elif isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(want) != len(got):
            problems.append(f"{label}: length {len(want)} (lightning) != {len(got)} (gpulayer): {want} != {got}")
            return
        for index, (a, b) in enumerate(zip(want, got, strict=True)):
            _compare(f"{label}[{index}]", a, b, problems)
    elif isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
        try:
            torch.testing.assert_close(got, want)
        except AssertionError as error:
            problems.append(f"{label}: " + str(error).replace("\n", "\n    "))
    elif isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        same = want == got or (math.isnan(want) and math.isnan(got)) or math.isclose(want, got, rel_tol=1e-5)
        if not same:
            problems.append(f"{label}: {want!r} (lightning) != {got!r} (gpulayer)")
    elif want != got:
        problems.append(f"{label}: {want!r} (lightning) != {got!r} (gpulayer)")


# ---- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def restores_seed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """seed_everything sets PL_GLOBAL_SEED / PL_SEED_WORKERS; monkeypatch puts back whatever was there."""
    for name in SEED_VARIABLES:
        monkeypatch.setenv(name, "")  # remembers the original value (or its absence) for teardown
        monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def lightning() -> Framework:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl = pytest.importorskip("lightning.pytorch", reason="the differential tests compare against lightning")
    return Framework(
        name="lightning",
        Trainer=pl.Trainer,
        Module=pl.LightningModule,
        DataModule=pl.LightningDataModule,
        Callback=pl.Callback,
        seed_everything=pl.seed_everything,
        trainer_defaults={
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "enable_checkpointing": False,
            "accelerator": "cpu",
            "devices": 1,
        },
        warns_freely=True,
    )


@pytest.fixture(scope="session")
def gpulayer() -> Framework:
    from gpulayer import trainer as gl

    return Framework(
        name="gpulayer",
        Trainer=gl.Trainer,
        Module=gl.Module,
        DataModule=gl.DataModule,
        Callback=gl.Callback,
        seed_everything=gl.seed_everything,
        trainer_defaults={"logger": False, "enable_checkpointing": False, "accelerator": "cpu", "devices": 1},
    )


@pytest.fixture
def run(lightning: Framework, gpulayer: Framework, tmp_path: Path) -> Callable[..., Result]:
    """``run("lightning" | "gpulayer" | "gpulayer, Lightning's callback" | "gpulayer, Lightning's DataModule" |
    "gpulayer, Lightning's module", **scenario) -> Result``; the last three are GPUlayer with the recording callback, the
    scenario's data module or its module built on Lightning's ``Callback``, ``LightningDataModule`` or
    ``LightningModule``, as another library ships its callbacks, data modules and models."""
    frameworks = {
        "lightning": lightning,
        "gpulayer": gpulayer,
        "gpulayer, Lightning's callback": dataclasses.replace(gpulayer, Callback=lightning.Callback),
        "gpulayer, Lightning's DataModule": dataclasses.replace(gpulayer, DataModule=lightning.DataModule),
        "gpulayer, Lightning's module": dataclasses.replace(gpulayer, Module=lightning.Module),
    }
    count = itertools.count()

    def run_one(framework: str, **scenario: Any) -> Result:
        return run_scenario(frameworks[framework], Scenario(**scenario), tmp_path / f"{framework}-{next(count)}")

    return run_one


@pytest.fixture
def assert_same() -> Callable[..., None]:
    """``assert_same(expected, actual)``: fail listing every differing field."""

    def check(expected: Result, actual: Result) -> None:
        problems = differences(expected, actual)
        assert not problems, "GPUlayer differs from Lightning:\n" + "\n".join(problems)

    return check


@pytest.fixture
def list_differences() -> Callable[[Result, Result], list[str]]:
    """``list_differences(expected, actual)``: ``differences`` as a fixture, to gather several comparisons into
    one failure (test modules cannot import this conftest under ``--import-mode=importlib``)."""
    return differences


@pytest.fixture
def differential(run: Callable[..., Result], assert_same: Callable[..., None]) -> Callable[..., SimpleNamespace]:
    """``differential(**scenario)``: run under Lightning, then GPUlayer, assert every record is the same, and
    return ``SimpleNamespace(lightning=..., gpulayer=...)`` for further checks."""

    def compare(**scenario: Any) -> SimpleNamespace:
        expected = run("lightning", **scenario)
        actual = run("gpulayer", **scenario)
        if scenario.get("expect_error"):
            assert expected.raised, "the scenario was expected to raise under Lightning"
        assert_same(expected, actual)
        return SimpleNamespace(lightning=expected, gpulayer=actual)

    return compare


def quiet_lightning():
    """``lightning.pytorch``, its warnings ignored and its INFO lines off: call it inside ``warnings.catch_warnings``."""
    warnings.simplefilter("ignore")
    import lightning.pytorch as pl

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    return pl


def line_fitter(base: type) -> type:
    """A one-layer regression module (2 inputs) on ``base``, trained with SGD: for scenarios about the Trainer."""

    class LineFitter(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return LineFitter
