"""``self.log`` without ``batch_size`` infers it as Lightning 2.6's ``extract_batch_size`` does
(``lightning/pytorch/utilities/data.py``): through mappings, any iterable but a string (a PyTorch Geometric ``Data``
yields ``(key, tensor)`` pairs) and dataclasses, the first tensor's dim 0, with Lightning's warning where a later leaf
differs and its error where there is no tensor; the default ``transfer_batch_to_device`` moves an object with a
``to`` method by its own ``to``, as Lightning's ``move_data_to_device``."""

import dataclasses
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import gpulayer.trainer as gl

from .conftest import quiet_lightning

SIZES = (3, 5, 2)  # one batch per loader step, of these many nodes


class Graph:
    """A batch object in PyTorch Geometric's shape: iterating it yields ``(key, tensor)`` pairs; it has ``to``."""

    def __init__(self, nodes, keys):
        generator = torch.Generator().manual_seed(nodes)
        self.store = {key: torch.randn(nodes, 4, generator=generator) for key in keys}
        self.y = torch.randn(nodes, 2, generator=generator)

    def __iter__(self):
        yield from self.store.items()

    def to(self, device):
        self.store = {key: value.to(device) for key, value in self.store.items()}
        self.y = self.y.to(device)
        return self


@dataclasses.dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


def _graphs(keys):
    return [Graph(nodes, keys) for nodes in SIZES]


def _as_dict(keys):
    return [{"x": graph.store["x"], "y": graph.y, "count": len(keys)} for graph in _graphs(keys)]


def _features(batch):
    """The model's input and target of each batch shape above."""
    if isinstance(batch, Graph):
        return batch.store["x"], batch.y
    return batch["x"], batch["y"]


def _net(base):
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def loss(self, batch):
            x, y = _features(batch)
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def training_step(self, batch, batch_idx):
            self.log("train_loss", self.loss(batch), on_epoch=True)
            return self.loss(batch)

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.loss(batch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net


def _fit(framework, module_base, batches, root):
    """Two epochs on ``batches`` (a loader of ``batch_size=None``); the metrics, the weights, the step and the batch
    size warnings."""
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=root, max_epochs=2)
    if framework is not gl:
        options |= dict(enable_progress_bar=False, enable_model_summary=False)
        from lightning.pytorch.utilities.data import warning_cache

        warning_cache.clear()  # Lightning warns once per message and process: an earlier test may have warned
    torch.manual_seed(0)
    module = _net(module_base)()
    loader = DataLoader(batches, batch_size=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = framework.Trainer(**options)
        trainer.fit(module, loader, loader)
    return (
        {name: float(value) for name, value in trainer.callback_metrics.items()},
        {name: value.detach().clone() for name, value in module.state_dict().items()},
        trainer.global_step,
        {str(w.message) for w in caught if "batch_size" in str(w.message)},
    )


@pytest.mark.parametrize(
    "batches, ambiguous",
    [
        (_graphs(("x",)), False),
        (_graphs(("x", "edge_attr")), True),  # the second key, a string, differs from the first tensor's size
        (_as_dict(("x",)), True),  # an int after the tensors
    ],
    ids=["an object yielding one (key, tensor)", "an object yielding two", "a dict with an int"],
)
def test_the_batch_size_of_an_iterable_batch_is_inferred_as_lightning_infers_it(tmp_path, batches, ambiguous):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _fit(pl, pl.LightningModule, batches, tmp_path / "lightning")
    ours = _fit(gl, gl.Module, batches, tmp_path / "gpulayer")
    assert ours[0].keys() == theirs[0].keys() == {"train_loss", "train_loss_step", "train_loss_epoch", "val_loss"}
    assert ours[0] == pytest.approx(theirs[0], rel=1e-6)
    for name, weight in theirs[1].items():
        torch.testing.assert_close(ours[1][name], weight)
    assert ours[2] == theirs[2] == 2 * len(SIZES)
    assert ours[3] == theirs[3]
    assert bool(ours[3]) == ambiguous
    if ambiguous:  # a warning per batch size met, each naming the first tensor's
        assert ours[3] == {
            "Trying to infer the `batch_size` from an ambiguous collection. The batch size we found is "
            f"{size}. To avoid any miscalculations, use `self.log(..., batch_size=batch_size)`."
            for size in SIZES
        }


class _Endless:
    """Iterating it yields itself: the walk never reaches a leaf."""

    def __iter__(self):
        yield self


@pytest.mark.parametrize(
    "batch, error",
    [(["text", 3], Exception), (Pair(torch.zeros(2), torch.zeros(2, 3)), None), (_Endless(), RecursionError)],
    ids=["no tensor", "a dataclass", "endless"],
)
def test_a_batch_without_a_tensor_fails_as_in_lightning(tmp_path, batch, error):
    """No tensor: Lightning's ``MisconfigurationException`` (GPUlayer's is also a ``ValueError``), with its message;
    a walk that never ends: its ``RecursionError``."""
    with warnings.catch_warnings():
        pl = quiet_lightning()
        from lightning.pytorch.utilities.data import extract_batch_size

    from gpulayer.trainer.batch import batch_size_of

    if error is None:
        assert batch_size_of(batch, warn=False) == extract_batch_size(batch) == 2
        return
    expected = pl.utilities.exceptions.MisconfigurationException if error is Exception else error
    with pytest.raises(expected) as theirs:
        extract_batch_size(batch)

    class Net(_net(gl.Module)):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.tensor(1.0))

    trainer = gl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path)
    ours_type = gl.MisconfigurationException if error is Exception else error
    with pytest.raises(ours_type) as ours:
        trainer.validate(Net(), DataLoader([batch], batch_size=None, collate_fn=lambda b: b), verbose=False)
    assert str(ours.value) == str(theirs.value)


def test_the_default_transfer_moves_an_object_by_its_own_to_as_lightning_does():
    """Lightning's ``move_data_to_device`` calls ``to`` on any object that has one, within lists and dicts; an object
    whose ``to`` returns None is kept."""
    with warnings.catch_warnings():
        pl = quiet_lightning()

    class Recording:
        def __init__(self, returns_self):
            self.returns_self, self.devices = returns_self, []

        def to(self, device):
            self.devices.append(device)
            return self if self.returns_self else None

    device = torch.device("cpu")
    moved = []
    for hooks in (pl.LightningModule(), gl.Module()):
        batch = [Recording(True), {"r": Recording(False), "t": torch.ones(2)}, "text"]
        out = hooks.transfer_batch_to_device(batch, device, 0)
        assert out[0] is batch[0] and out[1]["r"] is batch[1]["r"] and out[2] == "text"
        moved.append((out[0].devices, out[1]["r"].devices, out[1]["t"].device))
    assert moved[0] == moved[1] == ([device], [device], device)
