"""Behaviours Lightning's own tests and real scripts rely on, compared with Lightning 2.6: hooks assigned on an
instance (or a ``Mock(spec=Callback)``), a step set to None, the stage passed to ``setup``/``teardown``, DDP's
sampler on one process, an unsized loader whose ``__len__`` raises, and a few return values."""

import os
import subprocess
import sys
import textwrap
import warnings
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning


def _regressor(base):
    class Regressor(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.stages = []

        def forward(self, x):
            return self.layer(x)

        def setup(self, *, stage):  # keyword-only: Lightning passes stage=
            self.stages.append((stage == "fit", stage.value))

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regressor


def _data():
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(24, 4, generator=generator), torch.randn(24, 1, generator=generator))


def _fit(framework, module_base, tmp_path, model_change=None, **options):
    torch.manual_seed(0)
    model = _regressor(module_base)()
    if model_change is not None:
        model_change(model)
    trainer = framework.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path, **options
    )
    trainer.fit(model, DataLoader(_data(), batch_size=4, shuffle=True), DataLoader(_data(), batch_size=8))
    return trainer, model


def _both(tmp_path, model_change=None, **options):
    """(Lightning's, GPUlayer's) trainer and model. GPUlayer runs first: Lightning's DDP in this process sets
    RANK and friends and leaves its process group, which are put back as they were afterwards."""
    ours = _fit(gl, gl.Module, tmp_path / "gpulayer", model_change, **options)
    environment = dict(os.environ)
    try:
        with warnings.catch_warnings():
            pl = quiet_lightning()
            lightning_only = {"enable_progress_bar": False}
            theirs = _fit(pl, pl.LightningModule, tmp_path / "lightning", model_change, **lightning_only, **options)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)
    return theirs, ours


def test_hooks_assigned_on_instances_and_mocked_callbacks_are_called_as_in_lightning(tmp_path):
    counts = {}
    for name, framework, base in (("lightning", None, None), ("gpulayer", gl, gl.Callback)):
        with warnings.catch_warnings():
            if framework is None:
                framework = quiet_lightning()
                base = framework.Callback
            assigned = base()
            calls: list[int] = []
            assigned.on_train_epoch_end = lambda trainer, pl_module, calls=calls: calls.append(trainer.current_epoch)
            mocked = mock.Mock(spec=base)
            torch.manual_seed(0)
            model = _regressor(framework.LightningModule if name == "lightning" else gl.Module)()
            extra = {"enable_progress_bar": False} if name == "lightning" else {}
            trainer = framework.Trainer(
                accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, callbacks=[assigned, mocked],
                default_root_dir=tmp_path / name, **extra,
            )  # fmt: skip
            trainer.fit(model, DataLoader(_data(), batch_size=4))
        counts[name] = (calls, mocked.on_train_epoch_end.call_count, mocked.on_train_batch_end.call_count)
    assert counts["gpulayer"] == counts["lightning"] == ([0, 1], 2, 12)


# Lightning warns here too: a val_dataloader without a validation_step (test_user_bug_warnings.py checks it).
@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_a_validation_step_set_to_none_switches_validation_off(tmp_path):
    def no_validation(model):
        model.validation_step = None

    (theirs, _), (ours, _) = _both(tmp_path, no_validation, max_epochs=2)
    assert ours.global_step == theirs.global_step == 12
    assert "val_loss" not in ours.callback_metrics and "val_loss" not in theirs.callback_metrics


def test_setup_gets_the_entry_point_by_keyword_and_freeze_returns_the_module(tmp_path):
    (_, their_model), (_, our_model) = _both(tmp_path, max_epochs=1)
    assert our_model.stages == their_model.stages == [(True, "fit")]
    assert our_model.freeze() is our_model and our_model.unfreeze() is our_model
    with warnings.catch_warnings():
        pl = quiet_lightning()
        assert pl.Trainer(fast_dev_run=True).fast_dev_run is gl.Trainer(fast_dev_run=True, logger=False).fast_dev_run


