"""SpikeDetection against Lightning 2.6.6 (``lightning/pytorch/callbacks/spike.py`` over
``lightning/fabric/utilities/spike.py``): a scripted loss spikes at the same batch under both frameworks, which raise
``TrainingSpikeException`` with the same message and write the same file with the same batch indices; the same
arguments give the same decisions, the same state, and the same errors for bad values."""

import json
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.callbacks.spike_detection import SpikeDetection, TrainingSpikeException
from gpulayer.runtime.testing import run_ranks

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.fabric.utilities.spike import TrainingSpikeException as LightningSpikeException
    from lightning.pytorch.callbacks import SpikeDetection as LightningSpikeDetection

FRAMEWORKS = frameworks(SpikeDetection=(LightningSpikeDetection, SpikeDetection))
NAN, INF = float("nan"), float("inf")


def _module(framework, losses, as_dict):
    """``training_step`` returns ``losses[i]`` at the i-th batch of the run (dyadic values: every mean is exact)."""

    class Scripted(framework.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.seen = 0

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).sum() * 0 + losses[self.seen]
            self.seen += 1
            return {"loss": loss} if as_dict else loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Scripted()


def _loader(batches):
    return DataLoader(TensorDataset(torch.ones(batches, 2)), batch_size=1)


def _fit(name, root, losses, spike_options, *, batches=None, epochs=1, as_dict=False, save=None):
    """The run's outcome: what it raised, the batches trained, the files under ``root`` and the callback's state."""
    framework = FRAMEWORKS[name]
    os.makedirs(root, exist_ok=True)
    callback = framework.SpikeDetection(**spike_options)
    model = _module(framework, losses, as_dict)
    options = {"accelerator": "cpu", "max_epochs": epochs, "logger": False, "enable_checkpointing": False}
    options |= {"default_root_dir": root, "callbacks": [callback]}
    if name == "gpulayer":
        options["check_finite_loss"] = False  # GPUlayer's own NaN check would stop a finite_only=False run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = framework.Trainer(**options | framework.options)
        try:
            trainer.fit(model, _loader(batches or len(losses)))
            raised = None
        except (TrainingSpikeException, LightningSpikeException) as error:
            raised = (type(error).__name__, str(error))
        if save is not None:
            trainer.save_checkpoint(save)
    files = {}
    for folder, _, names in os.walk(root):
        for file in names:
            with open(os.path.join(folder, file)) as handle:
                files[os.path.relpath(os.path.join(folder, file), root)] = handle.read()
    state = callback.state_dict()
    if state["bad_batches_path"] is not None:
        state["bad_batches_path"] = os.path.relpath(state["bad_batches_path"], root)
    return {"raised": raised, "trained": model.seen, "files": files, "state": state}


def _both(tmp_path, losses, **spike_options):
    expected = _fit("lightning", tmp_path / "lightning", losses, spike_options)
    actual = _fit("gpulayer", tmp_path / "gpulayer", losses, spike_options)
    assert actual == expected
    return actual


SPIKE = ("TrainingSpikeException", "Training spike detected in batch 4")


