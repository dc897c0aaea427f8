"""``trainer.state`` (``fn``, ``status``, ``stage``) and the stage flags (``training``, ``validating``, ``testing``,
``predicting``, ``sanity_checking``, ``evaluating``, ``interrupted``), read in hooks of every entry point."""

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
