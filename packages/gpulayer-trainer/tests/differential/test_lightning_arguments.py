"""Lightning's Trainer arguments for debugging and data: ``overfit_batches``, ``reload_dataloaders_every_n_epochs``,
``detect_anomaly``, ``barebones``, ``sync_batchnorm`` (on one DDP process), run under both frameworks.

The default scenario has 3 training batches per epoch (10 samples in batches of 4) and 2 validation batches.
"""

import pytest
import torch


@pytest.mark.parametrize("overfit", [1, 2, 0.5, 1.0])
@pytest.mark.parametrize("shuffle", [False, True])
def test_overfit_batches_trains_and_validates_on_the_first_batches_in_order(differential, overfit, shuffle):
    # shuffle=True: both frameworks remake the train loader with a SequentialSampler (and warn).
    differential(trainer={"max_epochs": 3, "overfit_batches": overfit}, shuffle=shuffle, documented_warning=shuffle)


def test_overfit_batches_wins_over_fast_dev_runs_limits(differential):
    differential(trainer={"fast_dev_run": 3, "overfit_batches": 1})


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("check_val_every_n_epoch", [1, 2])
@pytest.mark.parametrize("num_sanity_val_steps", [0, 2])
def test_reload_dataloaders_every_n_epochs_requests_the_loaders_when_lightning_does(
    differential, every, check_val_every_n_epoch, num_sanity_val_steps
):
    # The recorded hooks include every train_dataloader and val_dataloader call, in order with the epoch hooks.
    differential(
        trainer={
            "max_epochs": 5,
            "reload_dataloaders_every_n_epochs": every,
            "check_val_every_n_epoch": check_val_every_n_epoch,
            "num_sanity_val_steps": num_sanity_val_steps,
        }
    )


def test_reload_with_a_datamodule_and_validation_inside_the_epoch(differential):
    differential(
        trainer={"max_epochs": 4, "reload_dataloaders_every_n_epochs": 1, "val_check_interval": 2},
        data_source="datamodule",
    )


def test_detect_anomaly_trains_the_same(differential):
    differential(trainer={"max_epochs": 2, "detect_anomaly": True}, documented_warning=True)


def _nan_backward(self, batch, batch_idx):
    return torch.sqrt(self(batch[0]) - 1e6).sum() if batch_idx == 1 else self.loss(batch)


def test_detect_anomaly_names_the_backward_that_made_a_nan(run):
    for framework in ("lightning", "gpulayer"):
        with pytest.raises(RuntimeError, match="returned nan values"):
            run(
                framework,
                trainer={"max_epochs": 1, "detect_anomaly": True},
                module={"training_step": _nan_backward},
                documented_warning=True,
            )


def test_barebones_trains_the_same_and_logs_nothing(differential):
    # The scenario's steps call self.log: both frameworks warn that it records nothing.
    result = differential(trainer={"max_epochs": 2, "barebones": True}, documented_warning=True)
    assert result.gpulayer.callback_metrics["fit"] == {}


@pytest.mark.parametrize(
    "conflict",
    [
        {"enable_checkpointing": True},
        {"logger": True},
        {"enable_progress_bar": True},
        {"log_every_n_steps": 5},
        {"enable_model_summary": True},
        {"num_sanity_val_steps": 2},
        {"fast_dev_run": True},
        {"detect_anomaly": True},
    ],
    ids=lambda conflict: next(iter(conflict)),
)
def test_barebones_refuses_what_it_turns_off_as_lightning_does(lightning, gpulayer, tmp_path, conflict):
    for framework in (lightning, gpulayer):
        with pytest.raises(ValueError, match=next(iter(conflict))):
            framework.Trainer(barebones=True, default_root_dir=tmp_path, **conflict)
    assert not any(tmp_path.iterdir())


def test_sync_batchnorm_with_ddp_on_the_cpu_is_refused_at_construction(lightning, gpulayer, tmp_path):
    # torch's DDP refuses SyncBatchNorm on the CPU: Lightning fails when fit wraps the model, GPUlayer at once.
    # One device without DDP ignores the flag in both (Lightning's SingleDeviceStrategy has no layer sync).
    with pytest.raises(ValueError, match=r"sync_batchnorm=True with DDP on cpu"):
        gpulayer.Trainer(accelerator="cpu", strategy="ddp", devices=1, sync_batchnorm=True, default_root_dir=tmp_path)
    assert not any(tmp_path.iterdir())
    for framework in (lightning, gpulayer):
        assert framework.Trainer(accelerator="cpu", devices=1, sync_batchnorm=True, logger=False)