@pytest.mark.parametrize(
    ("losses", "options", "raised", "bad_batches"),
    [
        pytest.param([1.0, 1.0, 1.0, 1.0, 5.0, 1.0], {}, SPIKE, [3, 4], id="default-rtol"),
        pytest.param([1.0, 1.0, 1.0, 1.0, 2.5, 1.0], {}, None, [], id="below-rtol"),
        pytest.param([1.0, 1.0, 1.0, 1.0, 5.0, 1.0], {"rtol": None, "atol": 3.0}, SPIKE, [3, 4], id="atol-alone"),
        pytest.param([1.0, 1.0, 1.0, 1.0, 3.5, 1.0], {"atol": 3.0}, None, [], id="below-atol"),
        pytest.param([1.0, 1.0, 1.0, 1.0, 5.0], {"atol": 5.0}, None, [], id="atol-and-rtol"),
        pytest.param([10.0, 1.0, 1.0, 4.0, 4.0], {}, None, [], id="window-10-holds-the-first"),
        pytest.param(
            [10.0, 1.0, 1.0, 4.0, 4.0],
            {"window": 2},
            ("TrainingSpikeException", SPIKE[1][:-1] + "3"),
            [2, 3],
            id="window-2-forgets-it",
        ),
        pytest.param([9.0, 1.0, 1.0, 1.0, 1.0], {"warmup": 0}, None, [], id="warmup-0-nan-mean"),
        pytest.param([1.0, 9.0, 1.0, 1.0, 1.0], {"warmup": 2}, None, [], id="spike-in-warmup"),
        pytest.param([1.0, 1.0, 1.0, 1.0, NAN, 1.0], {}, SPIKE, [3, 4], id="nan-is-a-spike"),
        pytest.param([1.0, 1.0, 1.0, 1.0, INF, 1.0], {"rtol": None}, SPIKE, [3, 4], id="inf-is-a-spike"),
        pytest.param(
            [1.0, 1.0, 1.0, 1.0, NAN, 1.0, 5.0],
            {"finite_only": False},
            ("TrainingSpikeException", "Training spike detected in batch 6"),
            [5, 6],
            id="not-finite-only-skips-nan",
        ),
        pytest.param([1.0, NAN, 1.0, 1.0, 1.0], {"finite_only": False, "warmup": 3}, None, [], id="nan-in-warmup"),
        pytest.param([1.0, NAN, 1.0, 1.0, 5.0], {"warmup": 2}, SPIKE, [3, 4], id="nan-in-warmup-left-out-of-the-mean"),
        pytest.param([4.0, 4.0, 4.0, 4.0, 1.0], {"mode": "max", "rtol": 0.5}, SPIKE, [3, 4], id="max-mode"),
        pytest.param([4.0, 4.0, 4.0, 4.0, 1.0], {"rtol": 0.5}, None, [], id="a-drop-is-no-spike-in-min-mode"),
        pytest.param([1.0, 1.0, 1.0, 1.0, 5.0], {"exclude_batches_path": "skips"}, SPIKE, [3, 4], id="folder"),
        pytest.param([1.0, 1.0, 1.0, 1.0, 5.0], {"exclude_batches_path": "a/b.json"}, SPIKE, [3, 4], id="file"),
    ],
)
def test_the_same_spike_file_and_state_as_lightning(tmp_path, losses, options, raised, bad_batches):
    if "exclude_batches_path" in options:  # relative to each framework's folder
        path = options.pop("exclude_batches_path")
        results = {}
        for name in FRAMEWORKS:
            root = tmp_path / name
            results[name] = _fit(name, root, losses, options | {"exclude_batches_path": str(root / path)})
        assert results["gpulayer"] == results["lightning"]
        result = results["gpulayer"]
    else:
        result = _both(tmp_path, losses, **options)
    assert result["raised"] == raised
    assert result["state"]["bad_batches"] == bad_batches
    written = {name: json.loads(text) for name, text in result["files"].items()}
    assert list(written.values()) == ([bad_batches] if raised else [])


@pytest.mark.parametrize(("warmup", "spike_at"), [(2, None), (1, 1)])
def test_warmup_counts_from_each_epochs_start_and_the_indices_are_the_epochs(tmp_path, warmup, spike_at):
    """Lightning's warmup compares ``batch_idx``, which starts again each epoch: a spike at the second batch of the
    second epoch is not checked with ``warmup=2``; the file holds epoch-local indices."""
    losses = [1.0, 1.0, 1.0, 1.0, 1.0, 9.0, 1.0, 1.0]
    results = {}
    for name in FRAMEWORKS:
        results[name] = _fit(name, tmp_path / name, losses, {"warmup": warmup}, batches=4, epochs=2)
    assert results["gpulayer"] == results["lightning"]
    if spike_at is None:
        assert results["gpulayer"]["raised"] is None and results["gpulayer"]["trained"] == 8
    else:
        assert results["gpulayer"]["raised"] == (
            "TrainingSpikeException",
            f"Training spike detected in batch {spike_at}",
        )
        assert results["gpulayer"]["files"] == {"skip_batches.json": "[\n    0,\n    1\n]"}


