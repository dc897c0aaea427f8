"""Which files a ``ModelCheckpoint`` keeps: their names, the top k by the monitored value, and ``last``.

Split from ``model_checkpoint.py``, which decides when to save; this module decides what the save writes, links
and removes. Every rank makes the same choices (file checks and top-k comparisons go through ``trainer.runtime``);
only global rank 0 writes, links and deletes files. Lightning 2.6's is one class,
``lightning/pytorch/callbacks/model_checkpoint.py``.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.checkpoint import save_behind_training
from gpulayer.trainer.exceptions import MisconfiguredValueError
from gpulayer.trainer.logging.logger import after_save_checkpoint

log = logging.getLogger("gpulayer.callbacks.model_checkpoint")


class TopKFiles:
    """The file keeping of ``ModelCheckpoint``: it sets the attributes read here (``dirpath``, ``filename``,
    ``monitor``, ``mode``, ``save_top_k``, ``save_last``, ``best_k_models``, ...) and the name constants."""

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    # ---- the top k and last ------------------------------------------------------------------------------------
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
        """Rank 0 looks (a checkpoint still being written there counts); every rank gets its answer, so that all
        choose the same name."""
        return trainer.runtime.any(trainer.strategy.checkpoint_exists(filepath) if trainer.is_global_zero else False)

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        save_behind_training(trainer, filepath, self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        after_save_checkpoint(trainer, self)

    @staticmethod
    def _link_checkpoint(trainer: Any, filepath: str, linkpath: str) -> None:
        """``save_last="link"``: a relative symlink (a copy where links are not allowed), made once ``filepath`` is
        written (an asynchronous save may still be writing it)."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            trainer.strategy.when_checkpoints_written(functools.partial(_link, filepath, linkpath))
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
        # The strategy removes a dangling "last" link too (Lightning's exists() follows it and keeps the link).
        trainer.strategy.remove_checkpoint(filepath)


def _link(filepath: str, linkpath: str) -> None:
    checkpoint_io.remove(linkpath)
    try:
        os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), linkpath)
    except OSError:
        shutil.copy(filepath, linkpath)
