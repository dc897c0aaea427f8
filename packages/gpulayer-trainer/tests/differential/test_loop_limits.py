"""Loop limits: max/min epochs and steps, max_time, limit_*_batches, fast_dev_run, should_stop, early epoch end.

The default scenario has 3 training batches per epoch (10 samples in batches of 4, the last one of 2) and
2 validation batches (6 samples).
"""

from datetime import timedelta

import pytest


def stop_at(epoch, batch):
    """A callback body for on_train_batch_end that sets ``trainer.should_stop`` after that batch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch_, batch_idx):
        if (trainer.current_epoch, batch_idx) == (epoch, batch):
            trainer.should_stop = True

    return on_train_batch_end


def stop_at_train_start(self, trainer, pl_module):
    trainer.should_stop = True


@pytest.mark.parametrize(
    ("trainer", "global_step", "current_epoch"),
    [
        (dict(max_epochs=1), 3, 1),
        (dict(max_epochs=3), 9, 3),
        (dict(max_epochs=0), 0, 0),
        (dict(max_steps=4), 4, 2),  # stops mid-epoch 1: on_train_epoch_end still runs, the epoch counts
        (dict(max_steps=7, max_epochs=-1), 7, 3),
        (dict(max_steps=2, max_epochs=5), 2, 1),  # max_steps first
        (dict(max_steps=20, max_epochs=2), 6, 2),  # max_epochs first
        (dict(max_steps=0, max_epochs=2), 0, 0),  # no training; the sanity check still runs
        (dict(max_epochs=2, min_epochs=3), 6, 2),  # min_epochs alone does not extend training
    ],
    ids=lambda value: str(value),
)
def test_epoch_and_step_limits(differential, trainer, global_step, current_epoch):
    both = differential(trainer=trainer)
    assert both.lightning.counters["fit"] == (global_step, current_epoch)


@pytest.mark.parametrize(
    ("trainer", "global_step", "current_epoch"),
    [
        (dict(max_epochs=5), 2, 1),  # validation runs right after the stopping batch, then the epoch ends
        (dict(max_epochs=5, min_epochs=2), 6, 2),  # keeps going until the minimum epochs are done
        (dict(max_epochs=5, min_steps=5), 5, 2),  # min_steps -> min_epochs 1; stops once 5 steps are done
    ],
    ids=lambda value: str(value),
)
def test_should_stop_in_on_train_batch_end(differential, trainer, global_step, current_epoch):
    """should_stop set after epoch 0 batch 1, with and without minimums (Lightning's ``_FitLoop._can_stop_early``)."""
    both = differential(trainer=trainer, callback={"on_train_batch_end": stop_at(0, 1)})
    assert both.lightning.counters["fit"] == (global_step, current_epoch)


def test_should_stop_in_on_train_start_runs_no_batch(differential):
    both = differential(callback={"on_train_start": stop_at_train_start})
    assert not [call for call in both.lightning.calls if call[0] == "train"]


def test_on_train_batch_start_returning_minus_one_ends_the_epoch(differential):
    """Batch 1 of every epoch returns -1: its training_step and on_train_batch_end do not run."""

    def on_train_batch_start(self, batch, batch_idx):
        return -1 if batch_idx == 1 else None

    both = differential(trainer=dict(max_epochs=3), module={"on_train_batch_start": on_train_batch_start})
    assert both.lightning.counters["fit"] == (3, 3)


@pytest.mark.parametrize(
    "max_time",
    ["99:00:00:00", "1:00:00:00", {"days": 99}, {"hours": 1.5}, timedelta(days=99)],
    ids=lambda value: repr(value),
)
def test_max_time_forms_that_never_trigger(differential, max_time):
    """A limit far away does not change anything; each accepted form of max_time is taken."""
    both = differential(trainer=dict(max_epochs=2, max_time=max_time))
    assert both.lightning.counters["fit"] == (6, 2)


def test_max_time_alone_makes_max_epochs_unlimited(differential):
    """With max_time and no max_epochs, max_epochs becomes -1, not 1000 (Lightning's ``_parse_loop_limits`` in
    ``lightning/pytorch/loops/utilities.py``): max_steps ends training."""
    both = differential(trainer=dict(max_time={"days": 1}, max_steps=8), estimate_stepping_batches=True)
    assert both.lightning.counters["fit"] == (8, 3)
    assert both.lightning.estimated_stepping_batches == 8


def test_max_time_of_zero_seconds_stops_at_once(differential):
    """The Timer also checks at on_fit_start: a zero duration sets should_stop there, so no epoch starts."""
    both = differential(trainer=dict(max_epochs=3, max_time={"seconds": 0}))
    assert both.lightning.counters["fit"] == (0, 0)


@pytest.mark.parametrize(
    "limits",
    [
        dict(limit_train_batches=2),
        dict(limit_train_batches=0.5),  # int(3 * 0.5) = 1 batch
        dict(limit_train_batches=1.0),  # 100 %, not one batch
        dict(limit_train_batches=1),  # one batch
        dict(limit_train_batches=0),  # no training; sanity check still runs
        dict(limit_train_batches=10),  # more than there are
        dict(limit_val_batches=1),
        dict(limit_val_batches=0.5),
        dict(limit_val_batches=0),  # no validation and no sanity check
        dict(limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=-1),
    ],
    ids=lambda value: str(value),
)
def test_limit_batches_during_fit(differential, limits):
    differential(trainer=dict(max_epochs=2, **limits))


@pytest.mark.parametrize(
    "limits",
    [
        dict(limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1),
        dict(limit_val_batches=0.5, limit_test_batches=0.5, limit_predict_batches=0.5),
        dict(limit_val_batches=0, limit_test_batches=0, limit_predict_batches=0),
    ],
    ids=lambda value: str(value),
)
def test_limit_batches_of_evaluation_entry_points(differential, limits):
    differential(trainer=limits, stages=("validate", "test", "predict"), test_size=10, predict_size=10, val_sizes=(10,))


@pytest.mark.parametrize("fast_dev_run", [True, 1, 2])
def test_fast_dev_run(differential, fast_dev_run):
    """Overrides limits, max_steps, max_epochs and sanity steps, whatever else is set."""
    both = differential(
        trainer=dict(fast_dev_run=fast_dev_run, max_epochs=5, limit_train_batches=3, num_sanity_val_steps=2),
        stages=("fit", "validate", "test", "predict"),
        estimate_stepping_batches=True,
    )
    steps = 1 if fast_dev_run is True else fast_dev_run
    assert both.lightning.counters["fit"] == (steps, 1)
    assert both.lightning.estimated_stepping_batches == steps


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        (dict(max_epochs=3), 9),
        (dict(max_epochs=3, accumulate_grad_batches=2), 6),  # ceil(3 / 2) per epoch
        (dict(max_epochs=3, accumulate_grad_batches=4), 3),
        (dict(max_epochs=3, max_steps=7), 7),
        (dict(max_epochs=-1, max_steps=5), 5),
        (dict(max_epochs=3, limit_train_batches=2), 6),
        (dict(max_epochs=3, limit_train_batches=0.7, accumulate_grad_batches=2), 3),  # int(3 * 0.7) = 2 batches
        (dict(max_epochs=3, accumulate_grad_batches=2, max_steps=5), 5),
        (dict(max_epochs=3, fast_dev_run=2, accumulate_grad_batches=2), 1),  # 2 batches, 1 epoch: ceil(2 / 2)
        (dict(max_epochs=2, check_val_every_n_epoch=None, val_check_interval=2), 6),
    ],
    ids=lambda value: str(value),
)
def test_estimated_stepping_batches(differential, trainer, expected):
    """Read inside configure_optimizers, where schedulers such as OneCycleLR need it."""
    both = differential(trainer=trainer, estimate_stepping_batches=True)
    assert both.lightning.estimated_stepping_batches == expected