def test_ddp_on_one_process_reads_through_a_distributed_sampler_as_lightning_does(tmp_path):
    (_, their_model), (ours, our_model) = _both(tmp_path, max_epochs=2, strategy="ddp", devices=1)
    # GPUlayer's is a DistributedSampler that can resume inside its epoch's order (GlobalOrderSampler).
    assert isinstance(ours.train_dataloader.sampler, DistributedSampler)
    for name, tensor in their_model.state_dict().items():
        torch.testing.assert_close(our_model.state_dict()[name], tensor, rtol=0, atol=0)


class _LengthUnknown(IterableDataset):
    def __iter__(self):
        generator = torch.Generator().manual_seed(1)
        while True:
            yield torch.randn(4, generator=generator), torch.randn(1, generator=generator)

    def __len__(self):
        raise NotImplementedError("a stream has no length")


def test_a_loader_whose_len_raises_not_implemented_is_unsized(tmp_path):
    for framework, base in ((gl, gl.Module),):
        torch.manual_seed(0)
        trainer = framework.Trainer(accelerator="cpu", max_steps=5, logger=False, default_root_dir=tmp_path)
        trainer.fit(_regressor(base)(), DataLoader(_LengthUnknown(), batch_size=4))
        assert trainer.global_step == 5 and trainer.num_training_batches == float("inf")


class _Stateful(gl.Callback):
    def state_dict(self):
        return {"seen": 1}


def test_two_stateful_callbacks_under_one_key_are_refused_at_construction(tmp_path):
    with warnings.catch_warnings():
        pl = quiet_lightning()

        class LightningStateful(pl.Callback):
            def state_dict(self):
                return {"seen": 1}

        with pytest.raises(RuntimeError):
            pl.Trainer(callbacks=[LightningStateful(), LightningStateful()], logger=False)
    with pytest.raises(RuntimeError, match=r"callbacks: _Stateful and _Stateful have state under one state_key"):
        gl.Trainer(callbacks=[_Stateful(), _Stateful()], default_root_dir=tmp_path)
    assert not any(tmp_path.iterdir())


