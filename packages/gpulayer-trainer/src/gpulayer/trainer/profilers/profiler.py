"""``Profiler``, the base of Lightning 2.6's profilers (``lightning/pytorch/profilers/profiler.py``), and
``PassThroughProfiler``, the Trainer's default, which records nothing.

A profiler is told the stage by ``setup`` as each entry point starts, times actions between ``start`` and ``stop``
(or in ``with profile(name):``), and writes its ``summary`` when the stage ends (``describe``): to
``{dirpath}/{stage}-{filename}.txt`` when it has a ``filename``, else to its log at INFO, as Lightning writes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger(__name__)


class Profiler(ABC):
    """The base of every profiler: subclass it and define ``start`` and ``stop`` (and ``summary`` for a report)."""

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._output_file: TextIO | None = None
        self._write_stream: Callable[[str], Any] | None = None
        self._local_rank: int | None = None
        self._stage: str | None = None

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Start timing ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """Stop timing ``action_name`` and record it."""

    def summary(self) -> str:
        return ""

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """Time the block as ``action_name``."""
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Before a stage runs: its name, this process's local rank (None on one process), and the folder the
        report goes to when no ``dirpath`` was given (``trainer.log_dir``)."""
        self._stage = stage
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """Close the report's file."""
        self._write_stream = None
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None

    def describe(self) -> None:
        """Write the report of the stage, then tear down (the Trainer calls it as each stage ends)."""
        self._prepare_streams()
        summary = self.summary()
        if summary and self._write_stream is not None:
            self._write_stream(summary)
        if self._output_file is not None:
            self._output_file.flush()
        self.teardown(stage=self._stage)

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    def __del__(self) -> None:
        self.teardown(stage=self._stage)

    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """``{stage}-{filename}[-{local_rank}][-{action_name}]{extension}``, with path-unsafe characters made ``_``."""
        parts = [self._stage, self.filename, None if self._local_rank is None else str(self._local_rank), action_name]
        base = "-".join(part for part in parts if part)
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", base)).strip()
        return (base or "profile") + extension

    def _prepare_streams(self) -> None:
        if self._write_stream is not None:
            return
        if self.filename and self.dirpath:
            os.makedirs(self.dirpath, exist_ok=True)
            self._output_file = open(os.path.join(self.dirpath, self._prepare_filename()), "a")  # noqa: SIM115
            self._write_stream = self._output_file.write
        else:
            self._write_stream = self._rank_zero_info

    def _rank_zero_info(self, message: str) -> None:
        if self._local_rank in (None, 0):
            _shown(log).info(message)

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        """A report of one text per action (Lightning's layout for the advanced and PyTorch profilers)."""
        stage = f"{self._stage.upper()} " if self._stage is not None else ""
        lines = [f"{stage}Profiler Report"]
        rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
        for action, text in stats.items():
            lines += [f"Profile stats for: {action}{rank}", text]
        return os.linesep.join(lines)


class PassThroughProfiler(Profiler):
    """Records nothing: ``trainer.profiler`` when ``Trainer(profiler=None)`` (a hook's ``with
    self.trainer.profiler.profile("x"):`` runs its block and costs a call)."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass


def _shown(logger: logging.Logger) -> logging.Logger:
    """``logger`` at INFO, and printed on stderr when the program configured no logging: where Lightning's
    ``lightning.pytorch`` logger shows its reports (``lightning/pytorch/__init__.py``)."""
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
        if not logging.getLogger().hasHandlers():
            logger.addHandler(logging.StreamHandler(sys.stderr))
            logger.propagate = False
    return logger
