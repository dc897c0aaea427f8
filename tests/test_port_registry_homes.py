"""Every home the porting registry names exists in the distributions it names (gpulayer-port pins only the trainer,
so this cross-package check runs with every distribution installed)."""

import functools
import importlib
import pkgutil
import warnings
from types import ModuleType

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.port import registry


def test_every_adopted_name_has_its_gpulayer_home():
    homes = {answer.home for answer in registry.REGISTRY.values() if answer.rewritten}
    for home in sorted(homes):
        module, name = home.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), name), home
    assert registry.renames() == {"LightningDataModule": "DataModule", "LightningModule": "Module"}


@functools.cache
def _lightning_modules() -> dict[str, tuple[bool, ModuleType]]:
    """Lightning 2.6's public modules (none with a part starting with ``_``), by name: whether each is a package."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lightning = pytest.importorskip("lightning")
        modules = {"lightning": (True, lightning)}
        for root in (importlib.import_module("lightning.pytorch"), importlib.import_module("lightning.fabric")):
            modules[root.__name__] = (True, root)
            for found in pkgutil.walk_packages(root.__path__, f"{root.__name__}."):
                if not any(part.startswith("_") for part in found.name.split(".")):
                    try:
                        modules[found.name] = (found.ispkg, importlib.import_module(found.name))
                    except ImportError:  # an integration whose package is not installed
                        continue
    return modules


def test_every_public_name_gpulayer_shares_with_lightning_is_ported_to_it():
    """A name GPUlayer exports that Lightning has too is never reported missing: Lightning's shortest public path to
    it (a package that re-exports it, else the module defining it) is rewritten to GPUlayer's name."""
    modules = {name: found for name, found in _lightning_modules().items() if name.startswith("lightning.pytorch")}
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


def _exports(name: str, ispkg: bool, module: ModuleType) -> dict[str, object]:
    """What a Lightning module exports: the names of its ``__all__``, or of a package without one every public name,
    and what it defines; not what a module imports for its own use (``fit_loop.MisconfigurationException``)."""
    listed = getattr(module, "__all__", None)
    return {
        attribute: value
        for attribute, value in vars(module).items()
        if not attribute.startswith("_")
        and ((listed is None and ispkg) or attribute in (listed or ()) or getattr(value, "__module__", None) == name)
    }


def _registry_objects() -> dict[int, tuple[str, object]]:
    """Each object the registry answers for by its own path, and the classes of a package it keeps whole
    (``lightning.pytorch.loggers.*``), by identity: the path the registry knows it by, and the object."""
    objects = {}
    for path, answer in registry.REGISTRY.items():
        if path.endswith(".") and answer.status == registry.KEPT:
            package = path.removesuffix(".")
            for name, value in _exports(package, True, importlib.import_module(package)).items():
                if isinstance(value, type):
                    objects.setdefault(id(value), (path + name, value))
        elif not path.endswith("."):
            module, name = path.rsplit(".", 1)
            value = getattr(importlib.import_module(module), name)
            objects[id(value)] = (path, value)
    return objects


def test_every_public_path_lightning_exports_a_name_by_is_answered_as_its_registered_path():
    """issue 43: a name imported from the submodule that defines it or a package that re-exports it
    (``lightning.pytorch.callbacks.early_stopping.EarlyStopping``, ``lightning.pytorch.core.module.LightningModule``,
    ``lightning.pytorch.callbacks.progress.rich_progress.RichProgressBar``, ``lightning.fabric.seed_everything``), and
    the same under ``pytorch_lightning``, is answered as the registry answers the path it names it by; and no path of
    another object is rewritten to a GPUlayer name."""
    objects = _registry_objects()
    wrong = []
    for module_name, (ispkg, module) in _lightning_modules().items():
        for attribute, value in _exports(module_name, ispkg, module).items():
            paths = [f"{module_name}.{attribute}"]
            if module_name.startswith("lightning.pytorch"):
                paths.append("pytorch_lightning" + paths[0].removeprefix("lightning.pytorch"))
            registered = objects.get(id(value))
            for path in paths:
                answer = registry.answer(path)
                if registered is not None and registered[1] is value:
                    expected = registry.answer(registered[0])
                    if (answer.status, answer.home) != (expected.status, expected.home):
                        wrong.append(f"{path}: {answer.status}, as {registered[0]}: {expected.status}")
                elif answer.rewritten:
                    wrong.append(f"{path}: rewritten to {answer.home}, another object")
    assert wrong == []


def _fit_calling_the_helpers(framework, module_base, root) -> tuple[dict[str, float], dict[str, object]]:
    """Two epochs of a module whose hooks call each helper the registry says works as it is; the metrics (the
    gradient norms among them) and what each helper gave."""
    from lightning.fabric.utilities import measure_flops, move_data_to_device, suggested_max_num_workers
    from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars
    from lightning.pytorch.utilities import grad_norm

    given: dict[str, object] = {}

    class Net(module_base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def setup(self, stage):
            given["suggested_max_num_workers"] = suggested_max_num_workers(self.trainer.num_devices) >= 1
            given["measure_flops"] = measure_flops(self, lambda: self(torch.ones(2, 4)))

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            x, y = move_data_to_device(batch, self.device)
            given["move_data_to_device"] = str(x.device)
            loss = torch.nn.functional.mse_loss(self(x), y)
            given["convert_tensors_to_scalars"] = convert_tensors_to_scalars({"loss": loss.detach()})["loss"]
            return loss

        def on_before_optimizer_step(self, optimizer):
            norms = grad_norm(self, norm_type=2)
            given["grad_norm"] = sorted(norms)
            self.log_dict(norms, on_epoch=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=root, max_epochs=2)
    if module_base.__module__.startswith("lightning"):
        options |= dict(enable_progress_bar=False, enable_model_summary=False)
    trainer = framework.Trainer(**options)
    trainer.fit(Net(), data)
    return {name: float(value) for name, value in trainer.callback_metrics.items()}, given


def test_the_helpers_the_registry_says_work_as_they_are_work_in_gpulayers_fit(tmp_path):
    """issue 43: each helper answered ``works as it is`` runs in a GPUlayer module's hooks as in Lightning's: the same
    gradient norms logged, the same values returned."""
    import gpulayer.trainer as gl

    helper = registry.REGISTRY[
        "lightning.pytorch.utilities.grad_norm"
    ]  # the typing aliases work too, and only annotate
    helpers = {path.rsplit(".", 1)[1] for path, answer in registry.REGISTRY.items() if answer == helper}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl = pytest.importorskip("lightning.pytorch")
        theirs = _fit_calling_the_helpers(pl, pl.LightningModule, tmp_path / "lightning")
    ours = _fit_calling_the_helpers(gl, gl.Module, tmp_path / "gpulayer")
    assert ours[1].keys() == theirs[1].keys() == helpers
    assert ours[1] == theirs[1]
    assert "grad_2.0_norm/layer.weight_epoch" in theirs[0]
    assert ours[0] == pytest.approx(theirs[0], rel=1e-6)
