"""The warnings Lightning 2.6 gives about something a user must act on, given by GPUlayer in the same cases:
an epoch shorter than ``log_every_n_steps`` (``PossibleUserWarning``), a checkpoint folder that is not empty."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

from .conftest import line_fitter, quiet_lightning


def _warnings(framework, root, **arguments) -> list[tuple[str, str]]:
    """(category name, message) of the warnings a one-epoch fit of 5 batches gives, of the two kinds here."""
    is_ours = framework is gl
    extra = {} if is_ours else {"enable_progress_bar": False, "enable_model_summary": False}
    options = dict(accelerator="cpu", max_epochs=1, default_root_dir=root, enable_checkpointing=False) | arguments
    loader = DataLoader(TensorDataset(torch.randn(20, 2), torch.randn(20, 1)), batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        framework.Trainer(**options, **extra).fit(
            line_fitter(gl.Module if is_ours else framework.LightningModule)(), loader
        )
    kinds = ("The number of training batches", "Checkpoint directory")
    return [(type(w.message).__name__, str(w.message)) for w in caught if str(w.message).startswith(kinds)]


@pytest.mark.parametrize(
    ("arguments", "warned"),
    [
        ({"log_every_n_steps": 50}, True),  # the default, with a logger, over 5 batches
        ({"log_every_n_steps": 5}, False),
        ({"log_every_n_steps": 50, "logger": False}, False),
        ({"log_every_n_steps": 50, "fast_dev_run": 2}, False),
    ],
    ids=["5 batches, every 50", "5 batches, every 5", "no logger", "fast_dev_run"],
)
def test_an_epoch_shorter_than_the_logging_interval_warns_as_in_lightning(tmp_path, arguments, warned):
    with warnings.catch_warnings():
        theirs = _warnings(quiet_lightning(), tmp_path / "lightning", **arguments)
    ours = _warnings(gl, tmp_path / "gpulayer", **arguments)
    assert ours == theirs
    # Lightning's message, word for word: scripts filter warnings by it.
    expected = "The number of training batches (5) is smaller than the logging interval Trainer(log_every_n_steps=50)"
    assert [(kind, message.startswith(expected)) for kind, message in ours] == (
        [("PossibleUserWarning", True)] if warned else []
    )
    assert issubclass(gl.PossibleUserWarning, UserWarning)


def test_a_checkpoint_folder_that_is_not_empty_warns_as_in_lightning(tmp_path):
    found = {}
    for name in ("lightning", "gpulayer"):
        folder = tmp_path / name / "checkpoints"  # the default checkpoint folder without a logger
        folder.mkdir(parents=True)
        (folder / "notes.txt").write_text("mine")
        with warnings.catch_warnings():
            framework = quiet_lightning() if name == "lightning" else gl
            caught = _warnings(framework, tmp_path / name, logger=False, enable_checkpointing=True)
        found[name] = [(kind, message.replace(str(tmp_path / name), "ROOT")) for kind, message in caught]
    assert found["gpulayer"] == found["lightning"] and found["gpulayer"]
