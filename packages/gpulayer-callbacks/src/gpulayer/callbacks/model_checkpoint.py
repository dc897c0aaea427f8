"""``ModelCheckpoint``: Lightning 2.6's checkpoint callback on GPUlayer's Trainer.

Lightning's is in ``lightning/pytorch/callbacks/model_checkpoint.py``.

Every rank makes the same decisions (file checks and top-k comparisons go through ``trainer.runtime``); only
global rank 0 writes (``trainer.save_checkpoint``), links and deletes files. Deliberate differences from
Lightning, where it has a plain bug: a step- or time-triggered save deferred until validation logs the monitored
metric is made at the next validation end (Lightning drops it when it saves at train epoch end), and a replaced
``last`` link is removed even when it dangles (Lightning keeps it). Lightning's other quirks are kept.
"""

from __future__ import annotations

import logging
import numbers
import os
import re
import shutil
import time
import warnings
from copy import deepcopy
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from gpulayer.trainer import Checkpoint
from gpulayer.trainer.callback import follows_cadence
from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError
from gpulayer.trainer.yaml_dump import yaml_document

log = logging.getLogger(__name__)


class ModelCheckpoint(Checkpoint):
    """Save the model every epoch, every ``n`` steps or every interval of time, keeping the ``save_top_k`` best
    by ``monitor`` (or the newest, without one), as Lightning's ``ModelCheckpoint`` with the same arguments."""

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

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
        """``dirpath``, else ``<log_dir>/checkpoints``: the logger's ``version_N`` folder or ``default_root_dir``."""
        dirpath = self.dirpath if self.dirpath is not None else os.path.join(trainer.log_dir, "checkpoints")
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
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
            self._defer_save_until_validation = False
        elif not self._should_save_on_train_epoch_end(trainer):
            self._save_epoch_checkpoint(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """``save_last``: a run that saved nothing still ends with a last checkpoint."""
        if self.save_last and not self._last_checkpoint_saved:
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
        every = trainer.check_val_every_n_epoch
        return (
            trainer.enable_validation
            and sum(trainer.num_val_batches) > 0
            and (every is None or (trainer.current_epoch + 1) % every == 0)
        )

    def _save_epoch_checkpoint(self, trainer: Any) -> None:
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

    def _save_topk_checkpoint(self, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            self._save_none_monitor_checkpoint(trainer, candidates)
            return
        if self.monitor not in candidates:
            message = (
                f"`ModelCheckpoint(monitor={self.monitor!r})` could not find the monitored key in the returned "
                f"metrics: {list(candidates)}. HINT: Did you call `log({self.monitor!r}, value)` in the module?"
            )
            if self._validation_has_run:
                raise MisconfiguredValueError(message)
            if not self._warned_missing_monitor:
                warnings.warn(message, UserWarning, stacklevel=2)
                self._warned_missing_monitor = True
        self._save_monitor_checkpoint(trainer, candidates)

    def _save_monitor_checkpoint(self, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        current = candidates.get(self.monitor)
        if self.check_monitor_top_k(trainer, current):
            self._update_best_and_save(current, trainer, candidates)
        elif self.verbose and trainer.is_global_zero:
            epoch, step = candidates["epoch"], candidates["step"]
            log.info(f"Epoch {epoch:d}, global step {step:d}: {self.monitor!r} was not in top {self.save_top_k}")

    def check_monitor_top_k(self, trainer: Any, current: torch.Tensor | None) -> bool:
        if current is None:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        better = {"min": torch.lt, "max": torch.gt}[self.mode](current, self.best_k_models[self.kth_best_model_path])
        return trainer.runtime.all(bool(better))  # unanimous, as Lightning's reduce_boolean_decision

    def _save_none_monitor_checkpoint(self, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        # Kept from Lightning's method of this name: a same-named file from this run is the one being replaced, so
        # it is overwritten rather than given a -vN name, even with save_top_k=-1.
        filepath = self._get_metric_interpolated_filepath_name(candidates, trainer, self.best_model_path)
        previous, self.best_model_path = self.best_model_path, filepath  # set before saving: part of the state
        self._save_checkpoint(trainer, filepath)
        if self.save_top_k == 1 and previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._remove_checkpoint(trainer, previous)

    def _update_best_and_save(self, current: torch.Tensor, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        del_filepath = None
        if len(self.best_k_models) == k and k > 0:
            del_filepath = self.kth_best_model_path
            self.best_k_models.pop(del_filepath)
        if torch.isnan(current):  # NaN ranks last
            current = torch.tensor(float("inf" if self.mode == "min" else "-inf"), device=current.device)
        filepath = self._get_metric_interpolated_filepath_name(candidates, trainer, del_filepath)
        self.current_score = current
        self.best_k_models[filepath] = current
        worst, best = (max, min) if self.mode == "min" else (min, max)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.get)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.get)
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.verbose and trainer.is_global_zero:
            epoch, step = candidates["epoch"], candidates["step"]
            log.info(
                f"Epoch {epoch:d}, global step {step:d}: {self.monitor!r} reached {current:0.5f}"
                f" (best {self.best_model_score:0.5f}), saving model to {filepath!r} as top {k}"
            )
        self._save_checkpoint(trainer, filepath)
        if del_filepath and self._should_remove_checkpoint(trainer, del_filepath, filepath):
            self._remove_checkpoint(trainer, del_filepath)

    def _save_last_checkpoint(self, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        if not self.save_last:
            return
        filepath = self._get_metric_interpolated_filepath_name(
            candidates, trainer, self.last_model_path, self.CHECKPOINT_NAME_LAST
        )
        previous, self.last_model_path = self.last_model_path, filepath  # set before saving: part of the state
        if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
            self._link_checkpoint(trainer, self._last_checkpoint_saved, filepath)
        else:
            self._save_checkpoint(trainer, filepath)
        if previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._remove_checkpoint(trainer, previous)

    # ---- names ---------------------------------------------------------------------------------------------------
    def format_checkpoint_name(
        self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None, prefix: str | None = None
    ) -> str:
        """``filename`` (or the template) filled from ``metrics``, then ``-v{ver}`` and ``.ckpt``, in ``dirpath``:
        ``"{epoch}-{val_loss:.2f}"`` gives ``epoch=2-val_loss=0.12.ckpt``."""
        filename = self._format_checkpoint_name(
            filename or self.filename, metrics, prefix=prefix, auto_insert_metric_name=self.auto_insert_metric_name
        )
        if ver is not None:
            filename = self.CHECKPOINT_JOIN_CHAR.join((filename, f"v{ver}"))
        name = f"{filename}{self.FILE_EXTENSION}"
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def _format_checkpoint_name(
        self,
        filename: str | None,
        metrics: dict[str, Any],
        prefix: str | None = None,
        auto_insert_metric_name: bool = True,
    ) -> str:
        filename = filename or "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        # Longest keys first, so that "{epoch}" does not rewrite part of "{epoch_test}".
        for group in sorted(re.findall(r"(\{.*?)[:\}]", filename), key=len, reverse=True):
            name = group[1:]
            if auto_insert_metric_name:
                filename = filename.replace(group, name + self.CHECKPOINT_EQUALS_CHAR + "{" + name)
            # Index into one mapping argument, so that names with dots or slashes work.
            filename = filename.replace(group, f"{{0[{name}]")
            if name not in metrics:
                metrics[name] = torch.tensor(0)
        filename = filename.format(metrics)
        return self.CHECKPOINT_JOIN_CHAR.join([prefix, filename]) if prefix is not None else filename

    def _get_metric_interpolated_filepath_name(
        self, candidates: dict[str, Any], trainer: Any, del_filepath: str | None = None, filename: str | None = None
    ) -> str:
        """The formatted name, with ``-v1``, ``-v2``... while it names an existing file other than ``del_filepath``
        (the file being replaced)."""
        filepath = self.format_checkpoint_name(candidates, filename)
        version = self.STARTING_VERSION
        while self._enable_version_counter and self.file_exists(filepath, trainer) and filepath != del_filepath:
            filepath = self.format_checkpoint_name(candidates, filename, ver=version)
            version += 1
        return filepath

    # ---- files ---------------------------------------------------------------------------------------------------
    def file_exists(self, filepath: str, trainer: Any) -> bool:
        """Rank 0 looks; every rank gets its answer, so that all choose the same name."""
        return trainer.runtime.any(os.path.exists(filepath) if trainer.is_global_zero else False)

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        trainer.save_checkpoint(filepath, self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath

    @staticmethod
    def _link_checkpoint(trainer: Any, filepath: str, linkpath: str) -> None:
        """``save_last="link"``: a relative symlink (a copy where links are not allowed)."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            if os.path.islink(linkpath) or os.path.isfile(linkpath):
                os.remove(linkpath)
            elif os.path.isdir(linkpath):
                shutil.rmtree(linkpath)
            try:
                os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), linkpath)
            except OSError:
                shutil.copy(filepath, linkpath)
        trainer.runtime.barrier()

    def _should_remove_checkpoint(self, trainer: Any, previous: str, current: str) -> bool:
        """Not the file just written, not the one this run resumed from, and inside ``dirpath``."""
        if previous == current:
            return False
        previous_path = Path(previous).absolute()
        if trainer.ckpt_path is not None and previous_path == Path(trainer.ckpt_path).absolute():
            return False
        return Path(self.dirpath).absolute() in previous_path.parents

    def _remove_checkpoint(self, trainer: Any, filepath: str) -> None:
        # lexists: a dangling "last" link is removed too (Lightning's exists() follows it and keeps the link).
        if not trainer.is_global_zero or not os.path.lexists(filepath):
            return
        if os.path.isdir(filepath) and not os.path.islink(filepath):
            shutil.rmtree(filepath)
        else:
            os.remove(filepath)
