"""``PyTorchProfiler``: ``torch.profiler`` over a stage, each action marked with ``record_function``, reported as the
operators' table (Lightning 2.6's, ``lightning/pytorch/profilers/pytorch.py``).

Differences from Lightning's: every step is recorded unless a ``schedule`` is given (Lightning's default records
three steps of each kind after one to wait and one to warm up), a ``schedule`` counts the steps of every kind
together, and ``emit_nvtx`` is refused (run under Nsight with ``torch.autograd.profiler.emit_nvtx()``).
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.profiler import EventList, record_function
from torch.profiler import ProfilerAction, ProfilerActivity, tensorboard_trace_handler

from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError
from gpulayer.trainer.profilers.profiler import Profiler

if TYPE_CHECKING:
    from torch import nn


class RegisterRecordFunction:
    """While entered, each submodule's forward is marked ``[pl][module]{class path}: {name}`` in the profile."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._records: dict[str, record_function] = {}
        self._handles: list[Any] = []

    def _start(self, module: nn.Module, inputs: Any, record_name: str) -> None:
        record = record_function("[pl][module]" + record_name)
        record.__enter__()
        self._records[record_name] = record

    def _stop(self, module: nn.Module, inputs: Any, output: Any, record_name: str) -> None:
        self._records.pop(record_name).__exit__(None, None, None)

    def __enter__(self) -> None:
        for name, module in self._model.named_modules():
            if name:
                record_name = f"{type(module).__module__}.{type(module).__name__}: {name}"
                self._handles.append(
                    module.register_forward_pre_hook(functools.partial(self._start, record_name=record_name))
                )
                self._handles.append(
                    module.register_forward_hook(functools.partial(self._stop, record_name=record_name))
                )

    def __exit__(self, *exc_info: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class PyTorchProfiler(Profiler):
    """``torch.profiler.profile(**profiler_kwargs)`` from the first action of a stage to its end; the report is
    ``key_averages()``'s table (``row_limit`` rows sorted by ``sort_by_key``), and with ``export_to_chrome`` the
    trace is written to ``dirpath`` as ``{stage}-{filename}-{last step action}.{ns}.pt.trace.json``."""

    STEP_FUNCTIONS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})
    AVAILABLE_SORT_KEYS = frozenset(
        {
            "cpu_time",
            "cuda_time",
            "cpu_time_total",
            "cuda_time_total",
            "cpu_memory_usage",
            "cuda_memory_usage",
            "self_cpu_memory_usage",
            "self_cuda_memory_usage",
            "count",
        }
    )

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        group_by_input_shapes: bool = False,
        emit_nvtx: bool = False,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        record_module_names: bool = True,
        table_kwargs: dict[str, Any] | None = None,
        **profiler_kwargs: Any,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        activities = profiler_kwargs.get("activities") or [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
        )
        self._group_by_input_shapes = group_by_input_shapes and profiler_kwargs.get("record_shapes", False)
        self._export_to_chrome = export_to_chrome
        self._row_limit = row_limit
        self._sort_by_key = sort_by_key or f"{'cuda' if ProfilerActivity.CUDA in activities else 'cpu'}_time_total"
        self._record_module_names = record_module_names
        self._table_kwargs = dict(table_kwargs or {})
        self._has_on_trace_ready = "on_trace_ready" in profiler_kwargs
        self._profiler_kwargs = {**profiler_kwargs, "activities": activities}
        self.profiler: torch.profiler.profile | None = None
        self.function_events: EventList | None = None
        self._lightning_module: nn.Module | None = None  # the Trainer sets it as each stage starts
        self._register: RegisterRecordFunction | None = None
        self._recording_map: dict[str, record_function] = {}
        if emit_nvtx:
            raise MisconfiguredValueError(
                "PyTorchProfiler(emit_nvtx=True): GPUlayer does not emit NVTX ranges; run under Nsight Systems "
                "with torch.autograd.profiler.emit_nvtx() around fit instead"
            )
        _check_schedule(profiler_kwargs.get("schedule"))
        if self._sort_by_key not in self.AVAILABLE_SORT_KEYS:
            raise MisconfiguredValueError(
                f"Found sort_by_key: {self._sort_by_key}. Should be within {set(self.AVAILABLE_SORT_KEYS)}. "
            )
        valid = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
        for key in self._table_kwargs:
            if key in {"sort_by", "row_limit"}:
                raise KeyError(
                    f"Found invalid table_kwargs key: {key}. This is already a positional argument of the Profiler."
                )
            if key not in valid:
                raise KeyError(f"Found invalid table_kwargs key: {key}. Should be within {valid}.")

    def start(self, action_name: str) -> None:
        if self.profiler is None:
            accepted = inspect.signature(torch.profiler.profile.__init__).parameters
            self.profiler = torch.profiler.profile(**{k: v for k, v in self._profiler_kwargs.items() if k in accepted})
            self.profiler.__enter__()
        if self._lightning_module is not None and self._register is None and self._record_module_names:
            self._register = RegisterRecordFunction(self._lightning_module)
            self._register.__enter__()
        if action_name not in self._recording_map:
            recording = record_function("[pl][profile]" + action_name)
            recording.__enter__()
            self._recording_map[action_name] = recording

    def stop(self, action_name: str) -> None:
        recording = self._recording_map.pop(action_name, None)
        if recording is not None:
            recording.__exit__(None, None, None)
        if self.profiler is None or not any(action_name.endswith(step) for step in self.STEP_FUNCTIONS):
            return
        if not self._has_on_trace_ready:
            self.profiler.on_trace_ready = functools.partial(self._export, action_name)
        self.profiler.step()

    def _export(self, action_name: str, profiler: torch.profiler.profile) -> None:
        """The chrome trace, named as Lightning names it, when the profile ends (or its schedule saves)."""
        if self.dirpath is None:
            return
        if self._export_to_chrome:
            name = self._prepare_filename(action_name=action_name, extension="")
            tensorboard_trace_handler(str(self.dirpath), name)(profiler)

    def summary(self) -> str:
        if not self._profiler_kwargs.get("enabled", True):
            return ""
        self._delete_profilers()
        if not self.function_events:
            return ""
        averages = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes)
        table = averages.table(sort_by=self._sort_by_key, row_limit=self._row_limit, **self._table_kwargs)
        return self._stats_to_str({"records": table})

    def _delete_profilers(self) -> None:
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.function_events = self.profiler.events()
            self.profiler = None
        if self._register is not None:
            self._register.__exit__(None, None, None)
            self._register = None

    def teardown(self, stage: str | None) -> None:
        for recording in self._recording_map.values():
            recording.__exit__(None, None, None)
        self._recording_map = {}
        self._delete_profilers()
        super().teardown(stage=stage)


def _check_schedule(schedule: Any) -> None:
    """Lightning's checks of a ``schedule``: callable, and returning a ``torch.profiler.ProfilerAction``."""
    if schedule is None:
        return
    if not callable(schedule):
        raise MisconfiguredTypeError(f"Schedule should be a callable. Found: {schedule}")
    action = schedule(0)
    if not isinstance(action, ProfilerAction):
        raise MisconfiguredTypeError(f"Schedule should return a `torch.profiler.ProfilerAction`. Found: {action}")
