"""Lightning's callbacks for GPUlayer's Trainer: ``EarlyStopping``, ``ModelCheckpoint``, ``LearningRateMonitor``."""

from importlib.metadata import version

from gpulayer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from gpulayer.callbacks.lr_monitor import LearningRateMonitor
from gpulayer.callbacks.model_checkpoint import ModelCheckpoint

__version__ = version("gpulayer-callbacks")

__all__ = ["EarlyStopping", "EarlyStoppingReason", "LearningRateMonitor", "ModelCheckpoint", "__version__"]
