"""Founding decision 4: a step that prints nothing reads nothing back from the device.

Every host read of a tensor (``item``, ``cpu``, ``tolist``, ``numpy``, ``float()``, ``int()``, ``bool()``,
``index``) made while the trainer runs is recorded with the ``global_step`` it happened at. Reads made by the
DataLoader itself (its iterator draws a seed with ``.item()``) are the user's loader's, not the trainer's.
"""

import traceback

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer

READS = ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")


class LoggingRegressor(Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_epoch=True, prog_bar=True)
        self.log("lr", 0.05, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 10)}


@pytest.fixture
def host_reads(monkeypatch):
    """A list that fills with the ``global_step`` of every host read the trainer makes."""
    reads: list[tuple[int, str]] = []
    trainer_box: list[Trainer] = []

    def counting(name, original):
        def read(self, *args, **kwargs):
            stack = traceback.extract_stack()
            if trainer_box and not any("torch/utils/data" in frame.filename for frame in stack):
                reads.append((trainer_box[0].global_step, name))
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    return reads, trainer_box


class LoggingATorchMetric(LoggingRegressor):
    """Logs a torchmetrics MeanMetric for the epoch only (its NaN check off: that check is the metric's own read)."""

    def __init__(self):
        super().__init__()
        torchmetrics = pytest.importorskip("torchmetrics")
        self.mean_error = torchmetrics.MeanMetric(nan_strategy="disable")

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.mean_error(loss.detach())
        self.log("mean_error", self.mean_error, on_step=False, on_epoch=True)
        return loss


class LoggingByHand(LoggingRegressor):
    """The same under manual optimization: the step's own backward and optimizer step add no read."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


@pytest.mark.parametrize(
    "module",
    [LoggingRegressor, LoggingATorchMetric, LoggingByHand],
    ids=["tensors", "a torchmetric too", "manual optimization"],
)
def test_a_60_step_run_reads_tensors_only_on_log_steps_and_at_epoch_ends(tmp_path, host_reads, capsys, module):
    reads, trainer_box = host_reads
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(240, 8, generator=generator), torch.randn(240, 1, generator=generator))
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=2,
        log_every_n_steps=20,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    trainer_box.append(trainer)
    trainer.fit(module(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=60))
    trainer_box.clear()

    assert trainer.global_step == 60
    steps_with_reads = {step for step, _ in reads}
    epoch_ends = {30, 60}
    log_steps = {20, 40, 60}
    assert steps_with_reads <= log_steps | epoch_ends, sorted(reads)
    assert log_steps <= steps_with_reads, "the log line must read the loss on its steps (the counter works)"
    assert len(capsys.readouterr().out.strip().splitlines()) == 3


class _RecordsItsStack(Module):
    """Keeps the trainer's frames on the stack when ``training_step`` runs (ARCHITECTURE.md, "The frames of one
    step")."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.frames: list[tuple[str, str]] = []

    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            stack = traceback.extract_stack()[:-1]
            self.frames = [(f.filename.rsplit("/", 1)[-1], f.name) for f in stack if "/gpulayer/trainer/" in f.filename]
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_training_step_runs_nine_frames_below_fit_in_five_files(tmp_path):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=generator), torch.randn(32, 1, generator=generator))
    model = _RecordsItsStack()
    Trainer(accelerator="cpu", max_steps=4, logger=False, enable_checkpointing=False, default_root_dir=tmp_path).fit(
        model, DataLoader(data, batch_size=4)
    )
    assert model.frames == [
        ("trainer.py", "fit"),
        ("stages.py", "run_stage"),
        ("stages.py", "_fit"),
        ("fit_loop.py", "run"),
        ("fit_loop.py", "run_epoch"),
        ("fit_loop.py", "run_batch"),
        ("optimization.py", "run"),
        ("optimization.py", "closure"),
        ("hooks.py", "_call_step"),
    ]