def test_the_loss_of_a_dict_output_and_the_saved_state(tmp_path):
    results = {}
    for name in FRAMEWORKS:
        ckpt = tmp_path / f"{name}.ckpt"
        _fit(name, tmp_path / name, [2.0, 1.0, 1.5, 1.0], {"window": 3}, as_dict=True, save=ckpt)
        state = torch.load(ckpt, weights_only=False)["callbacks"]
        results[name] = {key: dict(value) for key, value in state.items()}
        results[name]["SpikeDetection"]["bad_batches_path"] = os.path.basename(
            results[name]["SpikeDetection"]["bad_batches_path"]
        )
    assert results["gpulayer"] == results["lightning"]
    assert results["gpulayer"]["SpikeDetection"]["last_val"] == 1.0


def test_a_resumed_run_restores_the_state_lightning_cannot_load(tmp_path):
    """Lightning 2.6's ``load_state_dict`` reads ``self.running``, which it never sets: its resume fails. GPUlayer
    restores what was saved."""
    losses = [1.0, 1.0, 1.0, 1.0, 5.0]
    for name in FRAMEWORKS:
        _fit(name, tmp_path / name, losses, {}, save=tmp_path / f"{name}.ckpt")
    with pytest.raises(AttributeError, match="running"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        FRAMEWORKS["lightning"].Trainer(
            max_epochs=2, callbacks=[LightningSpikeDetection()], default_root_dir=tmp_path, logger=False
        ).fit(_module(FRAMEWORKS["lightning"], [1.0] * 10, False), _loader(5), ckpt_path=tmp_path / "lightning.ckpt")
    saved = torch.load(tmp_path / "gpulayer.ckpt", weights_only=False)["callbacks"]["SpikeDetection"]
    callback = SpikeDetection(window=3, warmup=7)
    callback.load_state_dict(saved)
    assert callback.state_dict() == saved
    assert callback.bad_batches == [3, 4] and callback.warmup == 1


def test_outputs_of_another_type_are_refused_as_lightning_refuses_them(tmp_path):
    message = "outputs have to be of type torch.Tensor or Mapping, got list"
    for framework in FRAMEWORKS.values():
        with pytest.raises(TypeError, match=message):
            framework.SpikeDetection().on_train_batch_end(None, None, [torch.tensor(1.0)], None, 0)


@pytest.mark.parametrize("options", [{"window": 0}, {"window": 2.0}, {"mode": "avg"}], ids=str)
def test_bad_arguments_raise_lightnings_errors(tmp_path, options):
    """Lightning raises for a bad ``window`` at construction and for a bad ``mode`` at the first check; GPUlayer
    raises both at construction, with the same type and message."""
    with pytest.raises(ValueError) as theirs:
        _fit("lightning", tmp_path, [1.0, 2.0, 3.0], options)
    with pytest.raises(ValueError) as ours:
        SpikeDetection(**options)
    assert str(ours.value) == str(theirs.value)
    assert type(ours.value) is type(theirs.value) is ValueError


def _two_ranks(runtime, folder: str) -> dict:
    """Rank 1's loss spikes at batch 3, rank 0's does not."""
    rank = runtime.global_rank
    losses = [1.0, 1.0, 1.0, 8.0 if rank == 1 else 1.0, 1.0]
    callback = SpikeDetection()
    trainer = FRAMEWORKS["gpulayer"].Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        default_root_dir=folder,
        callbacks=[callback],
        enable_checkpointing=False,
    )
    try:
        trainer.fit(_module(FRAMEWORKS["gpulayer"], losses, False), _loader(10))
        raised = None
    except TrainingSpikeException as error:
        raised = str(error)
    return {"raised": raised, "bad_batches": callback.bad_batches}


@pytest.mark.multiprocess
def test_under_ddp_a_spike_on_one_rank_stops_every_rank_and_rank_zero_writes(tmp_path):
    ranks = run_ranks(_two_ranks, str(tmp_path), timeout=120, collective_timeout=30)
    assert ranks == [{"raised": "Training spike detected in batch 3", "bad_batches": [2, 3]}] * 2
    assert os.listdir(tmp_path) == ["skip_batches.json"]
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [2, 3]
