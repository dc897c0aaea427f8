"""Two records of one script (``recording.py``), Lightning's and GPUlayer's, compared as the differential tests
compare runs: call by call (which entry point; the rows its loggers got, in order; then the steps and epochs reached,
the metrics, what it returned, the checkpoint files), then the weights and the optimizers' state at the end.

Numbers are identical when equal bit for bit, and close within float32's tolerance as
``torch.testing.assert_close`` takes it (``rtol=1.3e-6``, ``atol=1e-5``); the first difference beyond it is reported
with where it was found and both values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

RTOL = 1.3e-6
ATOL = 1e-5
# What each call record holds, in the order compared after its rows.
CALL_KEYS = ("global_step", "current_epoch", "callback_metrics", "logged_metrics", "returned", "checkpoints", "error")


@dataclass(frozen=True)
class Difference:
    where: str  # "call 2 (fit), step 8: logged row 3['train_loss']"
    theirs: str  # Lightning's value, as shown
    ours: str  # GPUlayer's

    def __str__(self) -> str:
        return f"{self.where}: Lightning {self.theirs} != GPUlayer {self.ours}"


@dataclass(frozen=True)
class Comparison:
    difference: Difference | None  # the first, None when there is none
    largest: float  # the largest |a - b| of the numbers compared

    @property
    def verdict(self) -> str:
        if self.difference is not None:
            return f"differs at {self.difference}"
        if self.largest == 0:
            return "identical"
        return f"close (max |dw| = {self.largest:.3g}, within float tolerance)"


def compare_records(theirs: dict[str, Any], ours: dict[str, Any]) -> Comparison:
    """Lightning's record against GPUlayer's: the first difference, in the order the script ran."""
    walk = _Walk()
    calls = theirs["calls"], ours["calls"]
    for number, (their_call, our_call) in enumerate(zip(*calls, strict=False), start=1):
        name = their_call["call"]
        if name != our_call["call"]:
            return walk.done(Difference(f"call {number}", name, our_call["call"]))
        if difference := _rows(walk, f"call {number} ({name})", their_call["rows"], our_call["rows"]):
            return walk.done(difference)
        at = f"call {number} ({name}), step {their_call['global_step']} (its end)"
        for key in CALL_KEYS:
            if difference := walk.values(their_call[key], our_call[key], f"{at}: {key}"):
                return walk.done(difference)
    if len(calls[0]) != len(calls[1]):
        number = min(map(len, calls)) + 1
        shown = [f"{len(c)} calls ({', '.join(call['call'] for call in c) or 'none'})" for c in calls]
        return walk.done(Difference(f"call {number}", *shown))
    end = f"the end, step {calls[0][-1]['global_step']}" if calls[0] else "the end"
    for key in ("weights", "optimizers"):
        if difference := walk.values(theirs[key], ours[key], f"{end}: {key}"):
            return walk.done(difference)
    return walk.done(None)


def compare_values(theirs: Any, ours: Any, where: str = "") -> Comparison:
    """Any two recorded values (tensors, numbers, strings, lists, dicts), Lightning's first."""
    walk = _Walk()
    return walk.done(walk.values(theirs, ours, where))


def _rows(walk: _Walk, call: str, theirs: list[dict], ours: list[dict]) -> Difference | None:
    """The first row that differs, named by its step (Lightning's, or GPUlayer's where Lightning has none)."""
    for index in range(max(len(theirs), len(ours))):
        their_row = theirs[index] if index < len(theirs) else None
        our_row = ours[index] if index < len(ours) else None
        where = f"{call}, step {(their_row or our_row)['step']}: logged row {index + 1}"
        if their_row is None or our_row is None:
            return Difference(where, *(_shown(row["metrics"]) if row else "no row" for row in (their_row, our_row)))
        for key in ("step", "logger", "metrics"):
            if difference := walk.values(their_row[key], our_row[key], where if key == "metrics" else f"{where} {key}"):
                return difference
    return None


class _Walk:
    """Walks two values in step, keeping the largest difference between numbers."""

    def __init__(self) -> None:
        self.largest = 0.0

    def done(self, difference: Difference | None) -> Comparison:
        return Comparison(difference, self.largest)

    def values(self, theirs: Any, ours: Any, where: str) -> Difference | None:
        if isinstance(theirs, torch.Tensor) and isinstance(ours, torch.Tensor):
            return self._tensors(theirs, ours, where)
        if isinstance(theirs, dict) and isinstance(ours, dict):
            if set(theirs) != set(ours):
                return Difference(f"{where} (keys)", _keys(theirs, ours), _keys(ours, theirs))
            for key in theirs:
                if difference := self.values(theirs[key], ours[key], f"{where}[{key!r}]"):
                    return difference
            return None
        if isinstance(theirs, list) and isinstance(ours, list):
            if len(theirs) != len(ours):
                return Difference(f"{where} (length)", str(len(theirs)), str(len(ours)))
            for index, (their_item, our_item) in enumerate(zip(theirs, ours, strict=True)):
                if difference := self.values(their_item, our_item, f"{where}[{index}]"):
                    return difference
            return None
        if _number(theirs) and _number(ours):
            exact = not isinstance(theirs, float) and not isinstance(ours, float)
            return self._numbers(float(theirs), float(ours), where, exact=exact)
        return (
            None if type(theirs) is type(ours) and theirs == ours else Difference(where, _shown(theirs), _shown(ours))
        )

    def _numbers(self, theirs: float, ours: float, where: str, *, exact: bool) -> Difference | None:
        if theirs == ours or (math.isnan(theirs) and math.isnan(ours)):
            return None
        self.largest = max(self.largest, abs(theirs - ours))
        if exact or not abs(theirs - ours) <= ATOL + RTOL * abs(ours):
            return Difference(where, _shown(theirs), _shown(ours))
        return None

    def _tensors(self, theirs: torch.Tensor, ours: torch.Tensor, where: str) -> Difference | None:
        if theirs.shape != ours.shape or theirs.dtype != ours.dtype:
            shown = (f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in (theirs, ours))
            return Difference(f"{where} (shape, dtype)", *shown)
        same = (theirs == ours) | (theirs.isnan() & ours.isnan()) if theirs.is_floating_point() else theirs == ours
        if bool(same.all()):
            return None
        if not theirs.is_floating_point():
            return _at(theirs, ours, where, ~same)
        gap = (theirs.double() - ours.double()).abs().masked_fill(same, 0.0)
        self.largest = max(self.largest, float(gap.max()))
        beyond = ~(gap <= ATOL + RTOL * ours.double().abs()) & ~same
        return _at(theirs, ours, where, beyond) if bool(beyond.any()) else None


def _at(theirs: torch.Tensor, ours: torch.Tensor, where: str, differs: torch.Tensor) -> Difference:
    """The first element flagged in ``differs``, by its index."""
    index = tuple(int(i) for i in differs.nonzero()[0])
    place = f"[{', '.join(map(str, index))}]" if index else ""
    return Difference(f"{where}{place}", _shown(theirs[index].item()), _shown(ours[index].item()))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _keys(these: dict, those: dict) -> str:
    return f"{sorted(map(str, these))} (only here: {sorted(map(str, set(these) - set(those)))})"


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.8g}"
    if isinstance(value, dict):
        return _cut("{" + ", ".join(f"{key!r}: {_shown(item)}" for key, item in value.items()) + "}")
    return _cut("nothing" if value is None else repr(value) if isinstance(value, str) else str(value))


def _cut(text: str) -> str:
    return text if len(text) <= 120 else text[:117] + "..."
