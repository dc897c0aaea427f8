"""pytorch-forecasting's models (``NBeats``, ``DeepAR``) are LightningModules of that library: a script that builds
GPUlayer's Trainer fits them as they are, with Lightning's weights, metrics and checkpoint, and the library's own
Lightning paths still work after it (``predict`` builds Lightning's Trainer inside the library; its class's
``load_from_checkpoint`` reads the file GPUlayer saved)."""

import warnings

import numpy as np
import pytest
import torch

import gpulayer.trainer as gl

from .conftest import quiet_lightning

forecasting = pytest.importorskip("pytorch_forecasting")
pandas = pytest.importorskip("pandas")


def _datasets():
    """Four noisy sine series of 60 steps: the first 50 train, the rest validate (10 in, 5 out)."""
    rng = np.random.default_rng(0)
    rows = [
        {"series": str(series), "time_idx": step, "value": float(np.sin(step / 5 + series) + 0.1 * rng.normal())}
        for series in range(4)
        for step in range(60)
    ]
    data = pandas.DataFrame(rows)
    train = forecasting.TimeSeriesDataSet(
        data[data.time_idx < 50],
        time_idx="time_idx",
        target="value",
        group_ids=["series"],
        time_varying_unknown_reals=["value"],
        max_encoder_length=10,
        max_prediction_length=5,
    )
    return train, forecasting.TimeSeriesDataSet.from_dataset(train, data, min_prediction_idx=50)


MODELS = {
    "NBeats": lambda train: forecasting.NBeats.from_dataset(train, learning_rate=1e-2, widths=[16, 16]),
    "DeepAR": lambda train: forecasting.DeepAR.from_dataset(train, learning_rate=1e-2, hidden_size=8, rnn_layers=1),
}
QUIET = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False, "enable_model_summary": False}


def _fit_and_predict(trainer_class, name, root, pl):
    pl.seed_everything(0, verbose=False)
    train, val = _datasets()
    model = MODELS[name](train)
    trainer = trainer_class(max_epochs=2, limit_train_batches=5, gradient_clip_val=0.1, default_root_dir=root, **QUIET)
    trainer.fit(model, train.to_dataloader(train=True, batch_size=16), val.to_dataloader(train=False, batch_size=16))
    # The library's predict builds Lightning's Trainer from trainer_kwargs, adding its callback to the dict given.
    predictions = model.predict(val.to_dataloader(train=False, batch_size=16), trainer_kwargs=dict(QUIET))
    (checkpoint,) = (root / "checkpoints").iterdir()
    return {
        "class": type(model),
        "weights": model.state_dict(),
        "metrics": {key: float(value) for key, value in trainer.callback_metrics.items()},
        "steps": (trainer.global_step, trainer.current_epoch),
        "predictions": predictions,
        "checkpoint": checkpoint,
    }


@pytest.mark.parametrize("name", MODELS)
def test_a_pytorch_forecasting_model_fits_predicts_and_loads_as_under_lightning(tmp_path, name):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = _fit_and_predict(pl.Trainer, name, tmp_path / "lightning", pl)
        ours = _fit_and_predict(gl.Trainer, name, tmp_path / "gpulayer", pl)
        loaded = ours["class"].load_from_checkpoint(ours["checkpoint"])
        their_file = torch.load(theirs["checkpoint"], weights_only=False)
        our_file = torch.load(ours["checkpoint"], weights_only=False)
    assert ours["class"] is theirs["class"]  # the library's class, not a GPUlayer one, after fit
    assert ours["steps"] == theirs["steps"] and ours["metrics"] == theirs["metrics"]
    for key, tensor in theirs["weights"].items():
        assert torch.equal(ours["weights"][key], tensor), key
        assert torch.equal(loaded.state_dict()[key], tensor), key
    assert torch.equal(ours["predictions"], theirs["predictions"])
    assert ours["checkpoint"].name == theirs["checkpoint"].name
    assert set(their_file) <= set(our_file)  # GPUlayer adds its version and the RNG states
    for key in ("epoch", "global_step", "hparams_name", "pytorch-lightning_version"):
        assert our_file[key] == their_file[key], key
    assert sorted(our_file["hyper_parameters"]) == sorted(their_file["hyper_parameters"])
    assert sorted(our_file["dataset_parameters"]) == sorted(their_file["dataset_parameters"])