class _Sized(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.ones(4), torch.ones(1)


@pytest.mark.multiprocess
def test_a_script_a_test_starts_may_start_its_own_ranks(tmp_path):
    # The script inherits PYTEST_CURRENT_TEST from this test; it is not pytest, so devices=2 starts its two ranks.
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            import gpulayer.trainer as gl

            class Tiny(gl.Module):
                def __init__(self):
                    super().__init__()
                    self.layer = torch.nn.Linear(2, 1)

                def training_step(self, batch, batch_idx):
                    return self.layer(batch[0]).pow(2).mean()

                def configure_optimizers(self):
                    return torch.optim.SGD(self.parameters(), lr=0.1)

            if __name__ == "__main__":
                trainer = gl.Trainer(accelerator="cpu", devices=2, max_steps=2, logger=False, enable_checkpointing=False)
                trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2))
                print(f"rank {trainer.global_rank} trained {trainer.global_step} steps of {trainer.world_size} ranks")
            """
        )
    )
    assert "PYTEST_CURRENT_TEST" in os.environ
    finished = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "trained 2 steps of 2 ranks" in finished.stdout


def _record_ckpt_path(trainer):
    trainer.lightning_module.record("ckpt_path", os.path.basename(trainer.ckpt_path or ""))


@pytest.mark.parametrize(
    ("max_epochs", "stages"),
    [(2, ("fit", "test", "test")), (1, ("fit", "test", "predict"))],
    ids=["two tests after fit", "test then predict"],
)
def test_the_default_checkpoint_is_best_again_after_an_evaluation_restored_it(differential, max_epochs, stages):
    # Each evaluation loads "best" and restores the callbacks from it: the state saved in the file must name the file.
    differential(
        trainer={"max_epochs": max_epochs, "enable_checkpointing": True},
        stages=stages,
        stage_arguments={label: {"ckpt_path": "best"} for label in ("test", "test#2", "predict")},
        callback={"on_test_start": lambda self, trainer, pl_module: _record_ckpt_path(trainer)},
        after=_record_ckpt_path,
    )


@pytest.mark.parametrize(("max_epochs", "refused"), [(1, True), (2, False)])
def test_resuming_past_max_epochs_is_refused_as_in_lightning(tmp_path, max_epochs, refused):
    outcomes = {}
    for name in ("lightning", "gpulayer"):
        with warnings.catch_warnings():
            framework = quiet_lightning() if name == "lightning" else gl
            base = framework.LightningModule if name == "lightning" else gl.Module
            extra = {"enable_progress_bar": False} if name == "lightning" else {}
            options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, **extra)
            first = framework.Trainer(max_epochs=2, default_root_dir=tmp_path / name, **options)
            first.fit(_regressor(base)(), DataLoader(_data(), batch_size=4))
            first.save_checkpoint(tmp_path / f"{name}.ckpt")
            again = framework.Trainer(max_epochs=max_epochs, default_root_dir=tmp_path / name, **options)
            try:
                again.fit(_regressor(base)(), DataLoader(_data(), batch_size=4), ckpt_path=tmp_path / f"{name}.ckpt")
                outcomes[name] = ("trained on", again.global_step)
            except Exception as error:  # Lightning's MisconfigurationException, GPUlayer's ValueError
                outcomes[name] = ("refused", "current_epoch=2" in str(error))
    assert outcomes["gpulayer"] == outcomes["lightning"] == (("refused", True) if refused else ("trained on", 12))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # torch's, from 2.10: this test calls it
def test_a_fitted_module_can_be_scripted_as_in_lightning(tmp_path):
    (_, their_model), (_, our_model) = _both(tmp_path, max_epochs=1)
    sample = torch.ones(2, 4)
    ours, theirs = torch.jit.script(our_model)(sample), torch.jit.script(their_model)(sample)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def _torchscript_warnings(model, path, method):
    """``model.to_torchscript(path, method=method)``'s warnings, each one shown: (category, words) of torch's
    deprecations of TorchScript, and of every other warning but Lightning's deprecation of ``to_torchscript``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.to_torchscript(path, method=method)
    return [
        (warning.category.__name__, str(warning.message))
        for warning in caught
        if not str(warning.message).startswith("`LightningModule.to_torchscript` has been deprecated")
    ]


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated")  # torch's, from 2.10: this test calls it
@pytest.mark.parametrize("method", ["script", "trace"])
def test_to_torchscript_gives_what_lightnings_gives_and_warns_torchs_deprecation_once(tmp_path, method):
    (_, their_model), (_, our_model) = _both(tmp_path, max_epochs=1)
    sample = torch.ones(2, 4)
    outputs, warned = [], {}
    for model, name in ((our_model, "ours"), (their_model, "theirs")):
        model.example_input_array = sample
        warned[name] = _torchscript_warnings(model, tmp_path / f"{name}.pt", method)
        outputs.append(torch.jit.load(tmp_path / f"{name}.pt")(sample))
        assert model.training  # put back in train mode
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    # Whatever the running torch says of TorchScript (nothing before 2.10; a DeprecationWarning, then a
    # FutureWarning, for each function called and each method traced), GPUlayer passes on its first word, once.
    assert warned["ours"] == warned["theirs"][:1]
    with pytest.raises(ValueError, match=r"to_torchscript\(method='compile'\)"):
        our_model.to_torchscript(method="compile")


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated")  # torch's, from 2.10: this test calls it
@pytest.mark.parametrize("method", ["script", "trace"])
def test_a_module_no_trainer_ever_held_exports_to_torchscript_as_in_lightning(tmp_path, method):
    sample = torch.ones(2, 4)
    outputs = []
    for base, name in ((gl.Module, "ours"), (quiet_lightning().LightningModule, "theirs")):
        torch.manual_seed(0)
        model = _regressor(base)()
        model.example_input_array = sample
        _torchscript_warnings(model, tmp_path / f"{name}.pt", method)
        outputs.append(torch.jit.load(tmp_path / f"{name}.pt")(sample))
        with pytest.raises(RuntimeError, match=r"is not attached to a `?Trainer"):  # and after it, as before
            _ = model.trainer
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_to_onnx_needs_a_sample_input(tmp_path):
    # (The export itself is torch.onnx.export's, which needs the onnx package this repository does not install.)
    with pytest.raises(ValueError, match="to_onnx: pass a sample input or set the module's example_input_array"):
        _regressor(gl.Module)().to_onnx(tmp_path / "model.onnx")
    assert not any(tmp_path.iterdir())


