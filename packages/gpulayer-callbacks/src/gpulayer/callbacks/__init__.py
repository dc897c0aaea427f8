"""Lightning's callbacks for GPUlayer's Trainer: each of Lightning 2.6's, but its two tuner callbacks
(``BatchSizeFinder``, ``LearningRateFinder``) and its display ones, which the Trainer takes as they are."""

from importlib.metadata import version

from gpulayer.callbacks.device_stats_monitor import DeviceStatsMonitor
from gpulayer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from gpulayer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from gpulayer.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from gpulayer.callbacks.lambda_function import LambdaCallback
from gpulayer.callbacks.lr_monitor import LearningRateMonitor
from gpulayer.callbacks.model_checkpoint import ModelCheckpoint
from gpulayer.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from gpulayer.callbacks.prediction_writer import BasePredictionWriter
from gpulayer.callbacks.pruning import ModelPruning
from gpulayer.callbacks.spike_detection import SpikeDetection, TrainingSpikeException
from gpulayer.callbacks.stochastic_weight_averaging import StochasticWeightAveraging
from gpulayer.callbacks.throughput_monitor import ThroughputMonitor
from gpulayer.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

# The Trainer's own Timer (its max_time), exported here as Lightning exports it from its callbacks.
from gpulayer.trainer.loops.timer import Timer

__version__ = version("gpulayer-callbacks")

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "EarlyStoppingReason",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelPruning",
    "OnExceptionCheckpoint",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "ThroughputMonitor",
    "Timer",
    "TrainingSpikeException",
    "WeightAveraging",
    "__version__",
]
