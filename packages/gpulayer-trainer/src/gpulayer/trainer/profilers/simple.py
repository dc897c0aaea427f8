"""``SimpleProfiler``: the wall time of each action, reported as Lightning 2.6's table
(``lightning/pytorch/profilers/simple.py``): mean duration, and with ``extended`` the number of calls, total time
and share of the run."""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from pathlib import Path

from gpulayer.trainer.profilers.profiler import Profiler


class SimpleProfiler(Profiler):
    """Records the duration of each action. Its records and clock run across the entry points of a Trainer, so
    each stage's report holds the stages before it too, as Lightning's does."""

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None, extended: bool = True) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        if action_name not in self.current_actions:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        self.recorded_durations[action_name].append(end - self.current_actions.pop(action_name))

    def summary(self) -> str:
        sep = os.linesep
        stage = f"{self._stage.upper()} " if self._stage is not None else ""
        report = f"{stage}Profiler Report{sep}"
        if not self.recorded_durations:  # the title alone (Lightning's non-extended report fails here)
            return report + sep
        width = max(len(action) for action in self.recorded_durations)
        if self.extended:
            columns = ("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            rows, total_calls, total = self._extended_rows()
            first = ("Total", "-", f"{total_calls}", f"{total:.5}", "100 %")
        else:
            columns = ("Action", "Mean duration (s)", "Total time (s)")
            rows, first = self._rows(), None
        header = _row(columns, width, sep)
        rule = f"{sep}{'-' * len(header.expandtabs())}"
        report += rule + header + rule
        if first is not None:
            report += _row(first, width, sep) + rule
        report += "".join(_row(row, width, sep) for row in rows) + rule
        return report + sep

    def _extended_rows(self) -> tuple[list[tuple[str, ...]], int, float]:
        total = time.perf_counter() - self.start_time
        stats = []
        for action, durations in self.recorded_durations.items():
            spent = math.fsum(durations)
            stats.append((action, spent / len(durations), len(durations), spent, 100.0 * spent / total))
        stats.sort(key=lambda stat: stat[4], reverse=True)
        rows = [(a, f"{mean:.5}", f"{calls}", f"{spent:.5}", f"{share:.5}") for a, mean, calls, spent, share in stats]
        return rows, sum(stat[2] for stat in stats), total

    def _rows(self) -> list[tuple[str, ...]]:
        stats = [(a, math.fsum(d) / len(d), math.fsum(d)) for a, d in self.recorded_durations.items()]
        stats.sort(key=lambda stat: stat[1], reverse=True)
        return [(action, f"{mean:.5}", f"{spent:.5}") for action, mean, spent in stats]


def _row(cells: tuple[str, ...], width: int, sep: str) -> str:
    """One line of the table: the action padded to the longest, then each cell padded to 15, tab-separated."""
    action, *rest = cells
    return f"{sep}|  {action:<{width}s}\t|" + "".join(f"  {cell:<15}\t|" for cell in rest)
