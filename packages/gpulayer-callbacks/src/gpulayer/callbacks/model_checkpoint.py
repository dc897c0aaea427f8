"""``ModelCheckpoint``: Lightning 2.6's checkpoint callback on GPUlayer's Trainer.

Lightning's is in ``lightning/pytorch/callbacks/model_checkpoint.py``.

This module decides when to save (its triggers, each at the batches the trainer's cadence plans for it);
``top_k_files.py`` decides what a save writes, links and removes. Every rank makes the same decisions; only global
rank 0 writes (``trainer.save_checkpoint``), links and deletes files. Deliberate differences from
Lightning, where it has a plain bug: a step- or time-triggered save deferred until validation logs the monitored
metric is made at the next validation end (Lightning drops it when it saves at train epoch end), and a replaced
``last`` link is removed even when it dangles (Lightning keeps it). Lightning's other quirks are kept.
"""

from __future__ import annotations

import logging
import numbers
import os
import time
import warnings
from copy import deepcopy
from datetime import timedelta
from typing import Any

import torch

from gpulayer.callbacks.top_k_files import TopKFiles
from gpulayer.trainer import Checkpoint
from gpulayer.trainer.core.callback import follows_cadence
from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError
from gpulayer.trainer.logging.logger import checkpoint_dir
from gpulayer.trainer.logging.yaml_dump import yaml_document

log = logging.getLogger(__name__)


