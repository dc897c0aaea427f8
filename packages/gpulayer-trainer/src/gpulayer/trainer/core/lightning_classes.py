"""Lightning's own classes, recognised by their name and defining module, so that the trainer never imports Lightning
(a model, DataModule or callback another library built on them is taken as it is)."""

from __future__ import annotations


def is_lightnings(kind: type) -> bool:
    """Whether the class ``kind`` is defined in Lightning (either distribution), not built on it elsewhere."""
    return is_lightning_path(kind.__module__)


def is_lightning_path(dotted: str) -> bool:
    """Whether the dotted name (a module, or a config's ``class_path``) is in Lightning, either distribution."""
    return dotted.split(".")[0] in ("lightning", "pytorch_lightning")


def lightning_modules(path: str) -> tuple[str, str]:
    """The defining module ``path`` (below ``lightning.pytorch``) in Lightning's two distributions."""
    return f"lightning.pytorch.{path}", f"pytorch_lightning.{path}"


def lightning_class(kind: type, name: str, path: str) -> type | None:
    """Lightning's class ``name``, defined in ``path`` (below ``lightning.pytorch``), where ``kind`` derives from it."""
    modules = lightning_modules(path)
    return next((parent for parent in kind.__mro__ if parent.__name__ == name and parent.__module__ in modules), None)
