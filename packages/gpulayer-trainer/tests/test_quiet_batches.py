"""Quiet batches (ADR 0021): the fit loop skips its per-batch rules only where none can act, and a run that has
them trains, validates, logs and stops exactly as the same run made to ask every rule at every batch."""

import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from gpulayer.trainer import Callback, Module, Trainer, seed_everything


class _Recorder(Module):
    """Records, per training batch, whether it ran as a quiet batch, and what validation saw; can set
    ``should_stop`` at one global step."""

    def __init__(self, stop_at: int | None = None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.stop_at = stop_at
        self.quiet: list[bool] = []
        self.validations: list[tuple[int, int, int]] = []  # (epoch, global_step, batch_idx) at each validation

    def training_step(self, batch, batch_idx):
        self.quiet.append(any(frame.name == "run_quiet_batch" for frame in traceback.extract_stack()))
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
            self.validations.append((self.current_epoch, self.global_step, self.trainer.fit_loop.batch_idx))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class _Scheduled(_Recorder):
    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class _BatchStartHook(_Recorder):
    def on_train_batch_start(self, batch, batch_idx):
        pass


class _AsksEveryRule(Callback):
    """Does nothing, but overrides a batch hook: the loop then runs every rule at every batch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass


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


def _run(root: Path, every_rule: bool, trainer_args: dict, stop_at, unsized: bool):
    seed_everything(7)
    model = _Recorder(stop_at)
    train = _Unsized(_data(44)) if unsized else _data(44)
    trainer = _fit(root, model, train, callbacks=[_AsksEveryRule()] if every_rule else [], **trainer_args)
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
}


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
def test_quiet_batches_change_nothing_but_which_rules_are_asked(tmp_path, trainer_args, stop_at, unsized):
    quiet_model, quiet_trainer, quiet_csv, quiet_weights = _run(tmp_path / "q", False, trainer_args, stop_at, unsized)
    model, trainer, csv, weights = _run(tmp_path / "e", True, trainer_args, stop_at, unsized)

    assert not any(model.quiet), "the batch hook must make every batch ask every rule"
    assert any(quiet_model.quiet), "the plain run must have quiet batches, else this test compares nothing"
    assert quiet_trainer.global_step == trainer.global_step
    assert quiet_trainer.current_epoch == trainer.current_epoch
    assert quiet_model.validations == model.validations
    assert quiet_csv == csv
    assert quiet_trainer.callback_metrics.keys() == trainer.callback_metrics.keys()
    for name, value in trainer.callback_metrics.items():
        torch.testing.assert_close(quiet_trainer.callback_metrics[name], value, rtol=0, atol=0)
    torch.testing.assert_close(quiet_weights, weights, rtol=0, atol=0)


def test_a_batch_is_quiet_exactly_where_no_rule_acts(tmp_path):
    """11 batches an epoch, log every 4 stepped batches (counted across epochs), validation after batch_idx 4 and
    9 (and the epoch's last batch does not validate: 11 is not a multiple of 5)."""
    model, trainer, _, _ = _run(
        tmp_path, False, dict(max_epochs=2, log_every_n_steps=4, val_check_interval=5), None, False
    )
    busy = set()
    for step in range(trainer.global_step):
        batch_idx = step % 11
        if (step + 1) % 4 == 0 or (batch_idx + 1) % 5 == 0 or batch_idx == 10:
            busy.add(step)
    assert [step for step, quiet in enumerate(model.quiet) if not quiet] == sorted(busy)
    assert model.validations == [(0, 5, 4), (0, 10, 9), (1, 16, 4), (1, 21, 9)]


# Configurations whose rules do not follow the batch count: a step scheduler, accumulation and the batch hooks act at
# every batch, a validation by time whenever the clock says, fast_dev_run's limits are checked per batch.
NO_QUIET_BATCHES = {
    "a learning rate scheduler stepped every step": (_Scheduled, {}),
    "accumulation": (_Recorder, dict(accumulate_grad_batches=2)),
    "validation by time": (_Recorder, dict(val_check_interval=timedelta(minutes=5))),
    "fast_dev_run": (_Recorder, dict(fast_dev_run=7)),
    "the module's on_train_batch_start": (_BatchStartHook, {}),
}


@pytest.mark.parametrize(("model_class", "trainer_args"), NO_QUIET_BATCHES.values(), ids=NO_QUIET_BATCHES)
def test_rules_that_do_not_follow_the_batch_count_leave_no_quiet_batch(tmp_path, model_class, trainer_args):
    model = model_class()
    _fit(tmp_path, model, _data(44), max_epochs=1, log_every_n_steps=5, **trainer_args)
    assert len(model.quiet) >= 7
    assert not any(model.quiet)
