"""``HyperparametersMixin``: Lightning's ``save_hyperparameters()``, ``hparams`` and ``hparams_initial``."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import types
import warnings
from argparse import Namespace
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

from torch import nn

_PRIMITIVE_TYPES = (bool, int, float, str)
# Lightning drops these names from every ``__init__`` it reads, even when they are real parameters.
_NEVER_HYPERPARAMETERS = ("__class__", "frame", "frame_args")
_VAR_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
# The hyperparameters a builder (LightningCLI) gives the module it builds: save_hyperparameters saves these in place
# of the __init__ arguments it would read.
_given_hyperparameters: ContextVar[dict[str, Any] | None] = ContextVar("_given_hyperparameters", default=None)


@contextmanager
def given_hyperparameters(hparams: dict[str, Any], instantiator: str) -> Iterator[None]:
    """Within this block, ``save_hyperparameters`` saves ``hparams`` and ``_instantiator``, the dotted path of the
    function ``load_from_checkpoint`` rebuilds the module with (Lightning's ``_given_hyperparameters_context``)."""
    token = _given_hyperparameters.set({**hparams, "_instantiator": instantiator})
    try:
        yield
    finally:
        _given_hyperparameters.reset(token)


class AttributeDict(dict):
    """A ``dict`` whose keys are also attributes; printed as Lightning prints it, one sorted ``"key": value`` row."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{key}'") from e

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]

    def __repr__(self) -> str:
        if not self:
            return ""
        row = "{:" + str(max(len(str(key)) for key in self) + 3) + "s} {}"
        return "\n".join(row.format(f'"{key}":', self[key]) for key in sorted(self))


class HyperparametersMixin:
    """Lightning's ``HyperparametersMixin``, a base of ``Module`` and ``DataModule``."""

    __jit_unused_properties__: ClassVar[list[str]] = ["hparams", "hparams_initial"]  # TorchScript skips these

    def __init__(self) -> None:
        super().__init__()
        self._log_hyperparams = False

    def save_hyperparameters(
        self,
        *args: Any,
        ignore: Sequence[str] | str | None = None,
        frame: types.FrameType | None = None,
        logger: bool = True,
    ) -> None:
        """Store ``__init__`` arguments in ``hparams``: all of them, the ones named in ``args``, or one dict/Namespace.

        ``ignore`` names arguments to leave out (and drops them if a parent's call already saved them); ``logger``
        says whether the Trainer sends the hyperparameters to its loggers. A module that ``LightningCLI`` builds
        saves its configuration in place of the arguments.
        """
        self._log_hyperparams = logger
        if len(args) == 1 and not args[0]:  # an empty container: Lightning leaves everything as it was
            return
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        if not isinstance(frame, types.FrameType):
            raise AttributeError("There is no `frame` available while being required.")

        given = _given_hyperparameters.get()
        if given is not None:
            init_args = dict(given)
        elif dataclasses.is_dataclass(self):
            init_args = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        else:
            init_args = {}
            for level in _init_args_of_the_calling_chain(frame):
                init_args.update(level)

        ignored = [ignore] if isinstance(ignore, str) else [name for name in ignore or () if isinstance(name, str)]
        init_args = {name: value for name, value in init_args.items() if name not in ignored}

        not_named = [arg for arg in args if not isinstance(arg, str)]
        if not args:
            hparams = init_args
            self._hparams_name = "kwargs" if hparams else None
        elif len(not_named) == 1:
            hparams = not_named[0]
            # Lightning finds the parameter that held the object by equality, not identity.
            self._hparams_name = next((name for name, value in init_args.items() if value == hparams), None)
        else:
            hparams = {arg: init_args[arg] for arg in args if isinstance(arg, str)}
            self._hparams_name = "kwargs"

        self._set_hparams(hparams)
        self.remove_ignored_hparams(ignored)
        for name, value in self._hparams.items():
            if isinstance(value, nn.Module):
                warnings.warn(
                    f"Attribute {name!r} is an instance of `nn.Module` and is already saved during checkpointing."
                    f" It is recommended to ignore them using `self.save_hyperparameters(ignore=[{name!r}])`.",
                    UserWarning,
                    stacklevel=2,
                )
        self._hparams_initial = copy.deepcopy(self._hparams)

    def remove_ignored_hparams(self, ignore_list: list[str]) -> None:
        """Drop ``ignore_list`` from the saved hyperparameters, so a subclass can undo what its parent saved."""
        for key in ignore_list:
            self._hparams.pop(key, None)

    def _set_hparams(self, hparams: Any) -> None:
        # A dict is merged into what an earlier call saved; any other mapping replaces it.
        if isinstance(hparams, Namespace):
            hparams = vars(hparams)
        if isinstance(hparams, dict):
            hparams = AttributeDict(hparams)
        elif isinstance(hparams, _PRIMITIVE_TYPES):
            raise ValueError(f"Primitives {_PRIMITIVE_TYPES} are not allowed.")
        elif not isinstance(hparams, MutableMapping):
            raise ValueError(f"Unsupported config type of {type(hparams)}.")
        if isinstance(hparams, dict) and isinstance(self.hparams, dict):
            self.hparams.update(hparams)
        else:
            self._hparams = hparams

    @property
    def hparams(self) -> AttributeDict | MutableMapping:
        """The saved hyperparameters; yours to change (``hparams_initial`` keeps what was saved)."""
        if not hasattr(self, "_hparams"):
            self._hparams = AttributeDict()
        return self._hparams

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyperparameters as ``save_hyperparameters`` saved them."""
        if not hasattr(self, "_hparams_initial"):
            return AttributeDict()
        return copy.deepcopy(self._hparams_initial)


def init_argument_names(cls: type) -> list[str]:
    """The arguments ``cls.__init__`` takes by name: Lightning's ``parse_class_init_keys`` rule, ``self``, ``*args``
    and ``**kwargs`` are none."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())
    return [parameter.name for parameter in parameters[1:] if parameter.kind not in _VAR_KINDS]


def clean_namespace(hparams: MutableMapping, warn: bool = True) -> None:
    """Lightning's: drop the hyperparameters that cannot be pickled (a lambda, a local function), each with a warning
    when ``warn`` (global rank 0), so the first checkpoint save does not fail on them."""
    for key in [key for key, value in hparams.items() if not _is_picklable(value)]:
        if warn:
            warnings.warn(
                f"Attribute '{key}' removed from hparams because it cannot be pickled. You can suppress this warning"
                f" by setting `self.save_hyperparameters(ignore=['{key}'])`.",
                UserWarning,
                stacklevel=4,
            )
        del hparams[key]


def _is_picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):  # Lightning's list
        return False
    return True


