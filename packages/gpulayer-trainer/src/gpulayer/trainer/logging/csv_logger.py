"""Lightning's ``CSVLogger`` files: ``<save_dir>/<name>/version_<N>/metrics.csv`` and ``hparams.yaml``, byte for byte.

As Lightning's (whose ``log_hyperparams``, ``log_metrics``, ``save`` and ``finalize`` are ``rank_zero_only``), it is
called on every rank and writes nothing off global rank 0."""

from __future__ import annotations

import csv
import io
import os
import warnings
from typing import Any

from gpulayer.trainer.logging.logger import Logger
from gpulayer.trainer.logging.rank_zero import rank_zero_only
from gpulayer.trainer.logging.yaml_dump import hparams_document
from gpulayer.trainer.private_files import make_folders, write_atomically

# Lightning's log_metrics also saves by itself every 100 steps (its default ``flush_logs_every_n_steps``).
_FLUSH_EVERY_N_STEPS = 100


class CSVLogger(Logger):
    """Buffers metric rows and writes them as Lightning's CSVLogger does; hparams go to YAML as PyYAML dumps them."""

    def __init__(self, save_dir: str, name: str | None = "lightning_logs", version: int | str | None = None) -> None:
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = version
        self._started = False
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._hparams: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = self._next_version()
        return self._version

    def settle_version(self, runtime: Any) -> None:
        """On several ranks, every rank takes rank 0's version (each would otherwise pick the next free folder
        itself, at a different moment)."""
        if runtime.world_size > 1:
            self._version = runtime.broadcast(self.version if runtime.is_global_zero else None)

    @property
    def root_dir(self) -> str:
        """The folder holding every version of this experiment (``save_dir/name``)."""
        return os.path.join(self.save_dir, self.name)

    @property
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.join(self.save_dir, self.name, version)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Adds ``params`` to the hparams logged so far and rewrites ``hparams.yaml`` with all of them."""
        self._start()
        self._hparams.update(params)
        write_atomically(os.path.join(self.log_dir, "hparams.yaml"), hparams_document(self._hparams).encode())

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._start()
        if step is None:  # Lightning's quirk: the number of rows buffered since the last save
            step = len(self._rows)
        self._rows.append({**metrics, "step": step})
        if (step + 1) % _FLUSH_EVERY_N_STEPS == 0:
            self.save()

    @rank_zero_only
    def save(self) -> None:
        """Appends the buffered rows; rewrites the whole file (atomically) when there is none yet or a new column."""
        self._start()
        if not self._rows:
            return
        path = os.path.join(self.log_dir, "metrics.csv")
        columns = sorted(set(self._columns).union(*self._rows))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns)
        if os.path.isfile(path) and columns == self._columns:
            writer.writerows(self._rows)
            with open(path, "a", newline="", encoding="utf-8") as file:
                file.write(text.getvalue())
        else:  # a first file, or new columns: as Lightning, the whole file again under the new header
            writer.writeheader()
            if os.path.isfile(path):
                with open(path, newline="", encoding="utf-8") as file:
                    writer.writerows(csv.DictReader(file))
            writer.writerows(self._rows)
            write_atomically(path, text.getvalue().encode())
        self._columns, self._rows = columns, []

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._started:
            self.save()

    def _next_version(self) -> int:
        root = os.path.join(self.save_dir, self.name)
        if not os.path.isdir(root):
            return 0
        # As Lightning: the text between the first and second "_", so "version_3_old" counts as 3.
        versions = [
            int(entry.name.split("_")[1])
            for entry in os.scandir(root)
            if entry.is_dir() and entry.name.startswith("version_") and entry.name.split("_")[1].isdecimal()
        ]
        return max(versions, default=-1) + 1

    def _start(self) -> None:
        """Creates the log dir on first use; a non-empty one warns and loses its metrics.csv, as in Lightning."""
        if self._started:
            return
        log_dir = self.log_dir
        if os.path.isdir(log_dir) and os.listdir(log_dir):
            warnings.warn(
                f"Experiment logs directory {log_dir} exists and is not empty."
                " Previous log files in this directory will be deleted when the new ones are saved!",
                stacklevel=3,
            )
            if os.path.isfile(metrics := os.path.join(log_dir, "metrics.csv")):
                os.remove(metrics)
        make_folders(log_dir)
        self._started = True
