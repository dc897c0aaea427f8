"""Every ``Trainer`` argument, declared once, checked once at construction, and kept in one plain, frozen object.

Each argument is a field of ``TrainerArguments`` made by ``_argument(default, check, doc)``: its default (which
``Trainer.__init__``'s signature repeats, for IDEs and tools that read signatures; a test checks that the two agree
in names, defaults and order), the check that turns the value given into the value the loop reads
(``argument_checks.py``), and one line of doc. ``_trainer_property`` declares an argument that Lightning's
``Trainer`` also shows as a read-only property of its name: ``argument_properties`` adds it to the Trainer, with
the line of doc.

Checks run in declaration order, so a check can read the arguments checked before it. Errors name the argument,
the value and what is accepted, and are raised before any file or directory is made. Where Lightning only fails
later (``accumulate_grad_batches=0``, ``check_val_every_n_epoch=0``) we fail at once.
"""

# Each field's default is the call that makes it (dataclasses.field with the declaration), not a shared value.
# ruff: noqa: RUF009

from __future__ import annotations

import ast
import functools
import inspect
import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpulayer.trainer import argument_checks as checks
from gpulayer.trainer.exceptions import MisconfigurationException, MisconfiguredValueError

if TYPE_CHECKING:
    from gpulayer.trainer.core.callback import Callback
    from gpulayer.trainer.profilers.profiler import Profiler
    from gpulayer.trainer.strategies.strategy import Strategy


@dataclass(frozen=True)
class Declaration:
    """One ``Trainer`` argument: its default, its check, one line of doc, and whether the Trainer shows it."""

    default: Any
    check: checks.Check
    doc: str
    trainer_property: bool


def _argument(default: Any, check: checks.Check, doc: str) -> Any:
    return field(metadata={"declaration": Declaration(default, check, doc, trainer_property=False)})


def _trainer_property(default: Any, check: checks.Check, doc: str) -> Any:
    return field(metadata={"declaration": Declaration(default, check, doc, trainer_property=True)})


