"""The cadence (ADR 0022): the fit loop asks its per-batch rules only at the batches its plan names, and a run
trains, validates, logs and stops exactly as the same run made to ask every rule at every batch."""

from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from gpulayer.trainer import Callback, Module, Trainer, seed_everything
from gpulayer.trainer.loops.timer import Timer


class _Recorder(Module):
    """Records, per training batch, whether the plan had the rules run at it (``planned``), and what validation
    saw; can set ``should_stop`` at one global step."""

    def __init__(self, stop_at: int | None = None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.stop_at = stop_at
        self.planned: list[bool] = []
        self.validations: list[tuple[int, int, int]] = []  # (epoch, global_step, batch_idx) at each validation

    def training_step(self, batch, batch_idx):
        trainer = self.trainer
        self.planned.append(batch_idx >= trainer.cadence.next_batch or trainer.is_last_batch or trainer.should_stop)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, prog_bar=True)
        self.log("epoch_loss", loss, on_step=False, on_epoch=True)
        if self.global_step == self.stop_at:
            self.trainer.should_stop = True
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self.validations.append((self.current_epoch, self.global_step, self.trainer.fit_loop.progress.batch_idx))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class _Scheduled(_Recorder):
    """A step-interval scheduler stepped every ``frequency``-th batch."""

    def __init__(self, stop_at: int | None = None, frequency: int = 1):
        super().__init__(stop_at)
        self.frequency = frequency

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
        config = {"scheduler": scheduler, "interval": "step", "frequency": self.frequency}
        return {"optimizer": optimizer, "lr_scheduler": config}


class _BatchStartHook(_Recorder):
    def on_train_batch_start(self, batch, batch_idx):
        pass


class _AsksEveryRule(Callback):
    """Does nothing, but overrides a batch hook: the loop then runs every rule at every batch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass


class _SubclassedTimer(Timer):
    """A subclass that overrides a hook GPUlayer's Timer runs only at planned batches: it runs at every batch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class _Unsized(IterableDataset):
    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


def _data(n):
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator))


def _fit(root: Path, model: Module, train, **trainer_args) -> Trainer:
    trainer = Trainer(
        accelerator="cpu",
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        **trainer_args,
    )
    trainer.fit(model, DataLoader(train, batch_size=4), DataLoader(_data(8), batch_size=4))
    return trainer


