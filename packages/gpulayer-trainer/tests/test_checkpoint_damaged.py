"""A damaged checkpoint (empty, truncated, or no checkpoint at all) is refused naming its path and what is wrong,
through every entry point that loads one, before any weight changes; a whole checkpoint that holds types outside
the weights-only allow-list still gets the advice to load it as trusted."""

import argparse
import pickle
import zipfile

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import DataModule, Module, Trainer
from gpulayer.trainer.checkpoint.checkpoint_io import (
    DamagedCheckpointError,
    EmptyCheckpointError,
    NotACheckpointError,
    TruncatedCheckpointError,
    UnsafeCheckpointError,
)


class Regressor(Module):
    def __init__(self, hidden=4):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.net(batch[0]).pow(2).mean())

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self.net(batch[0]).pow(2).mean())

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(DataModule):
    def __init__(self, size=8):
        super().__init__()
        self.save_hyperparameters()


def _loader():
    return DataLoader(TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0))), batch_size=4)


def _trainer(root):
    return Trainer(default_root_dir=root, accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False)


@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory):
    """A real checkpoint, written by a Trainer after an epoch of training."""
    root = tmp_path_factory.mktemp("good")
    trainer = _trainer(root)
    trainer.fit(Regressor(), _loader())
    trainer.save_checkpoint(root / "good.ckpt")
    return (root / "good.ckpt").read_bytes()


def _torch_saved(obj, path):
    torch.save(obj, path)
    return path.read_bytes()


def _zip_of_text(path):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "not weights")
    return path.read_bytes()


# Each damage: the file's bytes (from the good checkpoint and a scratch path), the error, and what it says.
DAMAGES = {
    "empty": (lambda good, scratch: b"", EmptyCheckpointError, EOFError, "the file is empty"),
    **{
        f"truncated at {where}": (cut, TruncatedCheckpointError, OSError, "the file is truncated: it stops after")
        for where, cut in {
            "byte 1": lambda good, scratch: good[:1],
            "byte 100": lambda good, scratch: good[:100],
            "the middle": lambda good, scratch: good[: len(good) // 2],
            "the last byte": lambda good, scratch: good[:-1],
        }.items()
    },
    "a text file": (
        lambda good, scratch: b"epoch=3 val_loss=0.2\n",
        NotACheckpointError,
        pickle.UnpicklingError,
        "it is not a checkpoint: torch.save writes a zip archive, and this file begins with b'epoch=3 val_loss'",
    ),
    "a pickle of a dict": (
        lambda good, scratch: pickle.dumps({"state_dict": {}}),
        NotACheckpointError,
        pickle.UnpicklingError,
        "it is not a checkpoint: a pickle that torch.save did not write",
    ),
    "a torch.save of a tensor": (
        lambda good, scratch: _torch_saved(torch.zeros(3), scratch),
        NotACheckpointError,
        pickle.UnpicklingError,
        "it is not a checkpoint: it holds a Tensor, and a checkpoint is a dict",
    ),
    "a zip archive of text": (
        lambda good, scratch: _zip_of_text(scratch),
        NotACheckpointError,
        pickle.UnpicklingError,
        "it is not a checkpoint: a zip archive that torch.save did not write",
    ),
}

ENTRY_POINTS = {
    "fit": lambda root, model, path: _trainer(root).fit(model, _loader(), ckpt_path=path),
    "validate": lambda root, model, path: _trainer(root).validate(model, _loader(), ckpt_path=path, verbose=False),
    "test": lambda root, model, path: _trainer(root).test(model, _loader(), ckpt_path=path, verbose=False),
    "predict": lambda root, model, path: _trainer(root).predict(model, _loader(), ckpt_path=path),
    "Module.load_from_checkpoint": lambda root, model, path: Regressor.load_from_checkpoint(path),
    "Module.load_from_checkpoint(weights_only=False)": lambda root, model, path: Regressor.load_from_checkpoint(
        path, weights_only=False
    ),
    "DataModule.load_from_checkpoint": lambda root, model, path: Data.load_from_checkpoint(path),
}


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_is_refused_naming_it_and_what_is_wrong(checkpoint_bytes, tmp_path, damage, entry_point):
    content, error, builtin, says = DAMAGES[damage]
    path = tmp_path / "epoch=1-step=4.ckpt"
    path.write_bytes(content(checkpoint_bytes, tmp_path / "scratch"))
    model = Regressor()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(DamagedCheckpointError) as refused:
        ENTRY_POINTS[entry_point](tmp_path, model, path)
    message = str(refused.value)
    assert type(refused.value) is error and isinstance(refused.value, builtin)
    assert message.startswith(f"refused to load {path}: {says}"), message
    assert "weights_only" not in message and "trust" not in message, message
    shown_after = refused.value.__cause__ or (None if refused.value.__suppress_context__ else refused.value.__context__)
    assert shown_after is None, f"the traceback goes on with torch's error, and its advice: {shown_after!r}"
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), f"{name} changed"


def test_a_whole_checkpoint_that_needs_trust_keeps_the_advice_to_trust_it(checkpoint_bytes, tmp_path):
    # A real checkpoint whose hyperparameters hold an object outside the weights-only allow-list: a trust decision
    # (ADR 0008), not damage.
    path = tmp_path / "namespace.ckpt"
    path.write_bytes(checkpoint_bytes)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["args"] = argparse.Namespace(hidden=4)
    torch.save(checkpoint, path)
    with pytest.raises(UnsafeCheckpointError, match=r"argparse\.Namespace") as refused:
        _trainer(tmp_path).fit(Regressor(), _loader(), ckpt_path=path)
    assert not isinstance(refused.value, DamagedCheckpointError)
    assert "load it with weights_only=False" in str(refused.value)
    assert isinstance(Regressor.load_from_checkpoint(path, weights_only=False), Regressor)
