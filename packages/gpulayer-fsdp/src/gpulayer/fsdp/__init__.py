"""GPUlayer's experimental FSDP2 strategy: ``Trainer(strategy="fsdp")`` or ``strategy=FSDPStrategy(...)``."""

from importlib.metadata import version

from gpulayer.fsdp.strategy import FSDPStrategy

__version__ = version("gpulayer-fsdp")

__all__ = ["FSDPStrategy", "__version__"]
