"""When validation runs during fit: check_val_every_n_epoch, val_check_interval, the sanity check, and several
validation loaders. Scenarios with 20 training samples have 5 batches per epoch. Lightning 2.6's rule is
``_TrainingEpochLoop._should_check_val_fx`` in ``lightning/pytorch/loops/training_epoch_loop.py``.
"""

import pytest


def val_after(result):
    """(epoch, last training batch before it) for each in-fit validation run, read from the call record."""
    runs, last_batch = [], None
    for stage, epoch, batch_idx, _ in result.calls:
        if stage == "train":
            last_batch = (epoch, batch_idx)
        elif stage == "val" and batch_idx == 0:
            runs.append(last_batch)
    return runs


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        (dict(max_epochs=2), [(0, 4), (1, 4)]),
        (dict(max_epochs=2, val_check_interval=0.5), [(0, 1), (0, 3), (1, 1), (1, 3)]),  # none at epoch end
        (dict(max_epochs=2, val_check_interval=0.25), [(e, b) for e in (0, 1) for b in range(5)]),
        (dict(max_epochs=2, val_check_interval=1), [(e, b) for e in (0, 1) for b in range(5)]),  # int: batches
        (dict(max_epochs=2, val_check_interval=1.0), [(0, 4), (1, 4)]),
        (dict(max_epochs=2, val_check_interval=3), [(0, 2), (1, 2)]),
        (dict(max_epochs=2, val_check_interval=3, check_val_every_n_epoch=None), [(0, 2), (1, 0), (1, 3)]),
        (dict(max_epochs=4, check_val_every_n_epoch=2), [(1, 4), (3, 4)]),
        (dict(max_epochs=3, check_val_every_n_epoch=None), [(0, 4), (1, 4), (2, 4)]),
        (dict(max_epochs=2, limit_train_batches=0.5), [(0, 1), (1, 1)]),
        (dict(max_epochs=2, val_check_interval=2, accumulate_grad_batches=2), [(0, 1), (0, 3), (1, 1), (1, 3)]),
        # Time-based: after every batch once the interval has passed, and no automatic end-of-epoch run.
        (dict(max_epochs=2, val_check_interval={"seconds": 0}), [(e, b) for e in (0, 1) for b in range(5)]),
        (dict(max_epochs=2, val_check_interval="00:01:00:00"), []),
    ],
    ids=lambda value: str(value),
)
def test_validation_points(differential, trainer, expected):
    both = differential(trainer=dict(num_sanity_val_steps=0, **trainer), train_size=20)
    assert val_after(both.lightning) == expected


@pytest.mark.parametrize("steps", [0, 1, 2, -1])
def test_num_sanity_val_steps(differential, steps):
    """The sanity check runs min(steps, batches) per loader (-1: all); its metrics are discarded."""
    both = differential(trainer=dict(max_epochs=1, num_sanity_val_steps=steps), val_sizes=(10,))
    sanity = [call for call in both.lightning.calls if call[0] == "sanity"]
    assert len(sanity) == {0: 0, 1: 1, 2: 2, -1: 3}[steps]


def test_sanity_check_runs_per_validation_loader(differential):
    differential(trainer=dict(max_epochs=1, num_sanity_val_steps=1), val_sizes=(6, 10))


@pytest.mark.parametrize("framework", ["lightning", "gpulayer"])
def test_sanity_check_leaves_the_random_state_alone(run, framework):
    """Dropout and a shuffled loader use the global RNG: weights are bit-identical with and without sanity."""
    scenario = dict(trainer=dict(max_epochs=3), dropout=0.5, shuffle=True, val_sizes=(10,))
    with_sanity = run(framework, **scenario)
    without_sanity = run(framework, **{**scenario, "trainer": dict(max_epochs=3, num_sanity_val_steps=0)})
    for key, weight in with_sanity.weights.items():
        assert weight.equal(without_sanity.weights[key]), key


@pytest.mark.parametrize("sanity", [0, 2, -1])
def test_random_training_matches_lightning(differential, sanity):
    """Same dropout masks and shuffle order as Lightning: the number and order of RNG draws match."""
    differential(trainer=dict(max_epochs=3, num_sanity_val_steps=sanity), dropout=0.5, shuffle=True, val_sizes=(10,))


def test_two_validation_loaders(differential):
    """dataloader_idx is passed to the steps and hooks; metrics get a /dataloader_idx_N suffix."""
    both = differential(val_sizes=(6, 3), stages=("fit", "validate"))
    assert sorted(both.lightning.returned["validate"][1]) == ["val_loss/dataloader_idx_1"]


def test_two_validation_loaders_with_limits(differential):
    differential(val_sizes=(6, 10), trainer=dict(max_epochs=2, limit_val_batches=1, num_sanity_val_steps=2))


def test_validation_without_a_validation_step_is_skipped(differential):
    """A val loader but no validation_step: no validation and no sanity check (Lightning warns)."""
    differential(module={"validation_step": None}, documented_warning=True)
