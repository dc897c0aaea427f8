"""Ray Tune's Lightning callback (``TuneReportCheckpointCallback``, built on Lightning's ``Callback``) in a real Tune
run: GPUlayer's Trainer reports the same metrics at the same iterations, and the checkpoint Tune keeps holds the same
weights, as Lightning 2.6's."""

import sys
import tempfile

import pytest
import torch

lightning = pytest.importorskip("lightning.pytorch")
ray = pytest.importorskip("ray")
tune = pytest.importorskip("ray.tune")


def _trainable(config):
    """One Tune trial: two epochs of a small regression, reported to Tune at each validation's end."""
    from ray.tune.integration.pytorch_lightning import TuneReportCheckpointCallback
    from torch.utils.data import DataLoader, TensorDataset

    import gpulayer.trainer as gl

    base = gl.Module if config["ours"] else lightning.LightningModule

    class Regressor(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=config["lr"])

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(20, 4, generator=generator), torch.randn(20, 1, generator=generator))
    report = TuneReportCheckpointCallback({"loss": "val_loss"}, filename="trial.ckpt")
    options = dict(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, callbacks=[report])
    if config["ours"]:
        trainer = gl.Trainer(default_root_dir=config["root"], **options)
    else:
        trainer = lightning.Trainer(
            default_root_dir=config["root"], enable_progress_bar=False, enable_model_summary=False, **options
        )
    trainer.fit(Regressor(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))


def _tune(ours, root):
    run = tune.RunConfig(storage_path=str(root / "tune"), name="trial", verbose=0)
    tuner = tune.Tuner(_trainable, param_space={"ours": ours, "lr": 0.05, "root": str(root)}, run_config=run)
    (result,) = tuner.fit()
    assert result.error is None, result.error
    reported = [(row["training_iteration"], round(row["loss"], 6)) for _, row in result.metrics_dataframe.iterrows()]
    with result.checkpoint.as_directory() as folder:
        weights = torch.load(f"{folder}/trial.ckpt", weights_only=True)["state_dict"]
    return reported, weights


def test_ray_tunes_report_callback_reports_and_checkpoints_as_under_lightning(tmp_path):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Tune's workers cannot import a test module
    # Ray's socket paths must fit 107 bytes and Ray refuses a temp dir inside the virtualenv, where nox's TMPDIR is.
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as sessions:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=sessions)
        try:
            ours_reported, ours_weights = _tune(True, tmp_path / "gpulayer")
            theirs_reported, theirs_weights = _tune(False, tmp_path / "lightning")
        finally:
            ray.shutdown()
    assert ours_reported == theirs_reported
    assert [iteration for iteration, _ in ours_reported] == [1, 2]
    assert ours_weights.keys() == theirs_weights.keys() == {"layer.weight", "layer.bias"}
    assert all(torch.equal(ours_weights[key], theirs_weights[key]) for key in ours_weights)
