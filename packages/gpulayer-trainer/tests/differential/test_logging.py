"""self.log: on_step/on_epoch, forked names, reduce_fx, batch-size weighted means, eval metrics, several val
loaders, and the validate/test return values. callback_metrics are compared after every stage and, through
the recording callback, at the end of every training batch, training epoch and validation run.
"""

import pytest
import torch


def snapshot(label, during_sanity_check=False):
    """A callback body recording callback_metrics (as floats) under ``label`` whenever the hook runs."""

    def hook(self, trainer, pl_module, *args):
        if self._recorder.sanity_checking and not during_sanity_check:
            return
        where = f"{label} (sanity check)" if self._recorder.sanity_checking else label
        pl_module.record(where, {key: float(value) for key, value in trainer.callback_metrics.items()})

    return hook


SNAPSHOTS = {
    "on_train_batch_end": snapshot("after train batch"),
    "on_train_epoch_end": snapshot("at train epoch end"),
    "on_validation_end": snapshot("after validation"),
}


def logging_everything(self, batch, batch_idx):
    loss = self.loss(batch)
    self.log("loss_step_only", loss, on_step=True, on_epoch=False)
    self.log("loss_epoch_only", loss, on_step=False, on_epoch=True)
    self.log("loss_forked", loss, on_step=True, on_epoch=True, prog_bar=True)
    self.log("default", loss)
    self.log("index_sum", float(batch_idx + 1), on_epoch=True, reduce_fx="sum")
    self.log("index_max", float(batch_idx + 1), on_epoch=True, reduce_fx="max")
    self.log("index_min", torch.tensor(batch_idx + 1.0), on_epoch=True, reduce_fx="min")
    self.log("index_mean", float(batch_idx + 1), on_step=False, on_epoch=True, reduce_fx="mean")
    self.log("index_mean_unweighted", float(batch_idx + 1), on_step=False, on_epoch=True, batch_size=1)
    self.log_dict({"dict_a": loss, "dict_b": 2 * loss}, on_step=False, on_epoch=True)
    return loss


def test_training_metrics(differential):
    """Step/epoch/forked names over 2 epochs of batches sized 4, 4, 2."""
    both = differential(trainer=dict(max_epochs=2), module={"training_step": logging_everything}, callback=SNAPSHOTS)
    metrics = both.lightning.callback_metrics["fit"]
    assert {"loss_forked", "loss_forked_step", "loss_forked_epoch"} <= set(metrics)
    assert metrics["index_mean"] == pytest.approx(1.8)  # (1*4 + 2*4 + 3*2) / 10: weighted by batch size
    assert metrics["index_mean_unweighted"] == pytest.approx(2.0)
    assert (metrics["index_sum"], metrics["index_max"], metrics["index_min"]) == (6.0, 3.0, 1.0)


@pytest.mark.parametrize("reduce_fx", ["mean", "sum", "max", "min", "avg", "MAX"])
def test_reduce_fx_over_uneven_batches(differential, reduce_fx):
    def training_step(self, batch, batch_idx):
        self.log("value", float(batch_idx + 1) ** 2, on_step=True, on_epoch=True, reduce_fx=reduce_fx)
        return self.loss(batch)

    differential(module={"training_step": training_step}, train_size=11, callback=SNAPSHOTS)


def validation_logging(self, batch, batch_idx, dataloader_idx=0):
    loss = self.loss(batch)
    self.log("val_loss", loss)
    self.log("val_forked", loss, on_step=True, on_epoch=True, prog_bar=True)
    self.log("val_max", loss, reduce_fx="max")
    self.log("val_count", float(batch_idx + 1), reduce_fx="sum")
    self.log("val_explicit_size", loss, batch_size=3)


def test_training_step_and_epoch_end_hooks_logging(differential):
    def on_train_epoch_end(self):
        self.log("epoch_end_value", float(self.current_epoch) + 0.5)

    def on_validation_epoch_end(self):
        self.log("val_epoch_end_value", float(self.current_epoch) + 0.25)

    differential(
        trainer=dict(max_epochs=3),
        module={
            "validation_step": validation_logging,
            "on_train_epoch_end": on_train_epoch_end,
            "on_validation_epoch_end": on_validation_epoch_end,
        },
        callback=SNAPSHOTS,
    )


