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
