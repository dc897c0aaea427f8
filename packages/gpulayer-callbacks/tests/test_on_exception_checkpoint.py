"""OnExceptionCheckpoint against Lightning 2.6.6: an exception raised at the same point of the same run under both
frameworks writes the same file, with the same counters and weights, from the same hook; a run resumed from it
ends as Lightning's does (and as an unbroken run), and an entry point that ends well removes the file in both."""

import os
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks import OnExceptionCheckpoint
from gpulayer.runtime.testing import run_ranks

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import OnExceptionCheckpoint as LightningOnExceptionCheckpoint

FRAMEWORKS = frameworks(OnExceptionCheckpoint=(LightningOnExceptionCheckpoint, OnExceptionCheckpoint))


class Boom(RuntimeError):
    pass


def _module(framework, fail):
    """A linear regressor that raises ``Boom`` in ``training_step`` or ``validation_step`` at ``fail["step"]``
    (``fail["where"]`` names the hook)."""

    class Regressor(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if fail.get("where") == "training_step" and self.global_step == fail["step"]:
                raise Boom("training_step")
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            failing = fail.get("where") == "validation_step" and self.global_step == fail["step"]
            if failing and not self.trainer.sanity_checking:
                raise Boom("validation_step")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regressor()


def _raiser(framework, fail, trace, path):
    """Raises ``Boom`` at the end of a train batch or epoch; notes, in its ``on_exception``, whether the file is
    there yet (the checkpoint callback runs after it)."""

    class Raiser(framework.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if fail.get("where") == "on_train_batch_end" and trainer.global_step == fail["step"]:
                raise Boom("on_train_batch_end")

        def on_train_epoch_end(self, trainer, pl_module):
            if fail.get("where") == "on_train_epoch_end" and trainer.global_step == fail["step"]:
                raise Boom("on_train_epoch_end")

        def on_exception(self, trainer, pl_module, exception):
            trace.append(("on_exception", str(exception), os.path.exists(path)))

        def teardown(self, trainer, pl_module, stage):
            trace.append(("teardown", getattr(stage, "value", stage), os.path.exists(path)))

    return Raiser()


def _data(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator)), 4)


