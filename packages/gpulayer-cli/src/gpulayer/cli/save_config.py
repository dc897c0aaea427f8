"""``SaveConfigCallback``: the run's resolved configuration saved beside its logs, never over an earlier run's."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpulayer.trainer import Callback
from gpulayer.trainer.core.hooks import is_overridden

if TYPE_CHECKING:
    from jsonargparse import Namespace

    from gpulayer.cli.parser import LightningArgumentParser
    from gpulayer.trainer import Module, Trainer


class SaveConfigCallback(Callback):
    """At the first ``setup``, write ``config`` to ``trainer.log_dir/config_filename`` on rank 0 (refusing to
    overwrite one unless ``overwrite``), then call ``save_config`` on rank 0, as Lightning 2.6's callback does."""

    def __init__(
        self,
        parser: LightningArgumentParser,
        config: Namespace,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = True,
    ) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and not is_overridden("save_config", self, SaveConfigCallback):
            raise ValueError(
                "save_to_log_dir=False only makes sense in a subclass of SaveConfigCallback that implements "
                "save_config, to save the config somewhere other than the log_dir"
            )

    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        if self.already_saved:
            return
        if self.save_to_log_dir:
            log_dir = trainer.log_dir
            path = os.path.join(log_dir, self.config_filename)
            exists = trainer.strategy.broadcast(trainer.is_global_zero and os.path.isfile(path))
            if exists and not self.overwrite:
                raise RuntimeError(
                    f"{type(self).__name__} expected {path} to NOT exist. Aborting to avoid overwriting results of a "
                    "previous run. You can delete the previous config file, set "
                    "`LightningCLI(save_config_callback=None)` to disable config saving, or set "
                    '`LightningCLI(save_config_kwargs={"overwrite": True})` to overwrite the config file.'
                )
            if trainer.is_global_zero:
                os.makedirs(log_dir, exist_ok=True)
                self.parser.save(
                    self.config, path, skip_unset=False, overwrite=self.overwrite, multifile=self.multifile
                )
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def save_config(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        """Override to save the config somewhere else too; called on rank 0 alone (no collectives here)."""
