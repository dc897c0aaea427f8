"""metrics.csv and hparams.yaml from a whole run: the same files as Lightning 2.6's default CSV logger writes."""

import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gpulayer


def _module_class(base):
    class Logged(base):
        def __init__(self, width=4, label="demo"):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
            self.log("a_step_only", float(batch_idx))
            return loss

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("val_loss", loss)
            self.log("val_step_metric", loss * 2, on_step=True, on_epoch=False)

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def on_train_epoch_end(self):
            self.log("custom_epoch_metric", 42.0)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Logged


def _loaders(val_loaders):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(20, 4, generator=generator), torch.randn(20, 1, generator=generator))
    val = [DataLoader(data, batch_size=8) for _ in range(val_loaders)]
    return DataLoader(data, batch_size=4), val[0] if val_loaders == 1 else val


def _run(framework, root, arguments, val_loaders, test):
    torch.manual_seed(0)
    model = _module_class(framework.LightningModule if framework is not gpulayer else gpulayer.Module)()
    train, val = _loaders(val_loaders)
    options = dict(accelerator="cpu", max_epochs=2, num_sanity_val_steps=0, default_root_dir=root) | arguments
    if framework is gpulayer:
        trainer = gpulayer.Trainer(**options)
    else:
        # Lightning's default logger is its CSVLogger only where tensorboard is not installed: say it outright.
        logger = framework.loggers.CSVLogger(root)
        trainer = framework.Trainer(enable_progress_bar=False, enable_model_summary=False, logger=logger, **options)
    trainer.fit(model, train, val)
    if test:
        trainer.test(model, train, verbose=False)
    version = root / "lightning_logs" / "version_0"
    return {path.name: path.read_bytes() for path in sorted(version.iterdir()) if path.is_file()}, sorted(
        p.name for p in (version / "checkpoints").iterdir()
    )


@pytest.mark.parametrize(
    ("arguments", "val_loaders", "test"),
    [
        (dict(log_every_n_steps=2), 1, False),
        (dict(log_every_n_steps=1, accumulate_grad_batches=2), 1, False),
        (dict(log_every_n_steps=0), 1, True),
        (dict(log_every_n_steps=3, val_check_interval=0.5), 1, True),
        (dict(log_every_n_steps=2), 2, False),
        (dict(log_every_n_steps=50, max_steps=7, max_epochs=-1), 1, False),
        (dict(log_every_n_steps=2, enable_autolog_hparams=False), 1, False),  # no hparams.yaml
    ],
    ids=str,
)
def test_metrics_csv_hparams_yaml_and_checkpoint_names_match_lightnings(tmp_path, arguments, val_loaders, test):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import lightning.pytorch as pl

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        theirs = _run(pl, tmp_path / "lightning", arguments, val_loaders, test)
    ours = _run(gpulayer, tmp_path / "gpulayer", arguments, val_loaders, test)
    autolog = arguments.get("enable_autolog_hparams", True)
    assert ours[0].keys() == theirs[0].keys() == ({"hparams.yaml", "metrics.csv"} if autolog else {"metrics.csv"})
    assert ours[0].get("hparams.yaml") == theirs[0].get("hparams.yaml")
    assert ours[0]["metrics.csv"].decode().splitlines() == theirs[0]["metrics.csv"].decode().splitlines()
    assert ours[1] == theirs[1]


def test_logger_false_writes_no_log_folder(tmp_path):
    train, val = _loaders(1)
    trainer = gpulayer.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, default_root_dir=tmp_path
    )
    trainer.fit(_module_class(gpulayer.Module)(), train, val)
    assert not (tmp_path / "lightning_logs").exists() and trainer.log_dir == str(tmp_path)


def test_versions_count_up_like_lightnings(tmp_path):
    train, _ = _loaders(1)
    for expected in ("version_0", "version_1"):
        trainer = gpulayer.Trainer(
            accelerator="cpu", max_epochs=1, enable_checkpointing=False, default_root_dir=tmp_path
        )
        trainer.fit(_module_class(gpulayer.Module)(), train)
        assert trainer.log_dir == str(tmp_path / "lightning_logs" / expected)


def _fit_with_loggers(framework, root, names):
    torch.manual_seed(0)
    train, val = _loaders(1)
    is_ours = framework is gpulayer
    make = gpulayer.CSVLogger if is_ours else framework.loggers.CSVLogger
    loggers = [make(root, name=name) for name in names]
    options = dict(accelerator="cpu", max_epochs=2, log_every_n_steps=2, logger=loggers, default_root_dir=root)
    extra = {} if is_ours else dict(enable_progress_bar=False, enable_model_summary=False)
    trainer = (gpulayer.Trainer if is_ours else framework.Trainer)(**options, **extra)
    trainer.fit(_module_class(gpulayer.Module if is_ours else framework.LightningModule)(), train, val)
    files = {
        str(path.relative_to(root)): path.read_bytes() if path.suffix != ".ckpt" else b""
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }
    return files, [logger.log_dir for logger in trainer.loggers], trainer.logger.log_dir, trainer.log_dir


@pytest.mark.parametrize("names", [["first", "second"], ["only"]])
def test_a_list_of_csv_loggers_writes_what_lightnings_writes(tmp_path, names):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import lightning.pytorch as pl

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        theirs = _fit_with_loggers(pl, tmp_path / "lightning", names)
    ours = _fit_with_loggers(gpulayer, tmp_path / "gpulayer", names)
    assert ours[0] == theirs[0]  # every file, checkpoints by name
    relative = [
        [path.split(str(tmp_path / framework))[1] for path in result[1]]
        for framework, result in (("gpulayer", ours), ("lightning", theirs))
    ]
    assert relative[0] == relative[1] == [f"/{name}/version_0" for name in names]
    assert ours[2] == ours[3] == ours[1][0]  # trainer.logger and log_dir are the first logger's


def test_an_empty_list_of_loggers_is_no_logger(tmp_path):
    train, _ = _loaders(1)
    trainer = gpulayer.Trainer(
        accelerator="cpu", max_epochs=1, logger=[], enable_checkpointing=False, default_root_dir=tmp_path
    )
    trainer.fit(_module_class(gpulayer.Module)(), train)
    assert (trainer.loggers, trainer.logger) == ([], None) and not any(tmp_path.iterdir())