def _fit(name, root, fail=None, ckpt_path=None, stage="fit", warned=None):
    """One entry point under framework ``name`` with the callback saving into ``root/name``; what it did. The
    warnings' messages go to ``warned``."""
    framework = FRAMEWORKS[name]
    folder = root / name
    callback = framework.OnExceptionCheckpoint(folder)
    trace = []
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 3,
        "logger": False,
        "default_root_dir": folder,
        "callbacks": [_raiser(framework, fail or {}, trace, callback.ckpt_path), callback],
    }
    trainer = framework.Trainer(**options | framework.options)
    module = _module(framework, fail or {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if stage == "fit":
                trainer.fit(module, _data(16, 0), _data(4, 1), ckpt_path=ckpt_path)
            else:
                trainer.validate(module, _data(4, 1), verbose=False)
            raised = None
        except Boom as error:
            raised = str(error)
    if warned is not None:
        warned += [str(w.message) for w in caught]
    return {
        "raised": raised,
        "trace": trace,
        "files": sorted(os.listdir(folder)) if folder.exists() else [],
        "ckpt_path": os.path.relpath(callback.ckpt_path, folder),
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "weights": [round(value, 6) for value in module.layer.weight.flatten().tolist()],
    }


def _saved(path):
    """What a checkpoint holds that both frameworks write alike."""
    checkpoint = torch.load(path, weights_only=True)
    optimizer = checkpoint["optimizer_states"][0]
    return {
        "epoch": checkpoint["epoch"],
        "global_step": checkpoint["global_step"],
        "state_dict": {name: tensor.tolist() for name, tensor in checkpoint["state_dict"].items()},
        "optimizer": optimizer["param_groups"],
        "callbacks": checkpoint["callbacks"],
    }


FAILURES = [
    pytest.param({"where": "on_train_batch_end", "step": 6}, id="train-batch-end"),
    pytest.param({"where": "on_train_epoch_end", "step": 8}, id="train-epoch-end"),
    pytest.param({"where": "validation_step", "step": 8}, id="validation-step"),
    pytest.param({"where": "training_step", "step": 6}, id="training-step"),
]


@pytest.mark.parametrize("fail", FAILURES)
def test_an_exception_in_fit_writes_the_file_lightning_writes(tmp_path, fail):
    runs = {name: _fit(name, tmp_path, fail) for name in FRAMEWORKS}
    assert runs["gpulayer"] == runs["lightning"]
    assert runs["gpulayer"]["files"] == ["on_exception.ckpt"]
    assert runs["gpulayer"]["trace"] == [("on_exception", fail["where"], False)]  # no teardown; the callback last
    saved = {name: _saved(tmp_path / name / "on_exception.ckpt") for name in FRAMEWORKS}
    assert saved["gpulayer"] == saved["lightning"]
    assert saved["gpulayer"]["global_step"] == fail["step"]


RESUMES = [param for param in FAILURES if param.id != "training-step"]


@pytest.mark.parametrize("how", ["by itself", "last", "path"])
@pytest.mark.parametrize("fail", RESUMES)
def test_a_run_resumed_from_the_file_ends_as_lightnings_and_removes_it(tmp_path, fail, how):
    """Resumed from the file named, from ``ckpt_path="last"``, or by itself (Lightning's rule: ``fit`` without a
    ``ckpt_path`` uses "last" when an OnExceptionCheckpoint is among the callbacks). Counters as Lightning's;
    weights as an unbroken run's (Lightning restarts a mid-epoch loader from its first batch, GPUlayer goes on with
    the batches an unbroken run reads: see docs/porting-from-lightning.md); the file removed by the resumed run's
    teardown in both."""
    unbroken = _fit("gpulayer", tmp_path / "unbroken")
    resumed = {}
    for name in FRAMEWORKS:
        _fit(name, tmp_path, fail)
        path = str(tmp_path / name / "on_exception.ckpt")
        resumed[name] = _fit(name, tmp_path, ckpt_path={"by itself": None, "last": "last", "path": path}[how])
    for run in resumed.values():
        assert (run["raised"], run["files"], run["global_step"], run["current_epoch"]) == (None, [], 12, 3)
        assert run["trace"] == [("teardown", "fit", True)]  # the callback's teardown, after this one's, removes it
    assert resumed["gpulayer"]["weights"] == unbroken["weights"]
    if fail["where"] != "on_train_batch_end":  # an epoch's end: Lightning too goes on as an unbroken run
        assert resumed["lightning"]["weights"] == unbroken["weights"]


@pytest.mark.parametrize("step", [0, 4, 6], ids=["first batch", "an epoch's first batch", "mid-epoch"])
def test_a_run_resumed_from_an_exception_in_training_step_runs_the_failed_batch_again(tmp_path, step):
    fail = {"where": "training_step", "step": step}
    resumed = {}
    for name in FRAMEWORKS:
        _fit(name, tmp_path, fail)
        resumed[name] = _fit(name, tmp_path, ckpt_path=str(tmp_path / name / "on_exception.ckpt"))
    assert resumed["gpulayer"]["global_step"] == resumed["lightning"]["global_step"] == 12
    # Lightning reads the interrupted epoch's loader again from its start (a DataLoader is not resumable there);
    # GPUlayer goes on from the failed batch, so its resumed run trains as the unbroken one.
    assert resumed["gpulayer"]["weights"] == _fit("gpulayer", tmp_path / "unbroken")["weights"]


def test_an_exception_in_validate_writes_the_file_too(tmp_path):
    runs = {
        name: _fit(name, tmp_path, {"where": "validation_step", "step": 0}, stage="validate") for name in FRAMEWORKS
    }
    assert runs["gpulayer"] == runs["lightning"]
    assert runs["gpulayer"]["files"] == ["on_exception.ckpt"]


def test_an_entry_point_that_ends_well_removes_an_earlier_file(tmp_path):
    runs = {}
    for name in FRAMEWORKS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "on_exception.ckpt").write_bytes(b"from an earlier run")
        runs[name] = _fit(name, tmp_path, stage="validate")
    assert runs["gpulayer"] == runs["lightning"]
    assert runs["gpulayer"]["files"] == []
    assert runs["gpulayer"]["trace"] == [("teardown", "validate", True)]


def test_a_first_fit_with_it_says_it_looks_for_a_file_and_starts_from_scratch(tmp_path):
    warned = []
    run = _fit("gpulayer", tmp_path, warned=warned)
    assert (run["global_step"], run["files"]) == (12, [])
    assert any("ckpt_path='last' is used" in message for message in warned)
    assert any("no last*.ckpt found, nor an OnExceptionCheckpoint file" in message for message in warned)


@pytest.mark.parametrize("dirpath", ["ckpts", Path("ckpts") / "inner"])
@pytest.mark.parametrize("filename", ["on_exception", "crash-{epoch}", "last.v1"])
def test_ckpt_path_and_attributes_match_lightning(dirpath, filename):
    theirs = LightningOnExceptionCheckpoint(dirpath, filename)
    ours = OnExceptionCheckpoint(dirpath, filename)
    assert (ours.ckpt_path, ours.dirpath, ours.filename, ours.FILE_EXTENSION, ours.state_key) == (
        theirs.ckpt_path,
        theirs.dirpath,
        theirs.filename,
        theirs.FILE_EXTENSION,
        theirs.state_key,
    )
    assert isinstance(ours, gl.Checkpoint)


def test_an_empty_filename_is_refused_with_lightnings_message():
    messages = []
    for framework in FRAMEWORKS.values():
        with pytest.raises(ValueError) as error:
            framework.OnExceptionCheckpoint("ckpts", filename="")
        messages.append(str(error.value))
    assert messages[0] == messages[1] == "The filename cannot be empty"


@pytest.mark.parametrize(("arguments", "named"), [((None,), "dirpath=None"), (("ckpts", 3), "filename=3")])
def test_a_dirpath_or_filename_lightning_fails_on_only_when_saving_is_refused_at_once(tmp_path, arguments, named):
    """Lightning takes them and fails inside the exception it saves for, with a TypeError that names neither."""
    LightningOnExceptionCheckpoint(*arguments)
    with pytest.raises(TypeError, match=f"^{named}: accepted values are"):
        OnExceptionCheckpoint(*arguments)


def test_enable_checkpointing_false_refuses_it_and_no_default_checkpoint_joins_it(tmp_path):
    with pytest.raises(ValueError, match="enable_checkpointing=False but callbacks holds a checkpoint callback"):
        gl.Trainer(callbacks=[OnExceptionCheckpoint(tmp_path)], enable_checkpointing=False)
    trainer = gl.Trainer(callbacks=[OnExceptionCheckpoint(tmp_path)], logger=False, default_root_dir=tmp_path)
    assert [type(c).__name__ for c in trainer.checkpoint_callbacks] == ["OnExceptionCheckpoint"]


def test_lightnings_own_is_refused_naming_gpulayers(tmp_path):
    with pytest.raises(
        TypeError, match=r"Lightning's OnExceptionCheckpoint .*: use gpulayer\.callbacks\.OnExceptionCheckpoint"
    ):
        gl.Trainer(callbacks=[LightningOnExceptionCheckpoint(tmp_path)], default_root_dir=tmp_path)


def _two_ranks(runtime, folder: str, failing: list[int]) -> dict:
    """Both ranks fit under DDP (2 batches each); the ranks in ``failing`` raise in ``training_step`` at step 1."""
    rank = runtime.global_rank
    fail = {"where": "training_step", "step": 1} if rank in failing else {}
    callback = OnExceptionCheckpoint(folder)
    trainer = gl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        default_root_dir=folder,
        callbacks=[callback],
    )
    try:
        trainer.fit(_module(FRAMEWORKS["gpulayer"], fail), _data(16, rank))
        raised = None
    except Exception as error:  # the Boom, or the collective error the other rank's exit leaves
        raised = type(error).__name__
    return {"raised": raised, "global_step": trainer.global_step}


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("failing", "raised"),
    [([0, 1], ["Boom", "Boom"]), ([1], ["CollectiveError", "Boom"])],
    ids=["every-rank", "rank-1-alone"],
)
def test_under_ddp_global_rank_zero_writes_the_file_from_its_own_exception(tmp_path, failing, raised):
    """Each rank that raises calls ``save_checkpoint``, where rank 0 alone writes: with the error every rank meets,
    or, when rank 1 fails alone, with the collective error its exit leaves rank 0 (the process group's timeout
    bounds the wait)."""
    ranks = run_ranks(_two_ranks, str(tmp_path), failing, timeout=120, collective_timeout=30)
    assert ranks == [{"raised": name, "global_step": 1} for name in raised]
    assert os.listdir(tmp_path) == ["on_exception.ckpt"]
    assert _saved(tmp_path / "on_exception.ckpt")["global_step"] == 1
