"""What one run of a script is recorded by, for ``gpulayer port --verify`` and the porting corpus: for each
``fit``/``validate``/``test``/``predict`` call, the steps and epochs reached, ``callback_metrics`` and
``logged_metrics``, what it returned, the rows its loggers were given and the checkpoint files in the working folder;
at the end, the model's weights and the optimizers' state. These are what the differential tests compare.

``Recorder.install`` wraps the ``Trainer`` classes of Lightning (``lightning.pytorch``, ``pytorch_lightning``) and
GPUlayer as they are imported, so the script runs unedited and only the framework it imports is loaded; with
``steps`` set, each Trainer's arguments are capped on the way in (``trainer_caps.py``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from gpulayer.port.trainer_caps import capped

TRAINER_MODULES = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer", "gpulayer.trainer.trainer")
ENTRY_POINTS = ("fit", "validate", "test", "predict")


class Recorder:
    """Records every Trainer of this process; ``record()`` returns what it saw, as tensors and plain values."""

    def __init__(self, folder: Path, steps: int | None = None) -> None:
        self.folder = folder  # the working folder, where checkpoint files are looked for
        self.steps = steps  # None: the Trainers' arguments as the script gives them
        self.calls: list[dict[str, Any]] = []
        self.trainers: list[str] = []  # each Trainer built, by the class recorded (Lightning's or GPUlayer's)
        self.last_trainer: Any = None
        self._rows: list[dict[str, Any]] | None = None  # the running call's logged rows; None between calls
        self._module: Any = None  # the last call's module, and the last optimizers a call had
        self._optimizers: list[Any] = []
        self._loggers: list[Any] = []  # those whose log_metrics is recorded
        self._logging = 0  # how deep in a logger's own methods this process is

    def install(self) -> None:
        """Wrap each Trainer class imported already, and each one imported from now on."""
        for name in TRAINER_MODULES:
            if name in sys.modules:
                self._wrap(sys.modules[name].Trainer)
        sys.meta_path.insert(0, _AfterImport(TRAINER_MODULES, lambda module: self._wrap(module.Trainer)))

    def record(self, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The calls, then the last call's model weights and the last optimizers' state; ``error``: how the run
        ended, when it raised."""
        return {
            "calls": self.calls,
            "trainers": self.trainers,
            "weights": plain(self._module.state_dict()) if self._module is not None else {},
            "optimizers": [plain(optimizer.state_dict()) for optimizer in self._optimizers],
            "error": error,
        }

    def _wrap(self, trainer_class: type) -> None:
        init = trainer_class.__init__
        if getattr(init, "_recorded", False):
            return
        signature = inspect.signature(init)
        built = f"{trainer_class.__module__}.{trainer_class.__qualname__}"

        @functools.wraps(init)
        def __init__(trainer: Any, *args: Any, **kwargs: Any) -> None:
            if self.steps is not None:
                args, kwargs = _capped(signature, self.steps, trainer, args, kwargs)
            init(trainer, *args, **kwargs)
            self.trainers.append(built)
            for index, logger in enumerate(trainer.loggers):
                self._watch(logger, index)

        __init__._recorded = True  # type: ignore[attr-defined]
        trainer_class.__init__ = __init__
        for name in ENTRY_POINTS:
            setattr(trainer_class, name, self._recorded(getattr(trainer_class, name)))

    def _recorded(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            if self._rows is not None:  # an entry point called inside another (by a callback) is part of it
                return method(trainer, *args, **kwargs)
            self._rows = []
            returned = error = None
            try:
                returned = method(trainer, *args, **kwargs)
            except BaseException as raised:
                error = f"{type(raised).__name__}: {raised}"
                raise
            finally:
                self.calls.append(self._call(trainer, method.__name__, returned, error))
                self._rows = None
            return returned

        return call

    def _call(self, trainer: Any, name: str, returned: Any, error: str | None) -> dict[str, Any]:
        self.last_trainer = trainer
        if trainer.lightning_module is not None:
            self._module = trainer.lightning_module
        if trainer.optimizers:
            self._optimizers = list(trainer.optimizers)
        return {
            "call": name,
            "trainer": f"{type(trainer).__module__}.{type(trainer).__qualname__}",
            "global_step": trainer.global_step,
            "current_epoch": trainer.current_epoch,
            "callback_metrics": plain(trainer.callback_metrics),
            "logged_metrics": plain(trainer.logged_metrics),
            "returned": plain(returned),
            "rows": self._rows,
            "checkpoints": sorted(str(path.relative_to(self.folder)) for path in self.folder.rglob("*.ckpt")),
            "error": error,
        }

    def _watch(self, logger: Any, index: int) -> None:
        """Record the rows the Trainer gives ``logger`` during a call (Lightning passes them by keyword, GPUlayer
        not); not those a logger gives itself, as TensorBoard's ``log_hyperparams`` logs an ``hp_metric``."""
        if any(logger is watched for watched in self._loggers):
            return
        self._loggers.append(logger)
        signature = inspect.signature(logger.log_metrics)

        def row(*args: Any, **kwargs: Any) -> None:
            given = signature.bind(*args, **kwargs).arguments
            metrics = next(iter(given.values()))
            self._rows.append({"logger": index, "step": given.get("step"), "metrics": plain(metrics)})

        logger.log_metrics = self._inside_logger(logger.log_metrics, row)
        logger.log_hyperparams = self._inside_logger(logger.log_hyperparams)

    def _inside_logger(
        self, method: Callable[..., Any], first: Callable[..., None] | None = None
    ) -> Callable[..., Any]:
        """``method``, calling ``first`` with its arguments when the Trainer calls it within an entry point."""

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            if first is not None and self._rows is not None and not self._logging:
                first(*args, **kwargs)
            self._logging += 1
            try:
                return method(*args, **kwargs)
            finally:
                self._logging -= 1

        return call


def plain(value: Any) -> Any:
    """``value`` as tensors (detached copies on the CPU), numbers, strings, lists and dicts: what a record holds and
    ``torch.load(weights_only=True)`` reads back. Another object is named by its type."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, Mapping):
        return {key if isinstance(key, (str, int)) else str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _capped(
    signature: inspect.Signature, steps: int, trainer: Any, args: tuple, kwargs: dict[str, Any]
) -> tuple[tuple, dict[str, Any]]:
    """The Trainer's arguments, all by name, capped; as they were when they do not fit its signature (for its own
    error)."""
    try:
        bound = signature.bind(trainer, *args, **kwargs)
    except TypeError:
        return args, kwargs
    bound.apply_defaults()
    named = dict(list(bound.arguments.items())[1:])  # without the Trainer itself
    kinds = {signature.parameters[name].kind for name in named}
    if kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY}:
        return args, kwargs
    return (), capped(named, steps)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once a module named in ``names`` has been executed by its usual loader."""

    def __init__(self, names: tuple[str, ...], then: Callable[[ModuleType], None]) -> None:
        self.names = names
        self.then = then

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            self.then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader only
        return spec
