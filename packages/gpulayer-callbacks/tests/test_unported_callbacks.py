"""A Lightning callback passed to GPUlayer's Trainer unported is refused, naming GPUlayer's callback of that name:
every callback both export."""

import warnings

import pytest

import gpulayer.callbacks
import gpulayer.trainer as gl

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import lightning.pytorch.callbacks as lightning_callbacks

BASES = {"Callback", "Checkpoint"}  # GPUlayer's are gpulayer.trainer's, and a subclass of Lightning's is taken
BOTH = sorted(set(gpulayer.callbacks.__all__) & set(lightning_callbacks.__all__) - BASES)


def test_gpulayer_has_every_lightning_callback_but_the_tuners_and_the_display_ones():
    display = {"ModelSummary", "RichModelSummary", "ProgressBar", "RichProgressBar", "TQDMProgressBar"}
    tuners = {"BatchSizeFinder", "LearningRateFinder"}
    assert set(lightning_callbacks.__all__) - set(BOTH) - BASES == display | tuners


@pytest.mark.parametrize("name", BOTH)
def test_lightnings_callback_is_refused_naming_gpulayers(tmp_path, name):
    lightnings = getattr(lightning_callbacks, name)
    unbuilt = object.__new__(lightnings)  # the refusal reads the class alone
    with pytest.raises(TypeError, match=f"Lightning's {name} .*: use gpulayer.callbacks.{name}$"):
        gl.Trainer(callbacks=[unbuilt], default_root_dir=tmp_path)
