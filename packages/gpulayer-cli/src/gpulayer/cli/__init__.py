"""``LightningCLI`` for GPUlayer: Lightning 2.6's command line of config files, dotted flags and subcommands, built on
jsonargparse (ADR 0028)."""

from importlib.metadata import version

from gpulayer.cli.instantiators import instantiate_module
from gpulayer.cli.lightning_cli import ArgsType, LightningCLI
from gpulayer.cli.optimizers import LRSchedulerCallable, OptimizerCallable, ReduceLROnPlateau, instantiate_class
from gpulayer.cli.parser import LightningArgumentParser
from gpulayer.cli.save_config import SaveConfigCallback

__version__ = version("gpulayer-cli")

__all__ = [
    "ArgsType",
    "LRSchedulerCallable",
    "LightningArgumentParser",
    "LightningCLI",
    "OptimizerCallable",
    "ReduceLROnPlateau",
    "SaveConfigCallback",
    "__version__",
    "instantiate_class",
    "instantiate_module",
]
