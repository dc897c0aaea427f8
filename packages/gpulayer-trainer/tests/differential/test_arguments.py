"""Trainer arguments Lightning rejects at construction are rejected by GPUlayer at construction too.

Only the fact of rejection is compared: Lightning raises MisconfigurationException, ValueError or TypeError
depending on the argument, and GPUlayer is free to choose its own message.
"""

import warnings

import pytest

REJECTED = [
    dict(max_epochs=-2),
    dict(max_steps=-2),
    dict(fast_dev_run=-1),
    dict(limit_train_batches=1.5),
    dict(limit_val_batches=-1),
    dict(limit_test_batches=-0.5),
    dict(limit_predict_batches=1.5),
    dict(val_check_interval=0.5, check_val_every_n_epoch=None),
    dict(check_val_every_n_epoch=1.0),
    dict(gradient_clip_val=0.5, gradient_clip_algorithm="bogus"),
    dict(gradient_clip_val="0.5"),
    dict(precision="fp16"),
    dict(max_time="00:1:00:00"),
    dict(max_time="00:00:00:00.5"),
    dict(accelerator="bogus"),
    dict(devices=0),
    dict(devices=-1),  # CPU: a positive int or numeric string only
]


def construct(framework, root, arguments):
    return framework.Trainer(**{**framework.trainer_defaults, "default_root_dir": root, **arguments})


def assert_rejects(framework, root, arguments):
    with pytest.raises(Exception) as caught:  # only the fact of rejection is compared
        construct(framework, root, arguments)
    message = str(caught.value)
    assert "unexpected keyword" not in message and "multiple values" not in message, message


@pytest.mark.parametrize("arguments", REJECTED, ids=lambda value: str(value))
def test_rejected_at_construction(lightning, gpulayer, tmp_path, arguments):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_rejects(lightning, tmp_path, arguments)
    assert_rejects(gpulayer, tmp_path, arguments)


@pytest.mark.parametrize(
    "arguments",
    [
        dict(limit_train_batches=2.0),  # an integral float > 1 means 2 batches
        dict(max_time="1:00:00:00"),
        dict(max_time={"minutes": 0.5}),
        dict(gradient_clip_val=1, gradient_clip_algorithm="VALUE"),
        dict(precision="bf16-mixed"),
        dict(val_check_interval=0.0),
        dict(devices="1"),
    ],
    ids=lambda value: str(value),
)
def test_accepted_at_construction(lightning, gpulayer, tmp_path, arguments):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        construct(lightning, tmp_path, arguments)
    construct(gpulayer, tmp_path, arguments)
