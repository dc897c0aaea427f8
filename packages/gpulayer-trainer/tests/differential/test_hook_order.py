"""Hook order of a recording Callback and Module: every `Trainer` entry point, as Lightning 2.6 calls them."""

import pytest


def test_fit_hook_order_matches_the_reference_trace(differential):
    """2 epochs x 2 batches, 1 val batch, 1 sanity batch: 164 calls (checkpointing is off: no checkpoint hooks)."""
    both = differential(trainer=dict(max_epochs=2, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1))
    assert len(both.lightning.hooks["fit"]) == 164


def test_fit_then_validate_test_predict(differential):
    """Each entry point on the same Trainer after fit: hooks, counters, metrics and return values."""
    both = differential(stages=("fit", "validate", "test", "predict"))
    assert both.lightning.counters == {stage: (6, 2) for stage in ("fit", "validate", "test", "predict")}


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_standalone_evaluation_entry_point(differential, stage):
    """validate/test/predict on a fresh Trainer: no fit hooks, no sanity check, no configure_optimizers."""
    both = differential(stages=(stage,))
    assert not any("configure_optimizers" in hook for hook in both.lightning.hooks[stage])


def test_fit_without_validation(differential):
    """No validation_step and no val loader: no sanity check, no validation hooks."""
    differential(val_sizes=())


def test_loaders_passed_to_the_entry_points(differential):
    """Loaders given as fit/validate/test/predict arguments instead of module hooks."""
    differential(data_source="arguments", stages=("fit", "validate", "test", "predict"))


def test_fit_twice_on_the_same_trainer_does_nothing_the_second_time(differential):
    """Progress is not reset (Lightning's ``_FitLoop.done``), so a second fit after max_epochs runs no epoch (and no
    on_train_start)."""
    both = differential(stages=("fit", "fit"))
    assert both.lightning.counters["fit"] == (6, 2)