def _worker_states(framework, base, root) -> list:
    """Whether each loader's persistent workers are alive ("alive"), or it has no iterator ("none"), at the points
    of a fit and a validate."""
    data = TensorDataset(torch.ones(16, 2))
    train, val = (DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True) for _ in range(2))

    def state(loader):
        iterator = getattr(loader, "_iterator", None)
        return "none" if iterator is None else ("shut" if iterator._shutdown else "alive")

    class Watched(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            self.layer(batch[0])

        def on_validation_epoch_end(self):
            self.seen.append(("validation end", state(train), state(val)))

        def on_fit_end(self):
            self.seen.append(("fit end", state(train), state(val)))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Watched()
    extra = {"enable_progress_bar": False, "enable_model_summary": False} if base is not gl.Module else {}
    trainer = framework.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
        default_root_dir=root, **extra,
    )  # fmt: skip
    trainer.fit(model, train, val)
    trainer.validate(model, val, verbose=False)
    return [*model.seen, ("after validate", state(train), state(val))]


def test_persistent_workers_stop_when_the_stage_ends_as_in_lightning(tmp_path):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _worker_states(pl, pl.LightningModule, tmp_path / "lightning")
    ours = _worker_states(gl, gl.Module, tmp_path / "gpulayer")
    assert ours == theirs
    assert ours[1:] == [
        ("validation end", "alive", "alive"),
        ("fit end", "none", "none"),
        ("validation end", "none", "alive"),
        ("after validate", "none", "none"),
    ]


def _dropout_fit(framework, module_base, root, seed):
    """``seed_everything``, a model built (drawing from the RNG), then a DDP fit on one process whose steps draw
    dropout masks: Lightning's DDP seeds again as it sets up, so the masks follow the seed, not the model's build."""
    base = _regressor(module_base)

    class Dropping(base):
        def training_step(self, batch, batch_idx):
            x = torch.nn.functional.dropout(batch[0], p=0.5, training=True)
            return torch.nn.functional.mse_loss(self.layer(x), batch[1])

    framework.seed_everything(seed)
    model = Dropping()
    torch.rand(7)  # the script draws more before fit
    extra = {"enable_progress_bar": False} if framework is not gl else {}
    trainer = framework.Trainer(
        accelerator="cpu", strategy="ddp", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        default_root_dir=root, **extra,
    )  # fmt: skip
    trainer.fit(model, DataLoader(_data(), batch_size=4))
    return model


def test_ddp_seeds_again_as_it_sets_up_as_lightning_does(tmp_path):
    ours = _dropout_fit(gl, gl.Module, tmp_path / "gpulayer", seed=5)
    environment = dict(os.environ)
    try:
        with warnings.catch_warnings():
            pl = quiet_lightning()
            theirs = _dropout_fit(pl, pl.LightningModule, tmp_path / "lightning", seed=5)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)
    for name, tensor in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], tensor, rtol=0, atol=0)
