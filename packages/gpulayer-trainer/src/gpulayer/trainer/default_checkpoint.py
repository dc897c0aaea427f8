"""``enable_checkpointing=True`` with no checkpoint callback: Lightning's ``ModelCheckpoint()`` defaults.

``epoch=E-step=S.ckpt`` in the first logger's ``<save_dir>/<name>/version_N/checkpoints``, written after each
training epoch (or after its validation when validation runs mid-epoch), keeping only the newest file. It lives in the trainer so that
default checkpointing works without ``gpulayer-callbacks``; with it installed, the default is its ``ModelCheckpoint()``
(``defaults.py``).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.checkpoint.checkpoint import save_behind_training
from gpulayer.trainer.core.callback import Checkpoint
from gpulayer.trainer.logging.logger import after_save_checkpoint, checkpoint_dir

if TYPE_CHECKING:
    from gpulayer.trainer.core.module import Module
    from gpulayer.trainer.trainer import Trainer


class DefaultCheckpoint(Checkpoint):
    def __init__(self) -> None:
        self.dirpath: str | None = None
        self.best_model_path = ""
        self.last_model_path = ""
        self._last_global_step_saved = 0
        # ModelCheckpoint()'s settings and scores, which Lightning's loggers read after each save (MLFlowLogger's and
        # WandbLogger's log_model, their checkpoint metadata).
        self.monitor: str | None = None
        self.mode = "min"
        self.save_last: bool | None = None
        self.save_top_k = 1
        self.save_weights_only = False
        self._every_n_train_steps = 0
        self.best_model_score: torch.Tensor | None = None
        self.current_score: torch.Tensor | None = None
        self.best_k_models: dict[str, torch.Tensor] = {}

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's key for its default arguments, so either one restores the other's state.
        return "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}"

    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = trainer.runtime.broadcast(checkpoint_dir(trainer))
        if trainer.is_global_zero and stage == "fit" and os.path.isdir(self.dirpath) and os.listdir(self.dirpath):
            warnings.warn(f"Checkpoint directory {self.dirpath} exists and is not empty.", UserWarning, stacklevel=2)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if self._saves_on_train_epoch_end(trainer):
            self._save(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: Module) -> None:
        if not self._saves_on_train_epoch_end(trainer):
            self._save(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": None,
            "best_model_score": None,
            "best_model_path": self.best_model_path,
            "current_score": None,
            "dirpath": self.dirpath,
            "best_k_models": {},  # ModelCheckpoint keeps no top-k bookkeeping without a monitor
            "kth_best_model_path": "",
            "kth_value": torch.tensor(float("inf")),
            "last_model_path": self.last_model_path,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") == self.dirpath:
            self.best_model_path = state_dict.get("best_model_path", "")
            self.last_model_path = state_dict.get("last_model_path", "")

    def _saves_on_train_epoch_end(self, trainer: Trainer) -> bool:
        """Lightning's rule: at train epoch end unless validation runs on its own schedule within epochs."""
        if trainer.check_val_every_n_epoch != 1:
            return False
        if sum(trainer.num_val_batches) == 0:
            return True
        return trainer.val_check_interval == 1.0

    def _save(self, trainer: Trainer) -> None:
        if (
            trainer.fast_dev_run
            or trainer.state.fn != "fit"
            or trainer.sanity_checking
            or self._last_global_step_saved == trainer.global_step
        ):
            return
        trainer.strategy.finish_checkpoint_writes()  # the previous save's file and what followed it are in place
        previous = self.best_model_path
        path = self._free_name(trainer, f"epoch={trainer.current_epoch}-step={trainer.global_step}", previous)
        # The file's own callback state must name the file itself: a later ckpt_path="best" restores it.
        self.best_model_path = path
        try:
            save_behind_training(trainer, path)
        except BaseException:
            self.best_model_path = previous
            raise
        self._last_global_step_saved = trainer.global_step
        after_save_checkpoint(trainer, self)
        if trainer.is_global_zero and previous and self._may_remove(trainer, previous, path):
            trainer.strategy.remove_checkpoint(previous)  # a file, or a sharded checkpoint's folder

    def _free_name(self, trainer: Trainer, stem: str, replaced: str) -> str:
        """Lightning's version counter: ``-v1``, ``-v2`` while the name is taken by a file this run keeps. Rank 0's
        view of the folder decides, so every rank names the file rank 0 writes."""
        path = os.path.join(self.dirpath, f"{stem}.ckpt")
        version = 1
        while (
            trainer.runtime.any(trainer.is_global_zero and trainer.strategy.checkpoint_exists(path))
            and path != replaced
        ):
            path = os.path.join(self.dirpath, f"{stem}-v{version}.ckpt")
            version += 1
        return path

    def _may_remove(self, trainer: Trainer, previous: str, current: str) -> bool:
        """Never the file just written, the one this run resumed from, or one outside ``dirpath`` (Lightning's rule)."""
        if previous == current or not os.path.exists(previous):
            return False
        previous = os.path.abspath(previous)
        if trainer.ckpt_path is not None and previous == os.path.abspath(trainer.ckpt_path):
            return False
        return os.path.commonpath([previous, os.path.abspath(self.dirpath)]) == os.path.abspath(self.dirpath)
