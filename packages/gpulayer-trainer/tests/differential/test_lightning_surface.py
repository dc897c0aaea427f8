"""The attributes Lightning scripts and tests reach for, compared with Lightning 2.6: the Trainer's loaders, batch
counts and callbacks, ``init_module``, ``PL_TRAINER_*`` defaults; the Module's loggers, ``all_gather`` and
checkpoint keys; the DataModule's ``from_datasets``, ``__str__`` and ``load_from_checkpoint``."""

import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import clean_environment, run_command

from .conftest import line_fitter, quiet_lightning


def _loader_shape(loaders):
    if loaders is None:
        return None
    if isinstance(loaders, DataLoader):
        return ("DataLoader", len(loaders.dataset))
    return [_loader_shape(loader) for loader in loaders]


def _surface(trainer) -> dict:
    return {
        "enable_validation": trainer.enable_validation,
        "num_sanity_val_batches": trainer.num_sanity_val_batches,
        "num_val_batches": trainer.num_val_batches,
        "train_dataloader": _loader_shape(trainer.train_dataloader),
        "val_dataloaders": _loader_shape(trainer.val_dataloaders),
        "test_dataloaders": _loader_shape(trainer.test_dataloaders),
        "predict_dataloaders": _loader_shape(trainer.predict_dataloaders),
        "interrupted": trainer.interrupted,
        "module_logger": trainer.lightning_module.logger,
        "module_loggers": trainer.lightning_module.loggers,
    }


def _record_surface(hook):
    def body(self, trainer, pl_module, *args, **kwargs):
        pl_module.record(hook, _surface(trainer))

    return body


@pytest.mark.parametrize("val_sizes", [(6,), (6, 3)], ids=["one val loader", "two val loaders"])
def test_the_trainers_loaders_and_counts_as_lightning_gives_them(differential, val_sizes):
    differential(
        trainer={"max_epochs": 1, "num_sanity_val_steps": 1},
        val_sizes=val_sizes,
        stages=("fit", "validate", "test", "predict"),
        callback={hook: _record_surface(hook) for hook in ("on_train_start", "on_validation_start", "on_test_start")},
        after=lambda trainer: trainer.lightning_module.record("after", _surface(trainer)),
    )


def test_init_module_profiler_accelerator_and_checkpoint_keys(tmp_path):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = pl.Trainer(precision="bf16-true", logger=False, default_root_dir=tmp_path)
        with theirs.init_module():
            their_layer = torch.nn.Linear(2, 2)
    ours = gl.Trainer(precision="bf16-true", logger=False, default_root_dir=tmp_path)
    with ours.init_module():
        our_layer = torch.nn.Linear(2, 2)
    assert (our_layer.weight.dtype, our_layer.weight.device) == (their_layer.weight.dtype, their_layer.weight.device)
    assert gl.Trainer(logger=False).early_stopping_callback is None
    assert gl.Module().strict_loading is pl.LightningModule().strict_loading is True
    our_trainer = gl.Trainer(accelerator="cpu", logger=False)
    their_trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    with our_trainer.profiler.profile("step") as name, their_trainer.profiler.profile("step") as their_name:
        assert name == their_name == "step"
    assert our_trainer.progress_bar_callback is their_trainer.progress_bar_callback is None
    assert gl.Module().on_gpu is pl.LightningModule().on_gpu is False
    ours, theirs = our_trainer.accelerator, their_trainer.accelerator
    assert type(ours).__name__ == type(theirs).__name__ == "CPUAccelerator"
    assert (ours.name(), ours.is_available(), ours.auto_device_count()) == (
        theirs.name(),
        theirs.is_available(),
        theirs.auto_device_count(),
    )
    for options in ({"accelerator": "cpu"}, {"accelerator": "cpu", "devices": 1, "strategy": "ddp"}):
        assert gl.Trainer(logger=False, **options).device_ids == pl.Trainer(logger=False, **options).device_ids
    for name in ("CHECKPOINT_HYPER_PARAMS_KEY", "CHECKPOINT_HYPER_PARAMS_NAME", "CHECKPOINT_HYPER_PARAMS_TYPE"):
        assert getattr(gl.Module, name) == getattr(pl.LightningModule, name)
        assert getattr(gl.DataModule, name) == getattr(pl.LightningDataModule, name)


