"""The same script under Lightning 2.6 DDP and GPUlayer DDP, 2 processes each on gloo: the same weights,
``global_step``, ``current_epoch`` and, on every rank, the same ``callback_metrics`` (with and without
``sync_dist``)."""

import pytest

from .conftest import assert_same_weights, train

pytestmark = pytest.mark.multiprocess

SCENARIOS = {
    # Shuffled (the injected DistributedSampler), validation, synced and rank-local metrics, accumulation with a
    # trailing window and clipping.
    "accumulate_clip_sync": {"sync": True, "accumulate": 3, "clip": 0.5, "max_epochs": 2},
    # Stopped by max_steps in the middle of an epoch, log steps every 3, rank-local metrics only.
    "max_steps_mid_epoch": {"max_steps": 5, "log_every_n_steps": 3, "shuffle": False},
    # Manual optimization: two optimizers, each toggled, two backward passes in one DDP forward per step.
    "manual_two_optimizers": {"manual": True, "sync": True, "strategy": "ddp_find_unused_parameters_true"},
    # Manual optimization accumulating 2 batches by hand, the first of each pair under block_backward_sync.
    "manual_accumulate_without_sync": {"manual_accumulate": 2, "max_epochs": 1},
}


@pytest.mark.parametrize(
    ("scenario", "ours_on"),
    [
        *((scenario, "gpulayer") for scenario in SCENARIOS),
        # The module on Lightning's class, as a library ships one, trained by GPUlayer's DDP (ADR 0031).
        ("manual_two_optimizers", "gpulayer-lightning-module"),
    ],
)
def test_ddp_trains_exactly_as_lightning_ddp(tmp_path, scenario, ours_on):
    options = SCENARIOS[scenario]
    theirs = train("lightning", tmp_path / "lightning", **options)
    ours = train(ours_on, tmp_path / "gpulayer", **options)
    assert len(theirs) == len(ours) == 2
    for rank, (expected, actual) in enumerate(zip(theirs, ours, strict=True)):
        assert actual["world_size"] == expected["world_size"] == 2
        assert (actual["global_step"], actual["current_epoch"]) == (expected["global_step"], expected["current_epoch"])
        assert actual["seen"] == expected["seen"], f"rank {rank} trained on other batches"
        assert actual["callback_metrics"] == expected["callback_metrics"], f"rank {rank}"
        assert_same_weights(expected["weights"], actual["weights"])
        assert actual["reductions"] == expected["reductions"]
    # The ranks read different shards, and the metrics without sync_dist stay each rank's own.
    assert ours[0]["seen"] != ours[1]["seen"]
    assert ours[0]["callback_metrics"]["train_loss"] != ours[1]["callback_metrics"]["train_loss"]
    if options.get("manual_accumulate"):  # one bucket reduced on each of the 4 stepping batches of 8, none between
        assert ours[0]["reductions"] == ours[1]["reductions"] == 4
    if options.get("sync"):
        assert ours[0]["callback_metrics"]["val_loss_sync"] == ours[1]["callback_metrics"]["val_loss_sync"]
