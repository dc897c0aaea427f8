"""Lightning's MLFlowLogger (a local SQLite store) and WandbLogger (offline) given to Trainer(logger=...): the same
parameters, metric histories, checkpoint artifacts and run files as under Lightning 2.6."""

import struct
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

lightning = pytest.importorskip("lightning.pytorch")


def _module_class(base):
    class Regressor(base):
        def __init__(self, width=4, lr=0.05, label="offline"):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Regressor


def _fit(ours, root, logger):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(20, 4, generator=generator), torch.randn(20, 1, generator=generator))
    loaders = DataLoader(data, batch_size=4), DataLoader(data, batch_size=8)
    model = _module_class(gl.Module if ours else lightning.LightningModule)()
    options = dict(accelerator="cpu", max_epochs=2, log_every_n_steps=2, default_root_dir=root, logger=logger)
    with warnings.catch_warnings():  # Lightning's tips; the loggers' own deprecation notices
        warnings.simplefilter("ignore")
        if ours:
            trainer = gl.Trainer(**options)
        else:
            trainer = lightning.Trainer(enable_progress_bar=False, enable_model_summary=False, **options)
        trainer.fit(model, *loaders)
    return trainer


def _mlflow_run(ours, root):
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    root.mkdir()
    uri = f"sqlite:///{root}/mlflow.db"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logger = MLFlowLogger("offline", tracking_uri=uri, log_model=True, artifact_location=str(root / "artifacts"))
    trainer = _fit(ours, root, logger)
    with warnings.catch_warnings():  # SQLAlchemy's deprecation notices inside MLflow's store
        warnings.simplefilter("ignore")
        client = MlflowClient(uri)
        run = client.get_run(logger.run_id)
        metrics = {
            key: [(entry.step, round(entry.value, 5)) for entry in client.get_metric_history(logger.run_id, key)]
            for key in sorted(run.data.metrics)
        }
        artifacts = sorted(item.path for item in client.list_artifacts(logger.run_id, "epoch=1-step=10"))
    records = {  # MLFlowLogger's own record of each checkpoint it logs
        path.relative_to(root / "artifacts" / logger.run_id).as_posix(): path.read_text()
        for path in (root / "artifacts").rglob("*")
        if path.suffix in (".txt", ".yaml")
    }
    best = trainer.checkpoint_callback.best_model_path
    where = best.removeprefix(str(root)).replace(logger.run_id, "RUN")  # save_dir/experiment id/run id
    return run.data.params, metrics, artifacts, records, where


def test_mlflow_logger_records_the_same_run(tmp_path):
    pytest.importorskip("mlflow")
    ours = _mlflow_run(True, tmp_path / "gpulayer")
    theirs = _mlflow_run(False, tmp_path / "lightning")
    assert ours == theirs
    params, metrics, artifacts, records, best = ours
    assert params == {"width": "4", "lr": "0.05", "label": "offline"}
    assert {"train_loss_step", "train_loss_epoch", "val_loss", "epoch"} <= metrics.keys()
    assert len(metrics["train_loss_epoch"]) == 2
    assert artifacts == [f"epoch=1-step=10/{name}" for name in ("aliases.txt", "epoch=1-step=10.ckpt", "metadata.yaml")]
    assert records["artifacts/epoch=1-step=10/aliases.txt"] == "['latest', 'best']"
    assert best == "/1/RUN/checkpoints/epoch=1-step=10.ckpt"


def _wandb_records(path):
    """The protobuf records of an offline run's ``.wandb`` file: W&B's LevelDB-style log (a 7-byte file header, then
    32 KiB blocks of chunks, each with a 7-byte header of checksum, length and FULL/FIRST/MIDDLE/LAST type)."""
    from wandb.proto import wandb_internal_pb2

    data, block, offset, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a header is padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if kind == 0:
            break
        pending += data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):  # FULL, or LAST of a split record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _items(entries, dropped):
    """A record's key/value entries as a dict, a nested key joined by "/", without the ``dropped`` keys."""
    keyed = {entry.key or "/".join(entry.nested_key): entry.value_json for entry in entries}
    return {key: value for key, value in keyed.items() if key not in dropped}


def _wandb_run(ours, root, monkeypatch):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    root.mkdir()
    trainer = _fit(ours, root, WandbLogger(project="offline", save_dir=str(root), offline=True))
    run_id = trainer.logger.version
    wandb.finish()
    wandb.teardown()  # ends W&B's service process with the run
    (path,) = root.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    seen = {"config": [], "history": [], "metric": []}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            seen[kind].append(_items(record.config.update, ("_wandb",)))
        elif kind == "history":
            seen[kind].append(_items(record.history.item, ("_timestamp", "_runtime")))
        elif kind == "metric":
            seen[kind].append((record.metric.name, record.metric.glob_name, record.metric.step_metric))
    best = trainer.checkpoint_callback.best_model_path.removeprefix(str(root)).replace(run_id, "RUN")
    return seen, best


def test_wandb_logger_offline_records_the_same_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    ours = _wandb_run(True, tmp_path / "gpulayer", monkeypatch)
    theirs = _wandb_run(False, tmp_path / "lightning", monkeypatch)
    assert ours == theirs
    seen, best = ours
    assert seen["config"] == [{"width": "4", "lr": "0.05", "label": '"offline"'}]
    assert len(seen["history"]) == 9  # every second step's train_loss_step, each validation, each epoch's mean
    assert seen["history"][2].keys() == {"val_loss", "epoch", "trainer/global_step", "_step"}
    assert ("trainer/global_step", "", "") in seen["metric"]
    assert best == "/offline/RUN/checkpoints/epoch=1-step=10.ckpt"