def test_pl_trainer_variables_give_defaults_and_passed_arguments_win(monkeypatch, tmp_path):
    monkeypatch.setenv("PL_TRAINER_MAX_EPOCHS", "3")
    monkeypatch.setenv("PL_TRAINER_LOG_EVERY_N_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_ACCELERATOR", "cpu")
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = pl.Trainer(log_every_n_steps=5, logger=False, default_root_dir=tmp_path)
    ours = gl.Trainer(log_every_n_steps=5, logger=False, default_root_dir=tmp_path)
    assert (ours.max_epochs, ours.log_every_n_steps) == (theirs.max_epochs, theirs.log_every_n_steps) == (3, 5)


def test_all_gather_on_one_process_hands_the_data_back_as_lightning_does(tmp_path):
    module = gl.Module()
    trainer = gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path)
    module.trainer = trainer
    data = {"loss": torch.tensor(2.0), "counts": [torch.ones(3)]}
    gathered = module.all_gather(data)
    assert torch.equal(gathered["loss"], data["loss"]) and torch.equal(gathered["counts"][0], data["counts"][0])
    assert module.all_gather(3).item() == 3
    module.example_input_array = torch.zeros(1, 4)
    assert module.example_input_array.shape == (1, 4)


def _datamodule_class(base):
    class Digits(base):
        def __init__(self, batch_size: int = 4, note: str = "x"):
            super().__init__()
            self.save_hyperparameters()
            self.batches_seen = 0

        def state_dict(self):
            return {"batches_seen": self.batches_seen}

        def load_state_dict(self, state):
            self.batches_seen = state["batches_seen"]

    return Digits


def _datasets():
    generator = torch.Generator().manual_seed(3)
    train = TensorDataset(torch.randn(20, 4, generator=generator), torch.randn(20, 2, generator=generator))
    return train, [
        TensorDataset(torch.randn(6, 4), torch.randn(6, 2)),
        TensorDataset(torch.randn(3, 4), torch.randn(3, 2)),
    ]


def test_from_datasets_and_str_match_lightnings():
    train, val = _datasets()
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _datamodule_class(pl.LightningDataModule).from_datasets(train, val, batch_size=5, note="y")
    ours = _datamodule_class(gl.DataModule).from_datasets(train, val, batch_size=5, note="y")
    assert str(ours) == str(theirs)
    assert dict(ours.hparams) == dict(theirs.hparams) == {"batch_size": 5, "note": "y"}
    assert _loader_shape(ours.train_dataloader()) == _loader_shape(theirs.train_dataloader())
    assert _loader_shape(ours.val_dataloader()) == _loader_shape(theirs.val_dataloader())


class _Regressor(gl.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        self.trainer.datamodule.batches_seen += 1
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_datamodule_fits_from_datasets_and_loads_back_from_the_checkpoint(tmp_path):
    train, _ = _datasets()
    datamodule = _datamodule_class(gl.DataModule).from_datasets(train, batch_size=5, note="z")
    trainer = gl.Trainer(accelerator="cpu", max_epochs=2, logger=False, default_root_dir=tmp_path)
    with warnings.catch_warnings():  # from_datasets pins memory, as Lightning's: torch warns that the CPU cannot
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        trainer.fit(_Regressor(), datamodule)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    loaded = _datamodule_class(gl.DataModule).load_from_checkpoint(tmp_path / "run.ckpt", note="override")
    assert dict(loaded.hparams) == {"batch_size": 5, "note": "override"}
    assert loaded.batches_seen == datamodule.batches_seen == 8


def test_precision_plugin_scaler_sampler_arguments_model_and_print_as_in_lightning(tmp_path, capsys):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        cases = [{}, {"strategy": "ddp", "devices": 1}, {"precision": "bf16-mixed"}]
        theirs = [pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, **kw) for kw in cases]
    ours = [gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path, **kw) for kw in cases]
    for our, their in zip(ours, theirs, strict=True):
        assert our.distributed_sampler_kwargs == their.distributed_sampler_kwargs
        assert our.scaler is their.scaler is None
        assert our.precision_plugin is our.strategy.precision_plugin
    assert ours[1].distributed_sampler_kwargs == {"num_replicas": 1, "rank": 0}
    assert ours[0].model is theirs[0].model is None
    ours[0].print("shown", end="!")
    theirs[0].print("also", end="!")
    assert capsys.readouterr().out == "shown!also!"