def _run(root: Path, every_rule: bool, trainer_args: dict, stop_at, unsized: bool, frequency: int | None = None):
    seed_everything(7)
    model = _Recorder(stop_at) if frequency is None else _Scheduled(stop_at, frequency)
    train = _Unsized(_data(44)) if unsized else _data(44)
    callbacks = [_AsksEveryRule()] if every_rule else []
    trainer = _fit(root, model, train, callbacks=callbacks, **trainer_args)
    csv = (root / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return model, trainer, csv, weights


# 11 batches an epoch; cadences that do not divide it, so log steps and validations move across epochs.
CASES = {
    "log every 3": dict(max_epochs=3, log_every_n_steps=3),
    "log every 4, validate every 5 batches": dict(max_epochs=2, log_every_n_steps=4, val_check_interval=5),
    "validate every 0.3 epoch, every 2nd epoch": dict(
        max_epochs=4, log_every_n_steps=5, val_check_interval=0.3, check_val_every_n_epoch=2
    ),
    "validate every 7 batches across epochs": dict(
        max_epochs=3, log_every_n_steps=6, val_check_interval=7, check_val_every_n_epoch=None
    ),
    "max_steps inside an epoch": dict(max_steps=17, log_every_n_steps=5),
    "limit_train_batches": dict(max_epochs=2, limit_train_batches=8, log_every_n_steps=3),
    "no log steps": dict(max_epochs=2, log_every_n_steps=0),
    "accumulate 3, log every 2, validate every 5": dict(
        max_epochs=2, accumulate_grad_batches=3, log_every_n_steps=2, val_check_interval=5
    ),
    "max_time far off (a clock rule)": dict(max_epochs=2, log_every_n_steps=4, max_time=timedelta(hours=1)),
    "validation by time, far off": dict(max_epochs=2, log_every_n_steps=4, val_check_interval=timedelta(hours=1)),
}
# (name, trainer arguments, step scheduler frequency)
SCHEDULED = {
    "a step scheduler every 2nd batch": (dict(max_epochs=2, log_every_n_steps=5), 2),
    "a step scheduler every 2nd batch, accumulate 3": (dict(max_epochs=2, accumulate_grad_batches=3), 2),
}


def _compare(tmp_path, trainer_args, stop_at, unsized, frequency=None):
    planned_model, planned_trainer, planned_csv, planned_weights = _run(
        tmp_path / "p", False, trainer_args, stop_at, unsized, frequency
    )
    model, trainer, csv, weights = _run(tmp_path / "e", True, trainer_args, stop_at, unsized, frequency)

    assert all(model.planned), "the batch hook must make every batch ask every rule"
    assert not all(planned_model.planned), "the plain run must skip the rules somewhere, else this compares nothing"
    assert planned_trainer.global_step == trainer.global_step
    assert planned_trainer.current_epoch == trainer.current_epoch
    assert planned_model.validations == model.validations
    assert planned_csv == csv
    assert planned_trainer.callback_metrics.keys() == trainer.callback_metrics.keys()
    for name, value in trainer.callback_metrics.items():
        torch.testing.assert_close(planned_trainer.callback_metrics[name], value, rtol=0, atol=0)
    torch.testing.assert_close(planned_weights, weights, rtol=0, atol=0)


@pytest.mark.parametrize("stop_at", [None, 9], ids=["no stop", "should_stop at step 9"])
@pytest.mark.parametrize(
    ("trainer_args", "unsized"),
    [
        pytest.param(args, unsized, id=f"{name}, {'loader without a length' if unsized else 'sized loader'}")
        for name, args in CASES.items()
        for unsized in (False, True)
        if not (unsized and isinstance(args.get("val_check_interval"), float))  # refused without a length
    ],
)
def test_the_plan_changes_nothing_but_where_the_rules_are_asked(tmp_path, trainer_args, stop_at, unsized):
    _compare(tmp_path, trainer_args, stop_at, unsized)


@pytest.mark.parametrize(("trainer_args", "frequency"), SCHEDULED.values(), ids=SCHEDULED)
def test_step_schedulers_step_at_planned_batches(tmp_path, trainer_args, frequency):
    _compare(tmp_path, trainer_args, None, False, frequency)


def test_the_rules_run_exactly_at_the_planned_batches(tmp_path):
    """11 batches an epoch, log every 4 stepped batches (counted across epochs), validation after batch_idx 4 and
    9 (and the epoch's last batch does not validate: 11 is not a multiple of 5)."""
    model, trainer, _, _ = _run(
        tmp_path, False, dict(max_epochs=2, log_every_n_steps=4, val_check_interval=5), None, False
    )
    planned = set()
    for step in range(trainer.global_step):
        batch_idx = step % 11
        if (step + 1) % 4 == 0 or (batch_idx + 1) % 5 == 0 or batch_idx == 10:
            planned.add(step)
    assert [step for step, is_planned in enumerate(model.planned) if is_planned] == sorted(planned)
    assert model.validations == [(0, 5, 4), (0, 10, 9), (1, 16, 4), (1, 21, 9)]


def test_accumulation_plans_the_log_steps_among_the_batches_that_step(tmp_path):
    """11 batches, accumulate 3 (steps after batch_idx 2, 5, 8 and the last, 10), log every 2 steps, a step
    scheduler every 2nd batch_idx + 1 (with the windows: batch_idx 5 and 10... and the last)."""
    model, trainer, _, _ = _run(
        tmp_path, False, dict(max_epochs=1, accumulate_grad_batches=3, log_every_n_steps=2), None, False, 2
    )
    # Stepping batches 2, 5, 8, 10; the 2nd and 4th stepping batches log (5, 10); batch_idx + 1 even and stepping:
    # 5 (6) and the last (10, 11 is odd but the epoch's end is planned anyway).
    assert [batch_idx for batch_idx, is_planned in enumerate(model.planned) if is_planned] == [5, 10]
    assert trainer.global_step == 4


# Configurations whose rules are asked at every batch: a batch hook of the module or of a callback (a subclass of a
# GPUlayer callback that overrides one too), fast_dev_run.
EVERY_BATCH = {
    "the module's on_train_batch_start": (_BatchStartHook, dict(callbacks=[])),
    "a callback's on_train_batch_end": (_Recorder, dict(callbacks=[_AsksEveryRule()])),
    "a Timer subclass overriding on_train_batch_end": (
        _Recorder,
        dict(callbacks=[_SubclassedTimer(timedelta(hours=1))]),
    ),
    "fast_dev_run": (_Recorder, dict(fast_dev_run=7)),
}


@pytest.mark.parametrize(("model_class", "trainer_args"), EVERY_BATCH.values(), ids=EVERY_BATCH)
def test_user_batch_hooks_and_fast_dev_run_plan_every_batch(tmp_path, model_class, trainer_args):
    model = model_class()
    _fit(tmp_path, model, _data(44), max_epochs=1, log_every_n_steps=5, **trainer_args)
    assert len(model.planned) >= 7
    assert all(model.planned)


def test_max_time_stops_at_the_first_batch_past_its_deadline(tmp_path):
    """The Timer's batch hook runs only where the plan says, but the loop reads its clock after every batch: a
    ``max_time`` that has already passed when training starts stops after the first batch, as in Lightning."""
    model = _Recorder()
    trainer = _fit(tmp_path, model, _data(44), max_epochs=3, max_time=timedelta(microseconds=1))
    assert trainer.global_step == 1
    assert model.planned == [False]  # not planned by count: the clock made the rules run
