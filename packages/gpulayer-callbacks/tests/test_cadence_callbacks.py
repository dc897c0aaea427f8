"""GPUlayer's callbacks run their batch hooks only at the batches the trainer's cadence plans (ADR 0022), and a
run with them saves, logs and trains exactly as the same run made to ask every rule at every batch."""

from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.callbacks import LearningRateMonitor, ModelCheckpoint
from gpulayer.trainer import Callback, Module, Trainer, seed_everything


class _Regressor(Module):
    """Logs its loss each step; records whether the plan had the rules run at each batch."""

    def __init__(self, interval: str = "epoch"):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.interval = interval
        self.planned: list[bool] = []

    def training_step(self, batch, batch_idx):
        trainer = self.trainer
        self.planned.append(batch_idx >= trainer.cadence.next_batch or trainer.is_last_batch or trainer.should_stop)
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.interval}}


class _AsksEveryRule(Callback):
    """Does nothing, but overrides a batch hook: the loop then runs every rule at every batch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass


def _data(n):
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator))


def _run(root: Path, every_rule: bool, callbacks, interval: str, **trainer_args):
    seed_everything(3)
    model = _Regressor(interval)
    trainer = Trainer(
        accelerator="cpu",
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        callbacks=callbacks() + ([_AsksEveryRule()] if every_rule else []),
        **trainer_args,
    )
    trainer.fit(model, DataLoader(_data(44), batch_size=4), DataLoader(_data(8), batch_size=4))
    version = root / "lightning_logs" / "version_0"
    files = {
        path.relative_to(version).as_posix(): torch.load(path, weights_only=True)["state_dict"]
        for path in sorted(version.rglob("*.ckpt"))
    }
    monitors = [callback for callback in trainer.callbacks if isinstance(callback, LearningRateMonitor)]
    csv = version / "metrics.csv"
    return model, trainer, csv.read_text() if csv.exists() else "", files, [monitor.lrs for monitor in monitors]


CASES = {
    "the default install: ModelCheckpoint(), an epoch scheduler, LearningRateMonitor(epoch)": (
        lambda: [LearningRateMonitor(logging_interval="epoch")],
        "epoch",
        dict(max_epochs=3, log_every_n_steps=4),
    ),
    "ModelCheckpoint every 3 steps": (
        lambda: [ModelCheckpoint(every_n_train_steps=3, save_top_k=-1)],
        "epoch",
        dict(max_epochs=2, log_every_n_steps=5),
    ),
    "ModelCheckpoint every 3 steps, accumulate 2": (
        lambda: [ModelCheckpoint(every_n_train_steps=3, save_top_k=-1)],
        "epoch",
        dict(max_epochs=2, log_every_n_steps=5, accumulate_grad_batches=2),
    ),
    "ModelCheckpoint every 2 steps monitoring val_loss, validate every 5": (
        lambda: [ModelCheckpoint(every_n_train_steps=2, monitor="val_loss", save_top_k=2)],
        "epoch",
        dict(max_epochs=2, log_every_n_steps=5, val_check_interval=5),
    ),
    "LearningRateMonitor(step)": (
        lambda: [LearningRateMonitor(logging_interval="step")],
        "epoch",
        dict(max_epochs=2, log_every_n_steps=3),
    ),
    "LearningRateMonitor(None), accumulate 3": (
        lambda: [LearningRateMonitor()],
        "step",
        dict(max_epochs=2, log_every_n_steps=2, accumulate_grad_batches=3),
    ),
}


@pytest.mark.parametrize(("callbacks", "interval", "trainer_args"), CASES.values(), ids=CASES)
def test_callbacks_act_as_when_every_rule_runs_every_batch(tmp_path, callbacks, interval, trainer_args):
    planned_model, planned_trainer, planned_csv, planned_files, planned_lrs = _run(
        tmp_path / "p", False, callbacks, interval, **trainer_args
    )
    model, trainer, csv, files, lrs = _run(tmp_path / "e", True, callbacks, interval, **trainer_args)

    assert all(model.planned)
    assert not all(planned_model.planned), "GPUlayer's callbacks must not make every batch run every rule"
    assert planned_trainer.global_step == trainer.global_step
    assert planned_csv == csv
    assert planned_lrs == lrs
    assert planned_files.keys() == files.keys()
    assert files, "the run saved no checkpoint: the comparison checks nothing"
    for name, state in files.items():
        for key, value in state.items():
            torch.testing.assert_close(planned_files[name][key], value, rtol=0, atol=0)


def test_a_time_triggered_checkpoint_is_saved_after_every_batch_its_clock_is_due(tmp_path):
    """``train_time_interval`` shorter than a batch: the loop reads the clock after every batch, so every batch
    saves, as when the hook ran at every batch."""
    callbacks = lambda: [ModelCheckpoint(train_time_interval=timedelta(microseconds=1), save_top_k=-1)]  # noqa: E731
    _, trainer, _, files, _ = _run(tmp_path, False, callbacks, "epoch", max_epochs=1)
    assert len(files) == trainer.global_step == 11


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
@pytest.mark.parametrize("every_rule", [False, True], ids=["planned", "every rule at every batch"])
def test_a_run_resumed_inside_an_accumulation_window_saves_as_every_rule_would(tmp_path, every_rule):
    """Resumed from the step-2 checkpoint (saved at batch_idx 3, which made ``global_step`` 2), the next batch only
    accumulates, so ``global_step`` is still a multiple of 2 at its end and the step trigger acts there again: it
    rewrites the step-2 file from batch_idx 4, as when every rule runs at every batch."""
    folder = tmp_path / "checkpoints"
    for max_steps, ckpt_path in ((2, None), (4, folder / "epoch=0-step=2.ckpt")):
        seed_everything(3)
        model = _Regressor()
        trainer = Trainer(
            accelerator="cpu",
            enable_progress_bar=False,
            logger=False,
            default_root_dir=tmp_path,
            max_steps=max_steps,
            accumulate_grad_batches=2,
            callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=2, save_top_k=-1)]
            + ([_AsksEveryRule()] if every_rule else []),
        )
        trainer.fit(model, DataLoader(_data(44), batch_size=4), ckpt_path=ckpt_path)
    assert model.planned[0] is True
    assert sorted(path.name for path in folder.iterdir()) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    rewritten = torch.load(folder / "epoch=0-step=2.ckpt", weights_only=True)
    assert rewritten["loops"]["fit_loop"]["batch_idx"] == 4
