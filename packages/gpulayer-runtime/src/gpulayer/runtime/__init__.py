"""Where a training script runs and how its processes talk: placement, ``Runtime`` and ``launch()``."""

from importlib.metadata import version

from gpulayer.runtime.collectives import CollectiveError
from gpulayer.runtime.launch import WorkerFailedError, launch
from gpulayer.runtime.placement import Placement
from gpulayer.runtime.relaunch import relaunch
from gpulayer.runtime.runtime import Runtime

__version__ = version("gpulayer-runtime")

__all__ = ["CollectiveError", "Placement", "Runtime", "WorkerFailedError", "__version__", "launch", "relaunch"]
