"""``gpulayer port``: Lightning 2.6 projects rewritten to GPUlayer's names, from one registry (ADR 0023)."""

from importlib.metadata import version

__version__ = version("gpulayer-port")