def _model_seen_by_callbacks(framework, root) -> list:
    """``trainer.model`` at ``on_train_start`` (its type, whether it is the module) and at ``on_train_end``."""
    seen = []

    class Records(framework.Callback):
        def on_train_start(self, trainer, pl_module):
            seen.extend([type(trainer.model).__name__, trainer.model is pl_module])

        def on_train_end(self, trainer, pl_module):
            seen.append(trainer.model is pl_module)

    base = gl.Module if framework is gl else framework.LightningModule
    extra = {} if framework is gl else {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = framework.Trainer(
        accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, callbacks=[Records()],
        default_root_dir=root, **extra,
    )  # fmt: skip
    trainer.fit(line_fitter(base)(), DataLoader(TensorDataset(torch.ones(8, 2), torch.ones(8, 1)), batch_size=4))
    return seen


def test_trainer_model_in_one_process_is_the_module_as_in_lightning(tmp_path):
    # Under DDP on several ranks it is DDP's wrapper in both (trainer.strategy.model, tests/ddp); Lightning also
    # wraps a single DDP process, GPUlayer does not (the porting guide says so).
    with warnings.catch_warnings():
        theirs = _model_seen_by_callbacks(quiet_lightning(), tmp_path / "lightning")
    assert _model_seen_by_callbacks(gl, tmp_path / "gpulayer") == theirs == ["LineFitter", True, True]


def test_strategy_remove_checkpoint_deletes_a_file_or_folder_as_in_lightning(tmp_path):
    with warnings.catch_warnings():
        theirs = quiet_lightning().Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).strategy
    ours = gl.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path).strategy
    for name, strategy in (("lightning", theirs), ("gpulayer", ours)):
        file, folder = tmp_path / f"{name}.ckpt", tmp_path / f"{name}-sharded"
        file.write_bytes(b"0")
        (folder / "shard").mkdir(parents=True)
        for path in (file, folder, tmp_path / f"{name}-never-written.ckpt"):
            strategy.remove_checkpoint(path)
        assert not file.exists() and not folder.exists()


def test_rank_zero_only_runs_on_rank_zero_alone_and_reads_the_rank_as_lightnings_does():
    """``gpulayer.trainer.rank_zero_only`` against ``lightning.pytorch.utilities.rank_zero_only``: the wrapped call
    runs where ``rank`` is 0 and returns ``default`` elsewhere; ``rank`` starts from the launcher's environment."""
    from lightning.pytorch.utilities import rank_zero_only as theirs

    from gpulayer.trainer import rank_zero_only as ours

    for decorator in (ours, theirs):
        saved, calls = decorator.rank, []

        def write(value, calls=calls):
            """Writes."""
            calls.append(value)
            return "written"

        try:
            wrapped = decorator(write, default="skipped")
            decorator.rank = 0
            first = wrapped(1)
            decorator.rank = 1
            assert (first, wrapped(2), calls, wrapped.__doc__) == ("written", "skipped", [1], "Writes."), decorator
        finally:
            decorator.rank = saved
    probe = (
        "from gpulayer.trainer import rank_zero_only as g; from lightning.pytorch.utilities import rank_zero_only as l;"
        "print(g.rank, l.rank)"
    )
    for environment, expected in (
        ({"LOCAL_RANK": "2"}, "2 2"),
        ({"SLURM_PROCID": "3", "RANK": "1"}, "1 1"),
        ({}, "0 0"),
    ):
        finished = run_command([sys.executable, "-c", probe], timeout=120, env=clean_environment(**environment))
        assert finished.stdout.split() == expected.split(), (environment, finished.stdout, finished.stderr)
