"""GPUlayer's Lightning-compatible Trainer: ``Trainer``, ``Module``, ``DataModule``, ``Callback``, ``Logger``, the
profilers, and ``trainer.state``'s enums."""

from importlib.metadata import version

from gpulayer.trainer.core.callback import Callback, Checkpoint
from gpulayer.trainer.core.datamodule import DataModule
from gpulayer.trainer.core.module import Module
from gpulayer.trainer.data.seed import seed_everything
from gpulayer.trainer.exceptions import MisconfigurationException, PossibleUserWarning
from gpulayer.trainer.logging.csv_logger import CSVLogger
from gpulayer.trainer.logging.logger import Logger
from gpulayer.trainer.logging.rank_zero import rank_zero_only
from gpulayer.trainer.loops.sync_decisions import NonFiniteLossError
from gpulayer.trainer.profilers.advanced import AdvancedProfiler
from gpulayer.trainer.profilers.profiler import PassThroughProfiler, Profiler
from gpulayer.trainer.profilers.pytorch import PyTorchProfiler
from gpulayer.trainer.profilers.simple import SimpleProfiler
from gpulayer.trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus
from gpulayer.trainer.strategies.ddp import DDPStrategy
from gpulayer.trainer.strategies.strategy import SingleDeviceStrategy, Strategy
from gpulayer.trainer.trainer import Trainer

__version__ = version("gpulayer-trainer")

__all__ = [
    "AdvancedProfiler",
    "CSVLogger",
    "Callback",
    "Checkpoint",
    "DDPStrategy",
    "DataModule",
    "Logger",
    "MisconfigurationException",
    "Module",
    "NonFiniteLossError",
    "PassThroughProfiler",
    "PossibleUserWarning",
    "Profiler",
    "PyTorchProfiler",
    "RunningStage",
    "SimpleProfiler",
    "SingleDeviceStrategy",
    "Strategy",
    "Trainer",
    "TrainerFn",
    "TrainerState",
    "TrainerStatus",
    "__version__",
    "rank_zero_only",
    "seed_everything",
]
