"""What the logger receives and when: Lightning's rows, pushed only where values are read anyway.

Lightning 2.6's are made by ``_LoggerConnector`` (``lightning/pytorch/trainer/connectors/logger_connector/``) and
written by its loggers. As Lightning, GPUlayer calls every logger on every rank, with that rank's values (reduced
across ranks where ``sync_dist`` asks); loggers that write files guard themselves, as ``CSVLogger`` does.

Training step rows at the ``log_every_n_steps`` points (the log line's), evaluation step rows for metrics
logged with ``on_step=True`` in evaluation, one row per evaluation run and one per training epoch, each followed
by ``save`` as in Lightning but the evaluation step rows (saved with the evaluation's end row); no logger is called
on other steps.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.exceptions import HyperparameterClashError
from gpulayer.trainer.logging.csv_logger import CSVLogger
from gpulayer.trainer.logging.logger import logger_folder
from gpulayer.trainer.logging.rank_zero import rank_zero_only

if TYPE_CHECKING:
    from gpulayer.trainer.trainer import Trainer

# The hyperparameter LightningCLI records a subclass's class path under (module and DataModule alike): Lightning 2.6
# leaves it out of the clash check and out of what loggers get (lightning/pytorch/loggers/utilities.py).
_CLI_CLASS_PATH = "_class_path"


class LoggerRows:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._settled_log_dir: tuple[Any, str | None] | None = None  # (the first logger, rank 0's folder for it)

    def log_dir(self) -> str | None:
        """Lightning's ``Trainer.log_dir``: the first logger's ``log_dir`` (a TensorBoardLogger or CSVLogger) or
        ``save_dir`` (any other), else ``default_root_dir``. Lightning broadcasts rank 0's at every read; GPUlayer
        takes rank 0's once, when a run sets up (``set_up``), so that a read on one rank alone never waits."""
        trainer = self.trainer
        if not trainer.loggers:
            return trainer.default_root_dir
        first, settled = trainer.loggers[0], self._settled_log_dir
        return settled[1] if settled is not None and settled[0] is first else logger_folder(first)

    def set_up(self) -> None:
        """Before the ``setup`` hooks: GPUlayer's and Lightning's ``rank_zero_only.rank`` set to this rank, as
        Lightning's strategies set it (loggers then write on rank 0 alone, whatever the environment said at import);
        every CSVLogger on rank 0's version; then, on every rank as Lightning's setup does,
        ``logger.experiment`` read (a CSVLogger saves, which makes its folder on rank 0)."""
        trainer = self.trainer
        rank_zero_only.rank = trainer.global_rank
        lightnings = sys.modules.get("lightning_utilities.core.rank_zero")  # never imported here
        if lightnings is not None:
            lightnings.rank_zero_only.rank = trainer.global_rank
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                logger.settle_version(trainer.runtime)
                logger.save()
            elif hasattr(logger, "experiment"):
                _ = logger.experiment
        if trainer.loggers:
            first = trainer.loggers[0]
            folder = logger_folder(first)
            self._settled_log_dir = (first, trainer.runtime.broadcast(folder) if trainer.world_size > 1 else folder)

    def push(self, metrics: dict[str, Any], step: int | None = None, save: bool = True, step_offset: int = 0) -> None:
        """Lightning's ``log_metrics``: no ``step`` given means ``epoch`` is added and the step is the count of
        batches that stepped (plus ``step_offset``). Each logger saves after the row, as in Lightning, except after
        evaluation step rows (``save=False``): those stay buffered until the evaluation's end, so that no file is
        written per step. Called on every rank, only where the rows are made anyway (never an extra read per step)."""
        trainer = self.trainer
        if not trainer.loggers or not metrics:
            return
        scalars = {name: value.item() if isinstance(value, torch.Tensor) else value for name, value in metrics.items()}
        if step is None:
            given = scalars.pop("step", None)
            if given is not None:
                step = int(given)
            else:
                scalars.setdefault("epoch", trainer.current_epoch)
                step = trainer.cadence.logger_step + step_offset
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
            if save:
                logger.save()

    def hyperparameters(self) -> None:
        """The module's (and DataModule's) ``save_hyperparameters`` values, then ``log_graph(module)`` and ``save``,
        at the start of every run (unless ``enable_autolog_hparams=False``)."""
        trainer = self.trainer
        if not trainer.loggers or not trainer.args.enable_autolog_hparams:
            return
        module, datamodule = trainer.lightning_module, trainer.datamodule
        logged: dict[str, Any] | None = None
        if getattr(module, "_log_hyperparams", False):
            logged = dict(module.hparams_initial)
        if datamodule is not None and getattr(datamodule, "_log_hyperparams", False):
            clashes = {
                k
                for k in datamodule.hparams_initial
                if k in (logged or {}) and k != _CLI_CLASS_PATH and logged[k] != datamodule.hparams_initial[k]
            }
            if clashes:
                raise HyperparameterClashError(
                    f"the module and the DataModule save different values for the hyperparameters {sorted(clashes)}; "
                    "rename one of them"
                )
            logged = {**(logged or {}), **datamodule.hparams_initial}
        if logged is not None:
            logged.pop(_CLI_CLASS_PATH, None)
        for logger in trainer.loggers:
            if logged is not None:
                logger.log_hyperparams(logged)
            logger.log_graph(module)
            logger.save()

    def finalize(self, status: str) -> None:
        """Lightning's ``finalize`` of every logger, on every rank: ``"success"`` after a run, ``"failed"`` after
        ``on_exception``."""
        for logger in self.trainer.loggers:
            logger.finalize(status)
