"""``trainer.state`` (``fn``, ``status``, ``stage``) and the stage flags (``training``, ``validating``, ``testing``,
``predicting``, ``sanity_checking``, ``evaluating``, ``interrupted``), read in hooks of every entry point."""

import re

import pytest


def _state(trainer) -> tuple:
    state = trainer.state
    flags = ("training", "validating", "testing", "predicting", "sanity_checking", "evaluating", "interrupted")
    return (
        state.fn.value if state.fn is not None else None,
        state.status.value,
        state.stage.value if state.stage is not None else None,
        state.finished,
        state.stopped,
        *(getattr(trainer, flag) for flag in flags),
    )


def _recording(hook):
    def body(self, trainer, pl_module, *args, **kwargs):
        pl_module.record(hook, _state(trainer))

    return body


HOOKS = (
    "setup",
    "on_sanity_check_start",
    "on_train_start",
    "on_train_batch_start",
    "on_validation_batch_start",
    "on_validation_end",
    "on_train_epoch_end",
    "on_fit_end",
    "on_test_batch_start",
    "on_predict_batch_start",
    "on_exception",
    "teardown",
)


def _after(trainer):
    trainer.lightning_module.record("after", _state(trainer))


def test_the_state_in_every_hook_and_after_every_entry_point(differential):
    differential(
        trainer={"max_epochs": 2, "val_check_interval": 2},
        stages=("fit", "validate", "test", "predict"),
        callback={hook: _recording(hook) for hook in HOOKS},
        after=_after,
    )


def _raise_in_training_step(self, batch, batch_idx):
    raise RuntimeError("stop here")


def test_an_exception_leaves_the_trainer_interrupted(differential):
    differential(
        trainer={"max_epochs": 1},
        module={"training_step": _raise_in_training_step},
        callback={hook: _recording(hook) for hook in HOOKS},
        expect_error=True,
        after=None,
    )


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_the_state_of_each_evaluation_alone(differential, stage):
    differential(stages=(stage,), callback={hook: _recording(hook) for hook in HOOKS}, after=_after)


@pytest.mark.parametrize("name", ["TrainerStatus", "TrainerFn", "RunningStage"])
def test_the_state_enums_compare_hash_and_parse_as_lightnings(name):
    """User callbacks compare ``trainer.state.fn`` with these (``from lightning.pytorch.trainer.states import ...``,
    ported to ``gpulayer.trainer``): the same members, the same answers to every comparison, hash and parse."""
    import warnings

    import gpulayer.trainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from lightning.pytorch.trainer import states

    theirs, ours = getattr(states, name), getattr(gpulayer.trainer, name)
    assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]
    probes = [m.value for m in theirs] + [m.value.upper() for m in theirs] + [m.name for m in theirs] + ["", "other"]
    for member, their in zip(ours, theirs, strict=True):
        assert [member == probe for probe in probes] == [their == probe for probe in probes]
        assert [member == other for other in theirs] == [their == other for other in theirs]
        assert hash(member) == hash(their)
    for flag in ("evaluating", "dataloader_prefix"):  # RunningStage's
        assert [getattr(m, flag, None) for m in ours] == [getattr(m, flag, None) for m in theirs]
    for source in ("key", "value", "any"):
        for probe in probes:
            try:
                expected = theirs.from_str(probe, source).name
            except ValueError as error:
                with pytest.raises(ValueError, match=f"^{re.escape(str(error))}$"):
                    ours.from_str(probe, source)
            else:
                assert ours.from_str(probe, source).name == expected
    with pytest.warns(UserWarning, match=r"Invalid string: expected one of .*, but got nothing\.") as ours_warned:
        assert ours.try_from_str("nothing") is None
    with pytest.warns(UserWarning) as their_warned:
        assert theirs.try_from_str("nothing") is None
    assert str(ours_warned[0].message) == str(their_warned[0].message)


def test_the_trainer_state_has_lightnings_fields_and_properties():
    from lightning.pytorch.trainer.states import TrainerState as Theirs

    from gpulayer.trainer import TrainerState

    ours, theirs = TrainerState(), Theirs()
    assert (ours.status, ours.fn, ours.stage, ours.finished, ours.stopped) == (
        theirs.status,
        theirs.fn,
        theirs.stage,
        theirs.finished,
        theirs.stopped,
    )
    assert [f for f in vars(ours)] == [f for f in vars(theirs)]
