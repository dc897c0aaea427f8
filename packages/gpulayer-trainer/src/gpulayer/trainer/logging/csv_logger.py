"""Lightning's ``CSVLogger`` files: ``<save_dir>/<name>/version_<N>/metrics.csv`` and ``hparams.yaml``, byte for byte.

As Lightning's (whose ``log_hyperparams``, ``log_metrics``, ``save`` and ``finalize`` are ``rank_zero_only``), it is
called on every rank and writes nothing off global rank 0. Its ``experiment`` is Lightning's ``ExperimentWriter``,
which holds the rows and writes the files (on other ranks, an object that takes every call and does nothing)."""

from __future__ import annotations

import csv
import io
import os
import warnings
from typing import Any

import torch

from gpulayer.trainer.logging.logger import Logger, _Anything
from gpulayer.trainer.logging.rank_zero import rank_zero_only
from gpulayer.trainer.logging.yaml_dump import hparams_document
from gpulayer.trainer.private_files import make_folders, write_atomically

# Lightning's log_metrics also saves by itself every 100 steps (its default ``flush_logs_every_n_steps``).
_FLUSH_EVERY_N_STEPS = 100


class ExperimentWriter:
    """Lightning's ``ExperimentWriter`` (``CSVLogger.experiment``): metric rows buffered until ``save``, and
    ``hparams.yaml`` rewritten with every hyperparameter so far at each ``log_hparams``. Made on first use: a log
    folder that is not empty warns and loses its ``metrics.csv``, as in Lightning."""

    NAME_HPARAMS_FILE = "hparams.yaml"
    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        self.metrics: list[dict[str, Any]] = []  # the rows not yet saved
        self.metrics_keys: list[str] = []  # the file's columns, sorted
        self.hparams: dict[str, Any] = {}
        if os.path.isdir(log_dir) and os.listdir(log_dir):
            warnings.warn(
                f"Experiment logs directory {log_dir} exists and is not empty."
                " Previous log files in this directory will be deleted when the new ones are saved!",
                stacklevel=4,
            )
            if os.path.isfile(self.metrics_file_path):
                os.remove(self.metrics_file_path)
        make_folders(log_dir)

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Adds ``params`` to the hparams logged so far and rewrites ``hparams.yaml`` with all of them."""
        self.hparams.update(params)
        write_atomically(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), hparams_document(self.hparams).encode())

    def log_metrics(self, metrics_dict: dict[str, Any], step: int | None = None) -> None:
        """Buffers a row (a tensor as its Python number); ``step`` None: the number of rows buffered."""
        if step is None:
            step = len(self.metrics)
        row = {key: value.item() if isinstance(value, torch.Tensor) else value for key, value in metrics_dict.items()}
        self.metrics.append({**row, "step": step})

    def save(self) -> None:
        """Appends the buffered rows; rewrites the whole file (atomically) when there is none yet or a new column."""
        if not self.metrics:
            return
        path = self.metrics_file_path
        columns = sorted(set(self.metrics_keys).union(*self.metrics))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns)
        if os.path.isfile(path) and columns == self.metrics_keys:
            writer.writerows(self.metrics)
            with open(path, "a", newline="", encoding="utf-8") as file:
                file.write(text.getvalue())
        else:  # a first file, or new columns: as Lightning, the whole file again under the new header
            writer.writeheader()
            if os.path.isfile(path):
                with open(path, newline="", encoding="utf-8") as file:
                    writer.writerows(csv.DictReader(file))
            writer.writerows(self.metrics)
            write_atomically(path, text.getvalue().encode())
        self.metrics_keys, self.metrics = columns, []

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"CSVLogger's experiment has no {name!r}: it is Lightning's ExperimentWriter (log_metrics, log_hparams, "
            f"save, metrics_file_path, log_dir), GPUlayer's default logger. {name} is TensorBoard's if it comes from "
            "SummaryWriter (add_image, add_histogram, add_figure, ...): pass Lightning's TensorBoardLogger(...) as "
            "Trainer(logger=...), which GPUlayer takes as it is (Lightning's default logger is a TensorBoardLogger "
            "where tensorboard is installed)"
        )


class CSVLogger(Logger):
    """Lightning's CSVLogger: rows written at the log points and epoch ends, hparams to YAML as PyYAML dumps them."""

    def __init__(self, save_dir: str, name: str | None = "lightning_logs", version: int | str | None = None) -> None:
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = version
        self._experiment: ExperimentWriter | None = None

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

    @property
    def experiment(self) -> ExperimentWriter | _Anything:
        """Lightning's ``ExperimentWriter``, made on first use, on global rank 0; elsewhere (as Lightning's
        ``rank_zero_experiment``) an object that takes every call and does nothing."""
        if rank_zero_only.rank > 0:
            return _Anything()
        if self._experiment is None:
            self._experiment = ExperimentWriter(self.log_dir)
        return self._experiment

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Adds ``params`` to the hparams logged so far and rewrites ``hparams.yaml`` with all of them."""
        self.experiment.log_hparams(params)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if step is None:  # Lightning's quirk: the number of rows buffered since the last save
            step = len(self.experiment.metrics)
        self.experiment.log_metrics(metrics, step)
        if (step + 1) % _FLUSH_EVERY_N_STEPS == 0:
            self.save()

    @rank_zero_only
    def save(self) -> None:
        """Writes the buffered rows (and, the first time, makes the log folder)."""
        self.experiment.save()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._experiment is not None:
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
