"""What the differential callback tests share: Lightning's and GPUlayer's classes side by side."""

import contextlib
import logging
import warnings
from types import SimpleNamespace

import gpulayer.trainer as gl

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import lightning.pytorch as pl

LIGHTNING_OPTIONS = {"enable_progress_bar": False, "enable_model_summary": False}


def frameworks(**classes: tuple) -> dict[str, SimpleNamespace]:
    """``{"lightning": ..., "gpulayer": ...}``, each with its ``Trainer``, ``Module``, ``Callback``, ``Checkpoint``,
    ``CSVLogger``, the Trainer ``options`` that quiet Lightning's display, and each ``name=(lightning's, gpulayer's)``
    given."""
    return {
        "lightning": SimpleNamespace(
            Trainer=pl.Trainer,
            Module=pl.LightningModule,
            Callback=pl.Callback,
            Checkpoint=pl.callbacks.Checkpoint,
            CSVLogger=pl.loggers.CSVLogger,
            options=dict(LIGHTNING_OPTIONS),
            **{name: pair[0] for name, pair in classes.items()},
        ),
        "gpulayer": SimpleNamespace(
            Trainer=gl.Trainer,
            Module=gl.Module,
            Callback=gl.Callback,
            Checkpoint=gl.Checkpoint,
            CSVLogger=gl.CSVLogger,
            options={},
            **{name: pair[1] for name, pair in classes.items()},
        ),
    }


class FakeClock:
    """A clock (``time.monotonic``, ``time.perf_counter``) for a test: it moves only when ``advance`` is called."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextlib.contextmanager
def info_messages(logger_name: str):
    """The INFO messages of one logger, whatever level other tests left its parents at (Lightning's loggers do not
    propagate to pytest's caplog)."""
    messages = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
