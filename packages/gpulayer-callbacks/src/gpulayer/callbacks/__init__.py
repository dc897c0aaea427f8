"""Lightning's callbacks for GPUlayer's Trainer: ``EarlyStopping``, ``ModelCheckpoint``, ``LearningRateMonitor``,
``Timer``, ``LambdaCallback``, ``GradientAccumulationScheduler``, ``BasePredictionWriter`` and
``OnExceptionCheckpoint``."""

from importlib.metadata import version

from gpulayer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from gpulayer.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from gpulayer.callbacks.lambda_function import LambdaCallback
from gpulayer.callbacks.lr_monitor import LearningRateMonitor
from gpulayer.callbacks.model_checkpoint import ModelCheckpoint
from gpulayer.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from gpulayer.callbacks.prediction_writer import BasePredictionWriter

# The Trainer's own Timer (its max_time), exported here as Lightning exports it from its callbacks.
from gpulayer.trainer.loops.timer import Timer

__version__ = version("gpulayer-callbacks")

__all__ = [
    "BasePredictionWriter",
    "EarlyStopping",
    "EarlyStoppingReason",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "OnExceptionCheckpoint",
    "Timer",
    "__version__",
]