@dataclass(frozen=True, kw_only=True)
class TrainerArguments:
    """The checked arguments, in ``Trainer.__init__``'s order: what the loop reads, never re-parsed."""

    accelerator: str = _argument("auto", checks.accelerator, "'cpu', 'gpu' (or 'cuda'), or 'auto' (CUDA if any)")
    strategy: str | Strategy = _argument("auto", checks.strategy, "'auto', 'single_device', 'ddp', 'fsdp', a Strategy")
    devices: tuple[int, ...] | None = _argument("auto", checks.devices, "This node's device indices (None: 'auto')")
    num_nodes: int = _trainer_property(1, checks.at_least(1), "The number of nodes the job spans")
    precision: str = _trainer_property(None, checks.precision, "'32-true', 'bf16-mixed', ... (aliases resolved)")
    callbacks: list[Callback] = _argument(None, checks.callbacks, "The callbacks given (without the default ones)")
    fast_dev_run: int = _argument(False, checks.fast_dev_run, "Run this many batches of each stage, writing nothing")
    max_epochs: int | None = _argument(None, checks.at_least(-1, none=None), "Stop after this many epochs (-1: never)")
    min_epochs: int | None = _trainer_property(None, checks.at_least(0, none=None), "Train at least this many epochs")
    max_steps: int = _trainer_property(-1, checks.at_least(-1), "Stop after this many optimizer steps (-1: never)")
    min_steps: int | None = _trainer_property(None, checks.at_least(0, none=None), "Train at least this many steps")
    max_time: timedelta | None = _argument(None, checks.max_time, "Stop after this much time")
    limit_train_batches: int | float = _trainer_property(None, checks.limit, "Training batches per epoch (or fraction)")
    limit_val_batches: int | float = _trainer_property(
        None, checks.limit, "Validation batches per loader (or fraction)"
    )
    limit_test_batches: int | float = _trainer_property(None, checks.limit, "Test batches per loader (or fraction)")
    limit_predict_batches: int | float = _trainer_property(
        None, checks.limit, "Predict batches per loader (or fraction)"
    )
    val_check_interval: int | float | timedelta = _trainer_property(
        None, checks.val_check_interval, "Validate every this many training batches, fraction of an epoch, or time"
    )
    check_val_every_n_epoch: int | None = _trainer_property(
        1, checks.check_val_every_n_epoch, "Validate in every n-th epoch (None: by val_check_interval's batches alone)"
    )
    num_sanity_val_steps: int | float = _trainer_property(None, checks.sanity_steps, "Validation batches before fit")
    log_every_n_steps: int = _trainer_property(None, checks.at_least(0, none=50), "Log every this many train batches")
    enable_checkpointing: bool = _argument(None, checks.flag(none=True), "Add the default checkpoint if none is given")
    accumulate_grad_batches: int = _argument(1, checks.at_least(1), "Batches per optimizer step")
    gradient_clip_val: int | float | None = _trainer_property(
        None, checks.gradient_clip_val, "Clip gradients at this value (None or 0: no clipping)"
    )
    gradient_clip_algorithm: str | None = _trainer_property(None, checks.clip_algorithm, "'norm' (None too) or 'value'")
    deterministic: bool | str | None = _argument(
        None, checks.one_of(None, True, False, "warn"), "torch's deterministic algorithms: on, off, 'warn', or as is"
    )
    benchmark: bool | None = _argument(None, checks.one_of(None, True, False), "cuDNN autotuning (None: by run length)")
    inference_mode: bool = _argument(True, checks.flag(), "Evaluate under torch.inference_mode, else torch.no_grad")
    use_distributed_sampler: bool = _argument(True, checks.flag(), "Give each rank its share with a DistributedSampler")
    default_root_dir: str = _trainer_property(None, checks.root_dir, "Where logs and checkpoints go (None: the cwd)")
    logger: Any = _argument(None, checks.logger, "None/True: a CSVLogger; False: none; or loggers (logger.py)")
    enable_progress_bar: bool = _argument(None, checks.flag(none=True), "Print the log line")
    enable_model_summary: bool = _argument(None, checks.flag(none=True), "Accepted; GPUlayer prints no model summary")
    barebones: bool = _trainer_property(False, checks.flag(), "Turn off all that may cost speed (checkpoints, logs...)")
    detect_anomaly: bool = _argument(False, checks.flag(), "Run under torch.autograd's anomaly detection")
    overfit_batches: int | float = _trainer_property(
        0.0, checks.overfit_batches, "Train and validate on this many (or this fraction of) the first training batches"
    )
    reload_dataloaders_every_n_epochs: int = _trainer_property(0, checks.at_least(0), "Remake loaders every n epochs")
    sync_batchnorm: bool = _argument(False, checks.flag(), "Turn batch norms into SyncBatchNorm under DDP")
    enable_autolog_hparams: bool = _trainer_property(True, checks.flag(), "Log the hyperparameters to the loggers")
    profiler: Profiler | None = _argument(None, checks.profiler, "'simple', 'advanced', 'pytorch' or a Profiler")
    plugins: None = _argument(None, checks.unadopted, "Refused: GPUlayer takes no plugins")
    model_registry: None = _argument(None, checks.unadopted, "Refused: GPUlayer uploads nothing")
    prefetch: bool = _argument(False, checks.flag(), "GPUlayer's: load the next batches on a background thread")
    check_finite_loss: bool = _argument(True, checks.flag(), "GPUlayer's: end fit at a NaN or inf loss")


DECLARATIONS: dict[str, Declaration] = {f.name: f.metadata["declaration"] for f in fields(TrainerArguments)}
_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")


