"""Every home the porting registry names exists in the distributions it names (gpulayer-port pins only the trainer,
so this cross-package check runs with every distribution installed)."""

import importlib

from gpulayer.port import registry


def test_every_adopted_name_has_its_gpulayer_home():
    homes = {answer.home for answer in registry.REGISTRY.values() if answer.rewritten}
    for home in sorted(homes):
        module, name = home.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), name), home
    assert registry.renames() == {"LightningDataModule": "DataModule", "LightningModule": "Module"}


def test_every_public_name_gpulayer_shares_with_lightning_is_ported_to_it():
    """A name GPUlayer exports that Lightning has too is never reported missing: Lightning's shortest public path to
    it (a package that re-exports it, else the module defining it) is rewritten to GPUlayer's name."""
    import pkgutil
    import warnings

    import pytest

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lightning = pytest.importorskip("lightning.pytorch")
        modules = {}
        for found in pkgutil.walk_packages(lightning.__path__, "lightning.pytorch."):
            if not any(part.startswith("_") for part in found.name.split(".")):
                try:
                    modules[found.name] = (found.ispkg, importlib.import_module(found.name))
                except ImportError:  # an integration whose package is not installed
                    continue
    modules["lightning.pytorch"] = (True, lightning)
    theirs_of = {ours: theirs for theirs, ours in registry.renames().items()}
    missing = []
    for package in ("gpulayer.trainer", "gpulayer.callbacks", "gpulayer.fsdp", "gpulayer.cli"):
        for name in importlib.import_module(package).__all__:
            theirs = theirs_of.get(name, name)
            exported = [f"{path}.{theirs}" for path, (ispkg, m) in modules.items() if ispkg and hasattr(m, theirs)]
            defined = [
                f"{path}.{theirs}"
                for path, (_, m) in modules.items()
                if getattr(getattr(m, theirs, None), "__module__", None) == path
            ]
            paths = exported or defined
            if not paths or name == "__version__":
                continue  # GPUlayer's own (NonFiniteLossError), or a name Lightning defines elsewhere (fabric)
            path = min(paths, key=len)
            answer = registry.answer(path)
            if not answer.rewritten or answer.home != f"{package}.{name}":
                missing.append(f"{path}: {answer.status} {answer.home}".strip())
    assert missing == []
