"""``LightningCLI`` for GPUlayer: Lightning 2.6's command line of config files, dotted flags and subcommands, built on
jsonargparse (ADR 0028)."""

from gpulayer.cli.lightning_cli import LightningCLI
from gpulayer.cli.optimizers import ReduceLROnPlateau, instantiate_class
from gpulayer.cli.parser import LightningArgumentParser
from gpulayer.cli.save_config import SaveConfigCallback

__all__ = ["LightningArgumentParser", "LightningCLI", "ReduceLROnPlateau", "SaveConfigCallback", "instantiate_class"]