class ModelCheckpoint(TopKFiles, Checkpoint):
    """Save the model every epoch, every ``n`` steps or every interval of time, keeping the ``save_top_k`` best
    by ``monitor`` (or the newest, without one), as Lightning's ``ModelCheckpoint`` with the same arguments."""

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | str | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise MisconfiguredValueError(f"mode={mode!r}: accepted values are 'min' and 'max'")
        if save_last not in (None, True, False, "link"):
            raise ValueError(f"save_last={save_last!r}: accepted values are None, True, False and 'link'")
        if train_time_interval is not None and not isinstance(train_time_interval, timedelta):
            raise TypeError(f"train_time_interval={train_time_interval!r}: accepted values are None or a timedelta")
        if dirpath is not None and not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(f"dirpath={dirpath!r}: accepted values are None or a path (a str or os.PathLike)")
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = save_on_exception
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self._save_on_train_epoch_end = save_on_train_epoch_end
        self._enable_version_counter = enable_version_counter
        self.dirpath = os.path.realpath(os.path.expanduser(dirpath)) if dirpath else None
        self.filename = filename
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            every_n_epochs, every_n_train_steps = 1, 0
        self._every_n_epochs: int = every_n_epochs or 0
        self._every_n_train_steps: int = every_n_train_steps or 0
        self._train_time_interval = train_time_interval
        self._validate_triggers()
        self.current_score: torch.Tensor | None = None
        self.best_k_models: dict[str, torch.Tensor] = {}
        self.kth_best_model_path = ""
        self.kth_value = torch.tensor(torch.inf if mode == "min" else -torch.inf)
        self.best_model_score: torch.Tensor | None = None
        self.best_model_path = ""
        self.last_model_path = ""
        self._last_global_step_saved = 0  # nothing to save before the first step
        self._last_checkpoint_saved = ""
        self._last_time_checked: float | None = None
        # A step/time save waiting for validation to log the monitored metric.
        self._defer_save_until_validation = False
        # Lightning's ``val_loop._has_run``: the latest validation of this fit was not a sanity check.
        self._validation_has_run = False
        self._warned_missing_monitor = False

    def _validate_triggers(self) -> None:
        for name, value, minimum in (
            ("save_top_k", self.save_top_k, -1),
            ("every_n_train_steps", self._every_n_train_steps, 0),
            ("every_n_epochs", self._every_n_epochs, 0),
        ):
            if not isinstance(value, numbers.Real):
                raise MisconfiguredTypeError(f"{name}={value!r}: accepted values are ints >= {minimum}")
            if value < minimum:
                raise MisconfiguredValueError(f"{name}={value!r}: accepted values are ints >= {minimum}")
        triggers = (self._every_n_train_steps >= 1, self._every_n_epochs >= 1, self._train_time_interval is not None)
        if sum(triggers) > 1:
            raise MisconfiguredValueError(
                f"every_n_train_steps={self._every_n_train_steps}, every_n_epochs={self._every_n_epochs} and "
                f"train_time_interval={self._train_time_interval}: set at most one of them"
            )
        if self.monitor is None and self.save_top_k not in (-1, 0, 1):
            raise MisconfiguredValueError(
                f"save_top_k={self.save_top_k} with monitor=None: without a monitored quantity there is no top "
                "k to keep; use -1 (keep all), 0 (none) or 1 (the newest)"
            )

    @property
    def state_key(self) -> str:
        arguments = {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": self._every_n_train_steps,
            "every_n_epochs": self._every_n_epochs,
            "train_time_interval": self._train_time_interval,
        }
        return f"{type(self).__qualname__}{arguments!r}"

    @property
    def every_n_epochs(self) -> int:
        return self._every_n_epochs

    # ---- hooks ---------------------------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """``dirpath``, else the first logger's ``<save_dir>/<name>/version_N/checkpoints`` or
        ``<default_root_dir>/checkpoints``: rank 0's, on every rank."""
        dirpath = self.dirpath if self.dirpath is not None else checkpoint_dir(trainer)
        self.dirpath = trainer.runtime.broadcast(dirpath)
        warn = trainer.is_global_zero and stage == "fit" and self.save_top_k != 0 and os.path.isdir(self.dirpath)
        if warn and os.listdir(self.dirpath):
            warnings.warn(f"Checkpoint directory {self.dirpath} exists and is not empty.", UserWarning, stacklevel=2)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_time_checked = time.monotonic()
        if self._every_n_train_steps >= 1:
            trainer.cadence.every_n_steps(self._every_n_train_steps)
        if self._train_time_interval is not None:
            trainer.cadence.clock(lambda: self._last_time_checked + self._train_time_interval.total_seconds())

    @follows_cadence
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """``every_n_train_steps`` and ``train_time_interval`` saves (before the module's hook, as in Lightning), at
        the batches the trainer's cadence plans for them."""
        skip_batch = self._every_n_train_steps < 1 or not trainer.cadence.steps_due(self._every_n_train_steps)
        skip_time = True
        now = time.monotonic()
        if self._train_time_interval is not None:
            interval, last = self._train_time_interval.total_seconds(), self._last_time_checked
            skip_time = last is None or now - last < interval
            if trainer.world_size > 1:
                # Rank 0's clock decides, so all ranks save at one step; asked only at the loop's sync points (every
                # log_every_n_steps steps and epoch ends), never with a collective on every batch.
                skip_time = trainer.runtime.broadcast(skip_time) if trainer.cadence.at_sync_point else True
        if skip_batch and skip_time:
            return
        if not skip_time:
            self._last_time_checked = now
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and (self.monitor not in candidates or self._validation_follows(trainer)):
            # The metric is missing, or stale with a validation about to refresh it: save at validation end.
            self._defer_save_until_validation = True
            return
        if self._should_skip_saving_checkpoint(trainer):
            return
        trainer.strategy.finish_checkpoint_writes()  # before the bookkeeping: the previous saves are in place
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._should_skip_saving_checkpoint(trainer) and self._should_save_on_train_epoch_end(trainer):
            self._save_epoch_checkpoint(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.state.fn == "fit":
            self._validation_has_run = not trainer.sanity_checking
        if self._should_skip_saving_checkpoint(trainer):
            return
        if self._defer_save_until_validation:
            # Lightning makes this save only when it saves at validation end; we make it whenever it is deferred.
            candidates = self._monitor_candidates(trainer)
            trainer.strategy.finish_checkpoint_writes()
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
            self._defer_save_until_validation = False
        elif not self._should_save_on_train_epoch_end(trainer):
            self._save_epoch_checkpoint(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """``save_last``: a run that saved nothing still ends with a last checkpoint."""
        if self.save_last and not self._last_checkpoint_saved:
            trainer.strategy.finish_checkpoint_writes()
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        saved_already = self._last_global_step_saved == trainer.global_step
        if not self.save_on_exception or trainer.fast_dev_run or trainer.sanity_checking or saved_already:
            return
        candidates = self._monitor_candidates(trainer)
        filepath = self.format_checkpoint_name(candidates)
        self._save_checkpoint(trainer, filepath)
        self._save_last_checkpoint(trainer, candidates)
        if trainer.is_global_zero:
            log.info(
                f"An {type(exception).__name__} was raised with message: {exception}, saved checkpoint to {filepath}"
            )

    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "best_model_score": self.best_model_score,
            "best_model_path": self.best_model_path,
            "current_score": self.current_score,
            "dirpath": self.dirpath,
            "best_k_models": self.best_k_models,
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "last_model_path": self.last_model_path,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The top-k bookkeeping, if the checkpoint was written to this ``dirpath``; else ``best_model_path`` only."""
        dirpath_from_ckpt = state_dict.get("dirpath", self.dirpath)
        if self.dirpath == dirpath_from_ckpt:
            self.best_model_score = state_dict["best_model_score"]
            self.kth_best_model_path = state_dict.get("kth_best_model_path", self.kth_best_model_path)
            self.kth_value = state_dict.get("kth_value", self.kth_value)
            self.best_k_models = state_dict.get("best_k_models", self.best_k_models)
            self.last_model_path = state_dict.get("last_model_path", self.last_model_path)
        else:
            warnings.warn(
                f"The dirpath has changed from {dirpath_from_ckpt!r} to {self.dirpath!r}, therefore "
                "`best_model_score`, `kth_best_model_path`, `kth_value`, `last_model_path` and `best_k_models` "
                "won't be reloaded. Only `best_model_path` will be reloaded.",
                UserWarning,
                stacklevel=2,
            )
        self.best_model_path = state_dict["best_model_path"]

    def to_yaml(self, filepath: str | os.PathLike | None = None) -> None:
        """``best_k_models`` as ``{path: score}`` in YAML (``<dirpath>/best_k_models.yaml`` by default)."""
        filepath = filepath if filepath is not None else os.path.join(self.dirpath, "best_k_models.yaml")
        with open(filepath, "w") as file:
            file.write(yaml_document({path: score.item() for path, score in self.best_k_models.items()}))

    # ---- when to save --------------------------------------------------------------------------------------------
    def _should_skip_saving_checkpoint(self, trainer: Any) -> bool:
        return (
            bool(trainer.fast_dev_run)
            or trainer.state.fn != "fit"
            or trainer.sanity_checking
            or self._last_global_step_saved == trainer.global_step
        )

    def _should_save_on_train_epoch_end(self, trainer: Any) -> bool:
        """Lightning's rule: at train epoch end unless validation runs on its own schedule within epochs."""
        if self._save_on_train_epoch_end is not None:
            return self._save_on_train_epoch_end
        if isinstance(trainer.val_check_interval, timedelta) or trainer.check_val_every_n_epoch != 1:
            return False
        if sum(trainer.num_val_batches) == 0:
            return True
        return trainer.val_check_interval == 1.0

    def _validation_follows(self, trainer: Any) -> bool:
        """On the last batch of an epoch that validates, when saves happen at validation end."""
        if self._should_save_on_train_epoch_end(trainer) or not trainer.is_last_batch:
            return False
        return (
            trainer.enable_validation
            and sum(trainer.num_val_batches) > 0
            and trainer.cadence.validates_in_epoch(trainer.current_epoch)
        )

    def _save_epoch_checkpoint(self, trainer: Any) -> None:
        trainer.strategy.finish_checkpoint_writes()
        candidates = self._monitor_candidates(trainer)
        if self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0:
            self._save_topk_checkpoint(trainer, candidates)
        # Kept from Lightning's ``on_train_epoch_end``/``on_validation_end``: ``last`` is refreshed only when a
        # checkpoint was saved at this step (or re-linked with "link"), so with a monitor it can lag behind the
        # newest epoch.
        if self._last_global_step_saved == trainer.global_step or (
            self.save_last == "link" and self._last_checkpoint_saved
        ):
            self._save_last_checkpoint(trainer, candidates)

    # ---- what to save --------------------------------------------------------------------------------------------
    def _monitor_candidates(self, trainer: Any) -> dict[str, torch.Tensor]:
        """The callback metrics, with ``epoch`` and ``step`` (a logged "epoch"/"step" wins, cast to int)."""
        candidates = deepcopy(trainer.callback_metrics)
        epoch, step = candidates.get("epoch"), candidates.get("step")
        candidates["epoch"] = epoch.int() if isinstance(epoch, torch.Tensor) else torch.tensor(trainer.current_epoch)
        candidates["step"] = step.int() if isinstance(step, torch.Tensor) else torch.tensor(trainer.global_step)
        return candidates
