"""Features together, edge cases at their borders, and what the module sees while it runs (train/eval mode,
grad mode). 20 training samples give 5 batches per epoch where a scenario sets ``train_size=20``.
"""

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader


def stop_at(epoch, batch):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch_, batch_idx):
        if (trainer.current_epoch, batch_idx) == (epoch, batch):
            trainer.should_stop = True

    return on_train_batch_end


def step_scheduler(module):
    optimizer = module.sgd()
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": LambdaLR(optimizer, lambda s: 0.9**s), "interval": "step"},
    }


def test_everything_at_once(differential):
    """Accumulation, clipping, a step scheduler, mid-epoch validation on two loaders, dropout and shuffling."""
    differential(
        trainer=dict(
            max_epochs=3,
            accumulate_grad_batches=2,
            gradient_clip_val=0.1,
            val_check_interval=2,
            num_sanity_val_steps=-1,
            limit_val_batches=0.5,
        ),
        train_size=20,
        val_sizes=(8, 12),
        dropout=0.25,
        shuffle=True,
        configure_optimizers=step_scheduler,
        stages=("fit", "validate", "test", "predict"),
    )


def test_everything_at_once_through_a_datamodule_in_bf16(differential):
    differential(
        trainer=dict(
            max_epochs=2,
            accumulate_grad_batches=3,
            gradient_clip_val=0.01,
            gradient_clip_algorithm="value",
            precision="bf16-mixed",
            check_val_every_n_epoch=None,
            val_check_interval=4,
        ),
        train_size=20,
        data_source="datamodule",
        shuffle=True,
        dropout=0.5,
        stages=("fit", "test"),
    )


@pytest.mark.parametrize(
    ("trainer", "stop"),
    [
        (dict(max_epochs=4, check_val_every_n_epoch=2), (0, 1)),  # not a validation epoch: no forced validation
        (dict(max_epochs=4, check_val_every_n_epoch=2), (1, 1)),  # a validation epoch: validation right away
        (dict(max_epochs=4, min_epochs=2, val_check_interval=2), (0, 3)),  # minimums unmet: normal schedule
        (dict(max_epochs=4, val_check_interval=2), (0, 1)),  # stops on a regular validation batch: one run
        (dict(max_epochs=4), (0, 2)),  # stops on the last batch of the epoch
        (dict(max_epochs=4, accumulate_grad_batches=2), (0, 0)),  # stops on an accumulation-only batch
    ],
    ids=lambda value: str(value),
)
def test_should_stop_meets_the_validation_schedule(differential, trainer, stop):
    differential(trainer=trainer, train_size=20, callback={"on_train_batch_end": stop_at(*stop)})


@pytest.mark.parametrize(
    "trainer",
    [
        dict(max_steps=2, val_check_interval=2),  # max_steps on a regular validation batch
        dict(max_steps=3, val_check_interval=2),
        dict(max_steps=3, accumulate_grad_batches=2),
        dict(max_steps=4, check_val_every_n_epoch=None, val_check_interval=3),
    ],
    ids=lambda value: str(value),
)
def test_max_steps_meets_the_validation_schedule(differential, trainer):
    differential(trainer=trainer, train_size=20)


def test_on_train_batch_start_returning_minus_one_on_the_first_batch(differential):
    """The epoch ends before any batch runs."""

    def on_train_batch_start(self, batch, batch_idx):
        return -1 if self.current_epoch == 1 and batch_idx == 0 else None

    differential(trainer=dict(max_epochs=3), module={"on_train_batch_start": on_train_batch_start})


@pytest.mark.parametrize("accumulate", [1, 3])
def test_limit_train_batches_with_accumulation(differential, accumulate):
    """The limited last batch closes the accumulation window."""
    differential(trainer=dict(max_epochs=2, limit_train_batches=4, accumulate_grad_batches=accumulate), train_size=24)


def test_training_step_returning_none_on_every_batch(differential):
    def training_step(self, batch, batch_idx):
        return None

    differential(trainer=dict(max_epochs=2), module={"training_step": training_step}, documented_warning=True)


