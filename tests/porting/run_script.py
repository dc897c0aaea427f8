"""Run one corpus script as ``python script.py`` would, recorded: ``run_script.py SCRIPT OUT``.

The record (``torch.save``, at OUT) is gpulayer-port's (``gpulayer.port.recording``, what ``gpulayer port --verify``
compares), taken with the script's own Trainer arguments, plus the scalars and image steps of a TensorBoardLogger's
event files, read from the last Trainer's logger.
"""

import os
import sys
import warnings
from pathlib import Path

import torch

from gpulayer.port.recording import Recorder
from gpulayer.port.run_recorded import run_script


def _tensorboard(logger):
    """Each scalar's (step, value) and each image tag's steps, from a TensorBoardLogger's folder (else None)."""
    if type(logger).__name__ != "TensorBoardLogger":
        return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    return {
        "scalars": {tag: [[event.step, event.value] for event in events.Scalars(tag)] for tag in tags["scalars"]},
        "images": {tag: [event.step for event in events.Images(tag)] for tag in tags["images"]},
        "log_dir": os.path.relpath(logger.log_dir),
    }


def main() -> None:
    script, out = Path(sys.argv[1]).resolve(), sys.argv[2]
    recorder = Recorder(Path.cwd())
    recorder.install()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips and both frameworks' documented warnings
        error = run_script(script, [])
    record = recorder.record(error)
    record["tensorboard"] = _tensorboard(recorder.last_trainer.logger) if recorder.last_trainer else None
    torch.save(record, out)


if __name__ == "__main__":
    main()