@pytest.mark.parametrize("val_sizes", [(6,), (6, 3)], ids=["one val loader", "two val loaders"])
def test_evaluation_metrics_and_return_values(differential, val_sizes):
    """Eval metrics: epoch aggregates only ("x", "x_epoch", never "x_step"); a /dataloader_idx_N suffix with two
    loaders; values logged in on_validation_epoch_end go into every loader's dict."""

    def on_validation_epoch_end(self):
        self.log("val_epoch_end_value", 0.25)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("test_forked", self.loss(batch), on_step=True, on_epoch=True)
        self.log("test_sum", float(batch_idx + 1), reduce_fx="sum")

    both = differential(
        val_sizes=val_sizes,
        stages=("fit", "validate", "test"),
        module={
            "validation_step": validation_logging,
            "on_validation_epoch_end": on_validation_epoch_end,
            "test_step": test_step,
        },
        callback=SNAPSHOTS,
    )
    validate = both.lightning.returned["validate"]
    assert len(validate) == len(val_sizes)
    assert "val_epoch_end_value" in validate[-1]
    assert not any(key.startswith("val_forked_step") for key in both.lightning.callback_metrics["validate"])


def test_validate_and_test_return_values_without_fit(differential):
    differential(
        stages=("validate", "test"),
        module={"validation_step": validation_logging},
        val_sizes=(6, 10),
    )


@pytest.mark.parametrize("val_sizes", [(6,), (6, 3)], ids=["one val loader", "two val loaders"])
def test_callback_metrics_seen_during_the_sanity_check(differential, val_sizes):
    """What callbacks see in callback_metrics while the sanity check runs (discarded afterwards)."""

    def on_validation_epoch_end(self):
        self.log("val_epoch_end_value", 0.25)

    differential(
        trainer=dict(max_epochs=1),
        val_sizes=val_sizes,
        module={"on_validation_epoch_end": on_validation_epoch_end},
        callback={
            "on_validation_batch_end": snapshot("after validation batch", during_sanity_check=True),
            "on_validation_epoch_end": snapshot("at validation epoch end", during_sanity_check=True),
            "on_validation_end": snapshot("after validation", during_sanity_check=True),
        },
    )


def test_metrics_logged_during_sanity_check_are_discarded(differential):
    both = differential(
        trainer=dict(max_epochs=1, num_sanity_val_steps=2, limit_train_batches=0),
        module={"validation_step": validation_logging},
    )
    assert both.lightning.callback_metrics["fit"] == {}


def test_logging_with_accumulation_logs_every_batch(differential):
    """Step values are logged on every batch, stepping or not; epoch means still weight by batch size."""
    both = differential(
        trainer=dict(max_epochs=2, accumulate_grad_batches=2),
        train_size=20,
        module={"training_step": logging_everything},
        callback=SNAPSHOTS,
    )
    assert len(both.lightning.extra["after train batch"]) == 10


