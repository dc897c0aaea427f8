"""Run one corpus script as ``python script.py`` would, then record what it trained: ``run_script.py SCRIPT OUT``.
A notebook runs as its code cells one after the other, without IPython's magics (``%...``, ``!...``).

The record (JSON, at OUT) holds the module-level ``trainer``'s class, ``global_step``, ``current_epoch`` and metric dicts,
every module-level variable whose name ends in ``results`` (what ``validate``/``test`` returned), the
module-level ``model``'s weights (``cli.trainer`` and ``cli.model`` for a LightningCLI script), and the scalars and
image steps of a TensorBoardLogger's event files, so that a Lightning run and a GPUlayer run of the same script can be
compared.
"""

import json
import os
import runpy
import sys
import warnings
from pathlib import Path

import torch


def _floats(metrics):
    return {name: float(value) for name, value in metrics.items()}


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


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


def _as_script(notebook: Path, script: Path) -> None:
    cells = json.loads(notebook.read_text())["cells"]
    code = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
    lines = [line for cell in code for line in cell.splitlines() if not line.lstrip().startswith(("%", "!"))]
    script.write_text("\n".join(lines) + "\n")


def main() -> None:
    script, out = sys.argv[1], sys.argv[2]
    if script.endswith(".ipynb"):
        _as_script(Path(script), Path(out).with_name("notebook.py"))
        script = str(Path(out).with_name("notebook.py"))
    sys.argv = [script]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python script.py does
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips and both frameworks' documented warnings
        namespace = runpy.run_path(script, run_name="__main__")
    trainer = namespace["trainer"] if "trainer" in namespace else namespace["cli"].trainer
    model = namespace["model"] if "model" in namespace else namespace["cli"].model
    record = {
        "trainer": f"{type(trainer).__module__}.{type(trainer).__qualname__}",
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "callback_metrics": _floats(trainer.callback_metrics),
        "logged_metrics": _floats(trainer.logged_metrics),
        "returned": {name: _plain(value) for name, value in namespace.items() if name.endswith("results")},
        "weights": {name: tensor.tolist() for name, tensor in model.state_dict().items()},
        "tensorboard": _tensorboard(trainer.logger),
    }
    with open(out, "w") as file:
        json.dump(record, file)


if __name__ == "__main__":
    main()