def _init_args_of_the_calling_chain(frame: types.FrameType) -> list[dict[str, Any]]:
    """The arguments of the run of mixin ``__init__`` frames nearest ``frame``, innermost (the parent's) first.

    Lightning's rule: frames before the first such ``__init__`` are skipped, the first other frame ends the run (so an
    enclosing module's ``__init__`` directly above counts too), and only an ``__init__`` that uses ``super()`` (and so
    has a ``__class__`` cell) is seen.
    """
    levels: list[dict[str, Any]] = []
    while frame.f_back is not None:
        owner, init_args = _init_args(frame)
        if isinstance(owner, HyperparametersMixin):
            levels.append(init_args)
        elif levels:
            break
        frame = frame.f_back
    return levels


def _init_args(frame: types.FrameType) -> tuple[Any, dict[str, Any]]:
    """``(self, arguments)`` of an ``__init__`` frame as they are now, ``**kwargs`` spread and ``*args`` dropped."""
    local_vars = frame.f_locals
    if "__class__" not in local_vars or frame.f_code.co_name != "__init__":
        return None, {}
    parameters = list(inspect.signature(local_vars["__class__"].__init__).parameters.values())
    self_name = parameters[0].name
    init_args = {parameter.name: local_vars[parameter.name] for parameter in parameters}
    var_names = [parameter.name for parameter in parameters if parameter.kind in _VAR_KINDS]
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            init_args.update(init_args[parameter.name])
    dropped = {self_name, *var_names, *_NEVER_HYPERPARAMETERS}
    return local_vars[self_name], {name: value for name, value in init_args.items() if name not in dropped}
