"""GPUlayer's Lightning-compatible Trainer: ``Trainer``, ``Module``, ``DataModule``, ``Callback``, ``Logger``."""

from importlib.metadata import version

from gpulayer.trainer.callback import Callback, Checkpoint
from gpulayer.trainer.csv_logger import CSVLogger
from gpulayer.trainer.datamodule import DataModule
from gpulayer.trainer.ddp import DDPStrategy
from gpulayer.trainer.exceptions import MisconfigurationException, PossibleUserWarning
from gpulayer.trainer.logger import Logger
from gpulayer.trainer.module import Module
from gpulayer.trainer.rank_zero import rank_zero_only
from gpulayer.trainer.seed import seed_everything
from gpulayer.trainer.strategy import SingleDeviceStrategy, Strategy
from gpulayer.trainer.sync_decisions import NonFiniteLossError
from gpulayer.trainer.trainer import Trainer

__version__ = version("gpulayer-trainer")

__all__ = [
    "CSVLogger",
    "Callback",
    "Checkpoint",
    "DDPStrategy",
    "DataModule",
    "Logger",
    "MisconfigurationException",
    "Module",
    "NonFiniteLossError",
    "PossibleUserWarning",
    "SingleDeviceStrategy",
    "Strategy",
    "Trainer",
    "__version__",
    "rank_zero_only",
    "seed_everything",
]
