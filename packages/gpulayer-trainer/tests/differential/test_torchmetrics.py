"""``self.log`` and ``self.log_dict`` with torchmetrics objects (Accuracy, MeanMetric, MaxMetric, a
MetricCollection) in training, validation and test, under Lightning 2.6 and GPUlayer: the same metrics after each
stage, the same rows in ``metrics.csv``, the same returned test metrics and weights."""

import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks

torchmetrics = pytest.importorskip("torchmetrics")


def _classifier_class(base):
    class Classifier(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 3)
            self.train_accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)
            self.val_accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)
            self.mean_loss = torchmetrics.MeanMetric()
            self.max_loss = torchmetrics.MaxMetric()
            self.test_metrics = torchmetrics.MetricCollection(
                {
                    "precision": torchmetrics.Precision(task="multiclass", num_classes=3),
                    "mean": torchmetrics.MeanMetric(),
                },
                prefix="test_",
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.layer(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            self.train_accuracy(logits, y)  # forward: the batch's value is the step value
            self.log("train_acc", self.train_accuracy, on_step=True, on_epoch=True, prog_bar=True)
            self.mean_loss.update(loss)  # update only: no step value, the epoch value is its compute()
            self.log("mean_loss", self.mean_loss, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self.layer(x)
            self.val_accuracy.update(logits, y)
            self.log("val_acc", self.val_accuracy)
            self.max_loss(torch.nn.functional.cross_entropy(logits, y))
            self.log("max_val_loss", self.max_loss)

        def test_step(self, batch, batch_idx):
            x, y = batch
            logits = self.layer(x)
            self.test_metrics["precision"](logits, y)
            self.test_metrics["mean"](torch.nn.functional.cross_entropy(logits, y))
            self.log_dict(self.test_metrics)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    return Classifier


def _data(rank=0, world_size=1):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(48, 4, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x[rank::world_size], y[rank::world_size])


def _run(framework, root):
    torch.manual_seed(0)
    is_ours = framework is gl
    model = _classifier_class(gl.Module if is_ours else framework.LightningModule)()
    options = dict(
        accelerator="cpu", max_epochs=3, log_every_n_steps=2, default_root_dir=root, enable_checkpointing=False
    )
    # Lightning's default logger is its CSVLogger only where tensorboard is not installed: say it outright.
    logger = (gl if is_ours else framework.loggers).CSVLogger(root)
    extra = {} if is_ours else dict(enable_progress_bar=False, enable_model_summary=False)
    trainer = framework.Trainer(logger=logger, **options, **extra)
    loader = DataLoader(_data(), batch_size=8)
    record = {}
    trainer.fit(model, loader, loader)
    record["fit"] = {name: float(value) for name, value in trainer.callback_metrics.items()}
    record["validated"] = trainer.validate(model, loader, verbose=False)
    record["tested"] = trainer.test(model, loader, verbose=False)
    record["test_metrics"] = {name: float(value) for name, value in trainer.callback_metrics.items()}
    record["csv"] = (root / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()
    record["weights"] = {name: tensor.clone() for name, tensor in model.layer.state_dict().items()}
    record["reset"] = int(model.train_accuracy.update_count)  # Lightning resets a logged metric after the epoch
    return record


def test_torchmetrics_objects_log_as_in_lightning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import lightning.pytorch as pl

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        theirs = _run(pl, tmp_path / "lightning")
    ours = _run(gl, tmp_path / "gpulayer")
    assert set(ours["fit"]) == {
        "train_acc",
        "train_acc_step",
        "train_acc_epoch",
        "mean_loss",
        "val_acc",
        "max_val_loss",
    }
    for key in ("fit", "validated", "tested", "test_metrics", "csv", "reset"):
        assert ours[key] == theirs[key], key
    for name, tensor in theirs["weights"].items():
        torch.testing.assert_close(ours["weights"][name], tensor, rtol=0, atol=0)


def _fit_saving_mid_epoch(framework, root, max_epochs=2, ckpt_path=None):
    """Fit with two metrics' states made persistent, saving a checkpoint at batch 2 of epoch 1; returns the saved
    ``state_dict``, the final ``callback_metrics`` and weights."""
    is_ours = framework is gl
    base, callback_base = (gl.Module, gl.Callback) if is_ours else (framework.LightningModule, framework.Callback)
    path = root / "mid.ckpt"

    class SavesMidEpoch(callback_base):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.current_epoch == 1 and batch_idx == 2 and ckpt_path is None:
                trainer.save_checkpoint(path)

    torch.manual_seed(0)
    model = _classifier_class(base)()
    model.train_accuracy.persistent(True)
    model.mean_loss.persistent(True)
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=root)
    options |= {} if is_ours else dict(enable_progress_bar=False, enable_model_summary=False)
    trainer = framework.Trainer(max_epochs=max_epochs, callbacks=[SavesMidEpoch()], **options)
    loader = DataLoader(_data(), batch_size=8)
    trainer.fit(model, loader, loader, ckpt_path=ckpt_path)
    return {
        "saved": {name: tensor.tolist() for name, tensor in torch.load(path, weights_only=False)["state_dict"].items()},
        "metrics": {name: float(value) for name, value in trainer.callback_metrics.items()},
        "weights": model.layer.weight.tolist(),
    }


def test_metric_states_are_checkpointed_as_in_lightning_and_a_resumed_epoch_computes_over_all_its_batches(tmp_path):
    # Lightning 2.6 keeps no logged-metric state in its loops' checkpoint state: a metric's states are in the file
    # when the user makes them persistent (torchmetrics' are not by default), through the module's state_dict.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import lightning.pytorch as pl

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        theirs = _fit_saving_mid_epoch(pl, tmp_path / "lightning")
    ours = _fit_saving_mid_epoch(gl, tmp_path / "gpulayer")
    assert {"train_accuracy.tp", "mean_loss.mean_value"} <= set(ours["saved"])
    assert not [name for name in ours["saved"] if name.startswith(("val_accuracy.", "max_loss."))]
    assert ours["saved"] == theirs["saved"]
    # GPUlayer resumes mid-epoch exactly (Lightning restarts the epoch's data): the restored states count the
    # batches before the save, so the resumed epoch's values are those of an unbroken run.
    unbroken = _fit_saving_mid_epoch(gl, tmp_path / "unbroken")
    resumed = _fit_saving_mid_epoch(gl, tmp_path / "gpulayer", ckpt_path=tmp_path / "gpulayer" / "mid.ckpt")
    assert resumed == unbroken


class _Unattached(gl.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 3)

    def training_step(self, batch, batch_idx):
        metric = torchmetrics.MeanMetric()
        metric(self.layer(batch[0]).mean())
        self.log("mean", metric)
        return self.layer(batch[0]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_metric_that_is_not_an_attribute_of_the_module_is_refused_naming_the_fix(tmp_path):
    trainer = gl.Trainer(accelerator="cpu", max_steps=1, logger=False, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match=r"self.log\('mean', <MeanMetric>\): the metric is not an attribute"):
        trainer.fit(_Unattached(), DataLoader(_data(), batch_size=8))


def _fit_on_ranks(runtime, world_size):
    torch.manual_seed(0)
    model = _classifier_class(gl.Module)()
    trainer = gl.Trainer(
        accelerator="cpu",
        devices=world_size,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,  # each rank gets its own half below, in order
    )
    loader = DataLoader(_data(runtime.global_rank if runtime else 0, world_size), batch_size=8 // world_size)
    trainer.fit(model, loader, loader)
    return {name: float(value) for name, value in trainer.callback_metrics.items() if "step" not in name}


@pytest.mark.multiprocess
def test_on_two_ranks_each_metric_computes_over_both_ranks_data():
    # Each rank sees every other sample in batches of half the size, so the two train as one process with whole
    # batches does: the epoch values computed over both ranks (the metrics sync themselves in compute()) are that
    # process's, and no rank hangs.
    alone = _fit_on_ranks(None, 1)
    first, second = run_ranks(_fit_on_ranks, 2, world_size=2, timeout=120)
    assert first == second
    # (max_val_loss is a max over per-batch losses, and the ranks' batches are half as big: it is only compared
    # between the ranks, above.)
    for name in ("train_acc_epoch", "mean_loss", "val_acc"):
        assert first[name] == pytest.approx(alone[name], abs=1e-6), name


def test_a_metric_made_in_a_later_stages_setup_is_found(differential):
    """Lightning forgets the names of the module's Metric attributes at each teardown: a Metric made in
    ``setup("test")`` after a fit that logged another Metric is found by ``self.log`` in ``test``."""

    def setup(self, stage):
        if stage == "fit":
            self.fit_mean = torchmetrics.MeanMetric()
        else:
            self.test_mean = torchmetrics.MeanMetric()

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.fit_mean(loss)
        self.log("fit_mean", self.fit_mean, on_epoch=True)
        return loss

    def test_step(self, batch, batch_idx):
        self.test_mean(self.loss(batch))
        self.log("test_mean", self.test_mean)

    both = differential(
        stages=("fit", "test"), module={"setup": setup, "training_step": training_step, "test_step": test_step}
    )
    assert "test_mean" in both.lightning.callback_metrics["test"]