def parse_arguments(given: Mapping[str, Any]) -> TrainerArguments:
    """Check each declared argument of ``given`` (``Trainer.__init__``'s locals) after ``barebones`` turned off
    what it turns off; then ``fast_dev_run``'s and ``overfit_batches``' overrides."""
    if DECLARATIONS["barebones"].check("barebones", given["barebones"], {}):
        given = {**given, **_barebones(given)}
    checked: dict[str, Any] = {}
    for name, declared in DECLARATIONS.items():
        try:
            checked[name] = declared.check(name, given[name], checked)
        except MisconfigurationException as error:
            error.argument = name  # for tools that say where the value came from (LightningCLI)
            raise
    return TrainerArguments(**checked | _overrides(checked))


def _barebones(given: Mapping[str, Any]) -> dict[str, Any]:
    """Lightning's ``barebones=True``: an argument that turns on what barebones turns off is an error; the others
    are turned off."""
    turned_on = {
        "enable_checkpointing": given["enable_checkpointing"],
        "logger": given["logger"] not in (None, False),
        "enable_progress_bar": given["enable_progress_bar"],
        "log_every_n_steps": given["log_every_n_steps"] not in (None, 0),
        "enable_model_summary": given["enable_model_summary"],
        "num_sanity_val_steps": given["num_sanity_val_steps"] not in (None, 0),
        "fast_dev_run": given["fast_dev_run"] not in (False, 0),
        "detect_anomaly": given["detect_anomaly"],
        "profiler": given["profiler"] is not None,
    }
    for name, on in turned_on.items():
        if on:
            error = MisconfiguredValueError(
                f"barebones=True with {name}={given[name]!r}: barebones mode turns off everything that may cost "
                "speed (checkpoints, logging, the log line, the sanity check, fast_dev_run, anomaly detection, "
                f"profiling); drop {name} or barebones"
            )
            error.argument = name
            raise error
    off = dict.fromkeys(("enable_checkpointing", "logger", "enable_progress_bar", "enable_model_summary"), False)
    return off | {"log_every_n_steps": 0, "num_sanity_val_steps": 0}


def _overrides(checked: Mapping[str, Any]) -> dict[str, Any]:
    """What ``fast_dev_run`` sets, then ``overfit_batches``' limits (over fast_dev_run's, as in Lightning)."""
    changed: dict[str, Any] = {}
    runs = checked["fast_dev_run"]
    if runs:
        changed = dict.fromkeys(_LIMITS, runs) | {"max_steps": runs, "max_epochs": 1, "num_sanity_val_steps": 0}
        changed |= {"val_check_interval": 1.0, "check_val_every_n_epoch": 1}
    if checked["overfit_batches"] > 0:
        changed |= dict.fromkeys(("limit_train_batches", "limit_val_batches"), checked["overfit_batches"])
    return changed


def defaults_from_environment(init: Callable[..., None]) -> Callable[..., None]:
    """Lightning's ``PL_TRAINER_<ARGUMENT>`` variables: each gives the default of a ``Trainer`` argument the call
    does not pass (``PL_TRAINER_MAX_EPOCHS=3``); the value is read as a Python literal where it is one, else as
    text."""
    names = [name for name in inspect.signature(init).parameters if name != "self"]

    @functools.wraps(init)
    def with_environment_defaults(self: Any, **given: Any) -> None:
        for name in names:
            text = os.environ.get(f"PL_TRAINER_{name.upper()}")
            if text and name not in given:
                try:
                    given[name] = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    given[name] = text
        init(self, **given)

    return with_environment_defaults


def argument_properties(cls: type) -> type:
    """Give ``cls`` (the Trainer) a read-only property for each argument declared with ``_trainer_property``: it
    returns ``self.args.<name>``, and its doc is the declaration's."""
    for name, declared in DECLARATIONS.items():
        if declared.trainer_property:
            if hasattr(cls, name):
                raise TypeError(f"{cls.__name__}.{name} is both defined and declared a trainer property: keep one")
            setattr(cls, name, property(operator.attrgetter(f"args.{name}"), doc=declared.doc))
    return cls