def test_estimated_stepping_batches_with_no_limits_is_one_thousand_epochs(differential):
    """max_epochs defaults to 1000 (Lightning warns); training is stopped at on_train_start."""
    both = differential(
        trainer={},
        estimate_stepping_batches=True,
        callback={"on_train_start": stop_at_train_start},
        documented_warning=True,
    )
    assert both.lightning.estimated_stepping_batches == 3000


def test_estimated_stepping_batches_with_max_epochs_zero(differential):
    """max_epochs=0 still estimates one epoch of steps (the `max(max_epochs, 1)` in Lightning's
    ``Trainer.estimated_stepping_batches``)."""
    both = differential(trainer=dict(max_epochs=0), estimate_stepping_batches=True)
    assert both.lightning.estimated_stepping_batches == 3


def stop_in(hook, epoch=0):
    """A callback body for ``hook`` that sets should_stop the first time it runs in ``epoch`` (outside sanity)."""

    def body(self, trainer, pl_module, *args):
        if trainer.current_epoch == epoch and not self._recorder.sanity_checking:
            trainer.should_stop = True

    body.__name__ = hook
    return body


@pytest.mark.parametrize(
    ("hook", "trainer"),
    [
        ("on_train_epoch_start", dict(max_epochs=3)),
        ("on_train_epoch_end", dict(max_epochs=3)),
        ("on_validation_end", dict(max_epochs=3, val_check_interval=1)),  # stops after a mid-epoch validation
        ("on_validation_end", dict(max_epochs=3, val_check_interval=1, min_epochs=2)),
        ("on_train_epoch_end", dict(max_epochs=3, min_steps=4)),
        ("on_sanity_check_end", dict(max_epochs=3)),
        ("on_fit_start", dict(max_epochs=3)),
    ],
    ids=lambda value: str(value),
)
def test_should_stop_set_in_other_hooks(differential, hook, trainer):
    differential(trainer=trainer, callback={hook: stop_in(hook)})


@pytest.mark.parametrize(
    "trainer",
    [dict(max_epochs=1, min_steps=10), dict(max_epochs=1, min_epochs=3), dict(max_steps=2, min_epochs=2)],
    ids=lambda value: str(value),
)
def test_maximums_win_over_minimums(differential, trainer):
    differential(trainer=trainer)
