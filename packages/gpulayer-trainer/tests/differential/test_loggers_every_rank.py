"""Under DDP, every rank calls every logger as Lightning 2.6 does: the same calls with the same arguments (each
rank's own values unless ``sync_dist``), ``finalize`` with its status, ``after_save_checkpoint`` on rank 0 alone;
and the CSV loggers write on rank 0 alone."""

import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks

from .conftest import quiet_lightning


def _recording_logger(base):
    """A user's logger without ``rank_zero_only``: it records every call it gets."""

    class Recording(base):
        def __init__(self):
            super().__init__()
            self.calls = []

        @property
        def name(self):
            return "recorded"

        @property
        def version(self):
            return 0

        def log_metrics(self, metrics, step=None):
            self.calls.append(("log_metrics", step, {k: round(float(v), 5) for k, v in sorted(metrics.items())}))

        def log_hyperparams(self, params, *args, **kwargs):
            self.calls.append(("log_hyperparams", dict(params)))

        def log_graph(self, model, input_array=None):
            self.calls.append(("log_graph", type(model).__name__))

        def save(self):
            self.calls.append(("save",))

        def finalize(self, status):
            self.calls.append(("finalize", status))

        def after_save_checkpoint(self, checkpoint_callback):
            self.calls.append(("after_save_checkpoint",))

    return Recording()


def _module(base, fail):
    class Regressor(base):
        def __init__(self, width=4):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):
            if fail and self.global_step == 3:
                raise RuntimeError("a failing step")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True)  # this rank's value
            self.log("synced_loss", loss, on_step=True, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Regressor()


def _run(framework, root, rank, fail):
    """One fit on this rank with a recording logger and a CSVLogger in a folder of this rank's own."""
    ours = framework is gl
    framework.seed_everything(0)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=generator), torch.randn(32, 1, generator=generator))
    recording = _recording_logger(gl.Logger if ours else framework.loggers.Logger)
    csv_root = os.path.join(root, f"csv-rank{rank}")
    csv = (gl.CSVLogger if ours else framework.loggers.CSVLogger)(csv_root)
    extra = {} if ours else {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = framework.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, log_every_n_steps=2, default_root_dir=root,
        logger=[recording, csv], **extra,
    )  # fmt: skip
    module = _module(gl.Module if ours else framework.LightningModule, fail)
    try:
        trainer.fit(module, DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
    except RuntimeError as error:
        assert fail and "a failing step" in str(error)
    written = sorted(
        os.path.relpath(os.path.join(top, name), csv_root) for top, _, names in os.walk(csv_root) for name in names
    )
    return recording.calls, written


def _both_frameworks_on_this_rank(runtime, root):
    """GPUlayer's runs first; then Lightning's, which finds the harness's process group and this rank in the
    variables a launcher sets."""
    rank = runtime.global_rank
    ours = {fail: _run(gl, f"{root}/gl-{fail}", rank, fail) for fail in (False, True)}
    os.environ |= {"LOCAL_RANK": str(rank), "RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": "2"}
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = {fail: _run(pl, f"{root}/pl-{fail}", rank, fail) for fail in (False, True)}
    return ours, theirs


@pytest.mark.multiprocess
def test_every_rank_calls_the_loggers_as_lightning_and_csv_writes_on_rank_zero_alone(tmp_path):
    by_rank = run_ranks(_both_frameworks_on_this_rank, str(tmp_path), world_size=2, timeout=240)
    for rank, (ours, theirs) in enumerate(by_rank):
        for fail in (False, True):
            assert ours[fail] == theirs[fail], f"rank {rank}, fail={fail}"
    (ok0, written0), (ok1, written1) = by_rank[0][0][False], by_rank[1][0][False]
    assert written0 == ["lightning_logs/version_0/hparams.yaml", "lightning_logs/version_0/metrics.csv"]
    assert written1 == []
    assert ok1[:3] == [("log_hyperparams", {"width": 4}), ("log_graph", "Regressor"), ("save",)]
    assert ok0[-1] == ok1[-1] == ("finalize", "success") and by_rank[1][0][True][0][-1] == ("finalize", "failed")
    assert ("after_save_checkpoint",) in ok0 and ("after_save_checkpoint",) not in ok1

    def rows(calls, name):
        return [call[2][name] for call in calls if call[0] == "log_metrics" and name in call[2]]

    assert rows(ok0, "train_loss_step") != rows(ok1, "train_loss_step")  # each rank's own batches
    assert rows(ok0, "synced_loss") == rows(ok1, "synced_loss") != []