def test_logger_and_prog_bar_flags_choose_the_metric_dicts(differential):
    """logged_metrics holds logger=True values under forked names; progress_bar_metrics the prog_bar ones."""

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("hidden", loss, logger=False)
        self.log("shown", loss, prog_bar=True, logger=False, on_epoch=True)
        self.log("both", loss, prog_bar=True, on_step=True, on_epoch=True)
        self.log("epoch_in_bar", loss, prog_bar=True, on_step=False, on_epoch=True)
        self.log_dict({"dict_hidden": loss}, logger=False, prog_bar=True)
        self.log("synced", loss, sync_dist=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        loss = self.loss(batch)
        self.log("val_hidden", loss, logger=False)
        self.log("val_bar", loss, prog_bar=True, on_step=True)
        self.log(f"val_named_{dataloader_idx}", loss, add_dataloader_idx=False)

    differential(
        module={"training_step": training_step, "validation_step": validation_step},
        val_sizes=(6, 3),
        stages=("fit", "validate"),
        callback=SNAPSHOTS,
    )


def test_logging_from_optimization_hooks(differential):
    """Hooks inside the optimizer step log with training_step's defaults (on_step=True, on_epoch=False)."""

    def on_before_backward(self, loss):
        self.log("before_backward", loss)

    def on_after_backward(self):
        self.log("after_backward", 1.0, on_epoch=True, reduce_fx="sum")

    def on_before_optimizer_step(self, optimizer):
        self.log("before_optimizer_step", optimizer.param_groups[0]["lr"], on_epoch=True)

    def on_train_batch_start(self, batch, batch_idx):
        self.log("batch_start", float(batch_idx), on_epoch=True, reduce_fx="max")

    def on_train_epoch_start(self):
        self.log("epoch_start", float(self.current_epoch))

    differential(
        trainer=dict(max_epochs=2, accumulate_grad_batches=2),
        module={
            "on_before_backward": on_before_backward,
            "on_after_backward": on_after_backward,
            "on_before_optimizer_step": on_before_optimizer_step,
            "on_train_batch_start": on_train_batch_start,
            "on_train_epoch_start": on_train_epoch_start,
        },
        callback=SNAPSHOTS,
    )


def test_plateau_scheduler_monitoring_a_suffixed_validation_metric(differential):
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    def configure_optimizers(module):
        optimizer = module.sgd()
        plateau = ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": plateau, "monitor": "val_loss/dataloader_idx_1"}

    differential(trainer=dict(max_epochs=3), val_sizes=(6, 3), configure_optimizers=configure_optimizers)


def test_logging_integers_and_integer_tensors(differential):
    """Python ints become float tensors; integer tensors are converted to float (Lightning warns)."""

    def training_step(self, batch, batch_idx):
        self.log("python_int", batch_idx + 1, on_epoch=True)
        self.log("int_tensor", torch.tensor(batch_idx + 1), on_epoch=True, reduce_fx="sum")
        self.log("bool_tensor", torch.tensor(batch_idx > 0), on_epoch=True)
        return self.loss(batch)

    differential(module={"training_step": training_step}, documented_warning=True, callback=SNAPSHOTS)


def test_logging_python_bools(differential):
    """A Python bool is a number to Lightning: True logs 1.0, False 0.0, and the epoch mean is their share."""

    def training_step(self, batch, batch_idx):
        self.log("flag", True)
        self.log("first_batch", batch_idx == 0, on_step=True, on_epoch=True, prog_bar=True)
        return self.loss(batch)

    differential(module={"training_step": training_step}, callback=SNAPSHOTS)


def _callback_logging(hook, make_values, **options):
    """A callback body for ``hook`` that logs with the callback's own ``self.log`` (``self.log_dict`` for a dict)."""

    def body(self, trainer, pl_module, *args):
        values = make_values(trainer)
        if isinstance(values, dict):
            self.log_dict(values, **options)
        else:
            self.log(f"cb_{hook}", values, **options)

    return body


def test_callbacks_log_through_self_log_with_each_hooks_defaults(differential):
    """Lightning sets every callback's ``log`` and ``log_dict`` to the module's at each entry point (those from
    ``configure_callbacks`` too): a callback's ``self.log`` records under its running hook, with that hook's default
    on_step/on_epoch, in fit and in test."""
    logs = _callback_logging
    callback = {
        "on_train_epoch_start": logs("on_train_epoch_start", lambda t: {"cb_dict_a": t.current_epoch + 1.0}),
        "on_train_batch_end": logs("on_train_batch_end", lambda t: float(t.global_step), prog_bar=True),
        "on_before_optimizer_step": logs("on_before_optimizer_step", lambda t: 2.0, on_epoch=True),
        "on_train_epoch_end": logs("on_train_epoch_end", lambda t: t.current_epoch + 0.5),
        "on_validation_batch_end": logs("on_validation_batch_end", lambda t: float(t.global_step)),
        "on_validation_epoch_end": logs("on_validation_epoch_end", lambda t: {"cb_dict_val": 3.0}, prog_bar=True),
        "on_test_batch_end": logs("on_test_batch_end", lambda t: 4.0, on_step=True),
        "on_test_epoch_end": logs("on_test_epoch_end", lambda t: 5.0, logger=False),
    }

    def configure_callbacks(self):
        class Configured(type(self.trainer.callbacks[0]).__base__):  # the framework's Callback
            def on_train_epoch_end(self, trainer, pl_module):
                self.log("from_configured", 7.0)

        return [Configured()]

    both = differential(
        trainer=dict(max_epochs=2),
        stages=("fit", "test"),
        callback=callback,
        module={"configure_callbacks": configure_callbacks},
    )
    expected = {"cb_on_train_batch_end", "cb_dict_a", "cb_dict_val", "from_configured"}
    assert expected <= set(both.lightning.callback_metrics["fit"])
    assert "cb_on_test_batch_end_epoch" in both.lightning.callback_metrics["test"]