def record_modes(stage):
    def step(self, batch, batch_idx, dataloader_idx=0):
        self.record(
            "modes",
            (
                stage,
                self.training,
                self.net[0].training,
                self.net[1].training,
                torch.is_grad_enabled(),
                torch.is_inference_mode_enabled(),
            ),
        )
        loss = self.loss(batch)
        if stage == "predict":
            return self(batch[0])
        if stage != "train":
            self.log(f"{stage}_loss", loss)
        return loss

    return step


MODE_RECORDING = {
    "training_step": record_modes("train"),
    "validation_step": record_modes("val"),
    "test_step": record_modes("test"),
    "predict_step": record_modes("predict"),
}


@pytest.mark.parametrize("inference_mode", [True, False])
def test_train_eval_and_grad_modes_in_every_step(differential, inference_mode):
    """fit validates under no_grad; validate/test/predict under inference_mode or no_grad (Lightning's
    ``_no_grad_context`` in ``lightning/pytorch/loops/utilities.py``)."""
    differential(
        trainer=dict(max_epochs=1, inference_mode=inference_mode),
        module=MODE_RECORDING,
        stages=("fit", "validate", "test", "predict"),
    )


@pytest.mark.parametrize("override_train_hook", [False, True])
def test_a_frozen_eval_submodule_stays_in_eval_mode(differential, override_train_hook):
    """No automatic model.train() at fit start (Lightning warns, in ``_FitLoop._warn_if_modules_in_eval_mode``);
    eval loops restore each submodule's mode unless on_validation_model_train is overridden, whose default then
    puts the whole model in train mode."""

    def setup(self, stage):
        self.net[0].eval()

    differential(
        trainer=dict(max_epochs=2),
        module={
            **MODE_RECORDING,
            "setup": setup,
            **({} if override_train_hook else {"on_validation_model_train": None}),
        },
        stages=("fit", "validate", "fit"),
        dropout=0.5,
        documented_warning=True,
    )


def test_predict_with_two_loaders_returns_a_list_per_loader(differential):
    def predict_dataloader(self):
        return [DataLoader(self._loaders.predict, batch_size=4), DataLoader(self._loaders.test, batch_size=3)]

    both = differential(stages=("predict",), module={"predict_dataloader": predict_dataloader})
    assert [len(outputs) for outputs in both.lightning.returned["predict"]] == [2, 2]


def test_test_with_two_loaders(differential):
    def test_dataloader(self):
        return [DataLoader(self._loaders.test, batch_size=4), DataLoader(self._loaders.predict, batch_size=5)]

    differential(stages=("fit", "test"), module={"test_dataloader": test_dataloader})


def test_validate_with_limit_val_batches_zero_runs_nothing(differential):
    differential(stages=("validate",), trainer=dict(limit_val_batches=0))


def test_callback_logging_and_log_dict_in_validation(differential):
    """A callback may log through the module in batch hooks; log_dict takes the same options as log."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("from_callback", outputs["loss"], on_step=True, on_epoch=True, reduce_fx="max")

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        loss = self.loss(batch)
        self.log_dict({"val_a": loss, "val_b": loss * 2}, on_step=True, on_epoch=True, prog_bar=True)

    differential(
        trainer=dict(max_epochs=2),
        val_sizes=(6, 3),
        callback={"on_train_batch_end": on_train_batch_end},
        module={"validation_step": validation_step},
        stages=("fit", "validate"),
    )


def test_sanity_check_leaves_the_random_state_alone_with_two_loaders(run):
    scenario = dict(trainer=dict(max_epochs=2), dropout=0.5, shuffle=True, val_sizes=(10, 7), data_source="datamodule")
    with_sanity = run("gpulayer", **scenario)
    without_sanity = run("gpulayer", **{**scenario, "trainer": dict(max_epochs=2, num_sanity_val_steps=0)})
    for key, weight in with_sanity.weights.items():
        assert weight.equal(without_sanity.weights[key]), key
