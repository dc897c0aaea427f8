"""A DataLoader remade around another sampler, by its own class, as Lightning 2.6 remakes it.

While a ``*_dataloader`` hook runs, every DataLoader and BatchSampler class (subclasses too) records the arguments
each new instance gets and the attributes set on it after its ``__init__`` (Lightning's ``_replace_dunder_methods``
in ``lightning/fabric/utilities/data.py``, as ``_request_dataloader`` in
``lightning/pytorch/trainer/connectors/data_connector.py`` uses it). A loader is remade by calling its class again
with those arguments and the new sampler: a subclass keeps its own arguments, and a BatchSampler subclass is remade
with the new sampler as its ``sampler``. A loader made elsewhere is remade from its attributes named like its
``__init__`` parameters. Lightning's ``_update_dataloader`` (``lightning/pytorch/utilities/data.py``) is the model,
its error types and messages included.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from gpulayer.trainer.data.batch_indices import BatchIndices
from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError, PossibleUserWarning

_CALL = "_gpulayer_init_call"  # the outermost __init__'s arguments
_DATASET = "_gpulayer_dataset"  # a DataLoader's dataset, as its innermost __init__ got it
_INSIDE = "_gpulayer_inside_init"
_ATTRIBUTE_CALLS = "_gpulayer_attribute_calls"  # (setattr or delattr, its arguments) after __init__, in order
_CURRENT = "_gpulayer_current_attribute_call"
_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class _InitCall:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    arg_names: tuple[str, ...]  # the names of ``args``
    defaults: dict[str, Any]  # the parameters left to their defaults


_lock = threading.RLock()
_capturing = False


@contextmanager
def capturing_init_arguments() -> Iterator[None]:
    """Record the init arguments of the DataLoaders and BatchSamplers made inside; the classes are restored on
    leaving. One thread at a time patches them (a nested use on the same thread patches nothing more)."""
    global _capturing
    with _lock:
        if _capturing:
            yield
            return
        patched: list[tuple[type, str, Any]] = []
        _capturing = True
        try:
            _patch(DataLoader, "dataset", patched)
            _patch(BatchSampler, None, patched)
            yield
        finally:
            _capturing = False
            for cls, name, original in reversed(patched):
                if original is None:
                    delattr(cls, name)
                else:
                    setattr(cls, name, original)


def rebuilt(
    loader: DataLoader,
    sampler: Sampler | Iterable,
    stage: str,
    is_global_zero: bool = True,
    record_indices: bool = False,
) -> DataLoader:
    """``loader`` made again by its class with ``sampler`` (Lightning's ``_update_dataloader``); for predict a
    batch sampler is made not to drop the last batch, and with ``record_indices`` it records each batch's indices."""
    args, kwargs = _init_arguments(loader, sampler, stage == "predict", is_global_zero)
    if record_indices and kwargs.get("batch_sampler") is not None:
        kwargs["batch_sampler"] = BatchIndices(kwargs["batch_sampler"])
    return _instantiated(loader, args, kwargs)


def is_shuffled(loader: object) -> bool:
    """Whether a loader shuffles (Lightning's ``_is_dataloader_shuffled``): its ``shuffle`` argument if it was made in
    a hook, else whether its (batch sampler's) sampler is a ``RandomSampler``."""
    call = getattr(loader, _CALL, None)
    if call is not None:
        if "shuffle" in call.kwargs:
            return call.kwargs["shuffle"]
        if "shuffle" in call.arg_names:
            return call.args[call.arg_names.index("shuffle")]
    if isinstance(getattr(loader, "dataset", None), IterableDataset) or not hasattr(loader, "sampler"):
        return False
    batch_sampler = loader.batch_sampler
    sampler = getattr(batch_sampler, "sampler", batch_sampler) if batch_sampler is not None else loader.sampler
    return isinstance(sampler, RandomSampler)


def _init_arguments(
    loader: DataLoader, sampler: Sampler | Iterable, predicting: bool, is_global_zero: bool
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Lightning's ``_get_dataloader_init_args_and_kwargs``: the arguments that make ``loader`` again."""
    if not isinstance(loader, DataLoader):
        raise ValueError(f"The dataloader {loader} needs to subclass `torch.utils.data.DataLoader`")
    call = getattr(loader, _CALL, None)
    params = dict(inspect.signature(loader.__init__).parameters)
    has_variadic_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    base_params = inspect.signature(DataLoader.__init__).parameters
    if call is not None:
        args, kwargs, arg_names = call.args, dict(call.kwargs), call.arg_names
        if has_variadic_kwargs:  # made in a hook: only DataLoader's arguments with defaults may go through **kwargs
            params.update({name: p for name, p in base_params.items() if p.default is not p.empty})
        dataset = kwargs.get("dataset", getattr(loader, _DATASET, None))
    else:
        attributes = {name: value for name, value in vars(loader).items() if not name.startswith("_")}
        attributes["multiprocessing_context"] = loader.multiprocessing_context  # a property
        if has_variadic_kwargs:
            params.update(base_params)
            params.pop("self", None)
        # Only what differs from the parameter's default, and always the dataset (it may hide in *args).
        kwargs = {
            name: value
            for name, value in attributes.items()
            if name == "dataset" or (name in params and params[name].default is not value)
        }
        args, arg_names, dataset = (), (), kwargs.get("dataset")
    if isinstance(dataset, IterableDataset):
        kwargs["batch_sampler"] = kwargs["sampler"] = None
    else:
        kwargs.update(_sampler_arguments(loader, sampler, predicting, is_global_zero))
    name = type(loader).__name__
    required = sorted(
        p.name
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        and p.name not in kwargs
        and p.name not in arg_names
    )
    if required:
        missing = ", ".join(f"`self.{arg}`" for arg in required)
        raise MisconfiguredValueError(
            f"Trying to inject custom `Sampler` into the `{name}` instance. This would fail as some of the `__init__` "
            f"arguments are not available as instance attributes. The missing attributes are {required}. If you "
            f"instantiate your `{name}` inside a `*_dataloader` hook of your module, we will do this for you. "
            f"Otherwise, define {missing} inside your `__init__`."
        )
    unknown = sorted((set(kwargs) | set(arg_names)) - params.keys())
    if not has_variadic_kwargs and unknown:
        raise MisconfiguredValueError(
            f"Trying to inject parameters into the `{name}` instance. This would fail as it doesn't expose all its "
            f"attributes in the `__init__` signature. The missing arguments are {unknown}. HINT: If you wrote the "
            f"`{name}` class, add the `__init__` arguments or allow passing `**kwargs`"
        )
    return args, kwargs


_NOT_A_BATCH_SAMPLER = (
    " Lightning can't inject a (distributed) sampler into your batch sampler, because it doesn't subclass PyTorch's "
    "`BatchSampler`. To mitigate this, either follow the API of `BatchSampler`{hook} or set "
    "`Trainer(use_distributed_sampler=False)`. If you choose the latter, you will be responsible for handling the "
    "distributed sampling within your batch sampler."
)


def _sampler_arguments(
    loader: DataLoader, sampler: Sampler | Iterable, predicting: bool, is_global_zero: bool
) -> dict[str, Any]:
    """Lightning's ``_dataloader_init_kwargs_resolve_sampler``: ``sampler`` as the loader's, or in its batch
    sampler when that is not a plain ``BatchSampler`` (any batch sampler for predict, to keep the last batch)."""
    batch_sampler = loader.batch_sampler
    cls = type(batch_sampler)
    if batch_sampler is None or (cls is BatchSampler and not predicting):
        return {"sampler": sampler, "shuffle": False, "batch_sampler": None}
    call = getattr(batch_sampler, _CALL, None)
    if call is not None:
        args, kwargs = call.args, dict(call.kwargs)
        if predicting:
            replaced, args, kwargs = _replaced("drop_last", False, call, args, kwargs)
            if not replaced and is_global_zero:
                warnings.warn(
                    f"Trying to inject `drop_last=False` into batch sampler since you are predicting, however it seems "
                    f"the class `{cls.__qualname__}` does not support it. Your predictions might be incomplete. To "
                    "mitigate this, expose `drop_last` in the `__init__` method of your custom class.",
                    UserWarning,
                    stacklevel=2,
                )
        replaced, args, kwargs = _replaced("sampler", sampler, call, args, kwargs)
        if not replaced:
            raise TypeError(
                "Trying to inject a modified sampler into the batch sampler; however, it seems the class "
                f"`{cls.__qualname__}` does not have an argument called `sampler.` To mitigate this, expose an "
                "argument `sampler` in the `__init__` method of your custom class."
            )
        batch_sampler = _instantiated(batch_sampler, args, kwargs)
    elif hasattr(batch_sampler, "batch_size") and hasattr(batch_sampler, "drop_last"):
        # Not made in a hook, but it looks like a BatchSampler.
        drop_last = False if predicting else batch_sampler.drop_last
        try:
            batch_sampler = cls(sampler, batch_size=batch_sampler.batch_size, drop_last=drop_last)
        except TypeError as error:
            if not re.match(r".*__init__\(\) (got multiple values)|(missing \d required)", str(error)):
                raise
            hook = " and instantiate your custom batch sampler inside the `*_dataloader` hook of your module,"
            raise TypeError(_NOT_A_BATCH_SAMPLER.format(hook=hook)) from error
    elif predicting:
        if is_global_zero:
            warnings.warn(
                f"You are using a custom batch sampler `{cls.__qualname__}` for prediction. Lightning would normally "
                "set `drop_last=False` to ensure all samples are returned, but for custom samplers it can't guarantee "
                "this. Make sure your sampler is configured correctly to return all indices.",
                PossibleUserWarning,
                stacklevel=2,
            )
    else:
        raise TypeError(_NOT_A_BATCH_SAMPLER.format(hook=""))
    # batch_sampler excludes batch_size, shuffle, sampler and drop_last
    return {"sampler": None, "shuffle": False, "batch_sampler": batch_sampler, "batch_size": 1, "drop_last": False}


def _replaced(
    name: str, value: Any, call: _InitCall, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[bool, tuple[Any, ...], dict[str, Any]]:
    """Lightning's ``_replace_value_in_saved_args``: whether ``name`` was an argument, and the arguments with it set."""
    if name in call.arg_names:
        index = call.arg_names.index(name)
        return True, (*args[:index], value, *args[index + 1 :]), kwargs
    if name in kwargs or name in call.defaults:
        return True, args, {**kwargs, name: value}
    return False, args, kwargs


def _instantiated(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Lightning's ``_reinstantiate_wrapped_cls``: ``original``'s class called again, then the attribute settings
    recorded after its ``__init__`` replayed."""
    cls = type(original)
    try:
        made = cls(*args, **kwargs)
    except TypeError as error:
        match = re.match(r".*__init__\(\) got multiple values .* '(\w+)'", str(error))
        if not match:
            raise
        (argument,) = match.groups()
        raise MisconfiguredTypeError(
            f"The {cls.__name__} implementation has an error where more than one `__init__` argument can be passed to "
            f"its parent's `{argument}=...` `__init__` argument. This is likely caused by allowing passing both a "
            f"custom argument that will map to the `{argument}` argument as well as `**kwargs`. `kwargs` should be "
            f"filtered to make sure they don't contain the `{argument}` key. This argument was automatically passed "
            "to your object by PyTorch Lightning."
        ) from error
    for method, arguments in getattr(original, _ATTRIBUTE_CALLS, []):
        method(made, *arguments)
    return made


def _patch(base: type, explicit: str | None, patched: list[tuple[type, str, Any]]) -> None:
    """Wrap ``__init__`` of ``base`` and its subclasses, and their ``__setattr__``/``__delattr__`` (``base``'s always,
    so that one in every chain records); adds (class, name, what its ``__dict__`` held or None) to ``patched``."""
    for cls in _with_subclasses(base):
        if "__init__" in cls.__dict__:
            patched.append((cls, "__init__", cls.__dict__["__init__"]))
            cls.__init__ = _recording_init(cls.__init__, explicit)  # type: ignore[misc]
        for name, method in (("__setattr__", setattr), ("__delattr__", delattr)):
            if name in cls.__dict__ or cls is base:
                patched.append((cls, name, cls.__dict__.get(name)))
                setattr(cls, name, _recording_attribute_call(getattr(cls, name), method))


def _with_subclasses(base: type) -> set[type]:
    found, stack = {base}, [base]
    while stack:
        for subclass in stack.pop().__subclasses__():
            if subclass not in found:
                found.add(subclass)
                stack.append(subclass)
    return found


def _recording_init(init: Callable[..., None], explicit: str | None) -> Callable[..., None]:
    """``init`` that first keeps its arguments on the instance (the outermost call's only), and the latest value of
    the ``explicit`` argument, which the base class gets last (Lightning's ``_wrap_init_method``)."""

    @functools.wraps(init)
    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> None:
        was_inside = getattr(obj, _INSIDE, False)
        object.__setattr__(obj, _INSIDE, True)
        defaults = {
            p.name: p.default
            for p in inspect.signature(init).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        arg_names = tuple(defaults)[: len(args)]
        if not hasattr(obj, _CALL):
            left = {k: v for k, v in defaults.items() if k not in kwargs and k not in arg_names and v is not _EMPTY}
            object.__setattr__(obj, _CALL, _InitCall(args, kwargs, arg_names, left))
        if explicit in arg_names:
            object.__setattr__(obj, _DATASET, args[arg_names.index(explicit)])
        elif explicit in kwargs:
            object.__setattr__(obj, _DATASET, kwargs[explicit])
        init(obj, *args, **kwargs)
        object.__setattr__(obj, _INSIDE, was_inside)

    return wrapper


def _recording_attribute_call(original: Callable[..., None], method: Callable[..., None]) -> Callable[..., None]:
    """``__setattr__``/``__delattr__`` that records each call made after ``__init__`` (once, however many classes
    of the chain it passes through: Lightning's ``_wrap_attr_method``)."""

    @functools.wraps(original)
    def wrapper(obj: Any, *args: Any) -> None:
        previous = getattr(obj, _CURRENT, (None, None))
        first = previous != (args[0], method)
        object.__setattr__(obj, _CURRENT, (args[0], method))
        original(obj, *args)
        if first and not getattr(obj, _INSIDE, True):
            object.__setattr__(obj, _ATTRIBUTE_CALLS, [*getattr(obj, _ATTRIBUTE_CALLS, []), (method, args)])
        object.__setattr__(obj, _CURRENT, previous)

    return wrapper
