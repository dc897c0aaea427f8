"""One run of ``gpulayer port --verify``: ``python -m gpulayer.port.run_recorded RECORD STEPS SCRIPT [ARGS...]`` runs
SCRIPT as ``python SCRIPT ARGS...`` would, seeded, with every Trainer recorded and capped at STEPS (``none``: as the
script builds it), and saves the record to RECORD (``torch.save``). A notebook runs as its code cells in order,
without IPython's magics (``%...``, ``!...``).
"""

from __future__ import annotations

import json
import random
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from gpulayer.port.recording import Recorder

SEED = 0


def run_script(script: Path, args: list[str]) -> dict[str, Any] | None:
    """Run ``script`` as ``__main__``, with ``sys.argv`` and ``sys.path`` as ``python SCRIPT ARGS...`` sets them;
    how it ended when it raised (``SystemExit`` with status 0 or None is an end), else None."""
    sys.argv = [str(script), *args]
    sys.path[0] = str(script.parent)
    try:
        if script.suffix == ".ipynb":
            exec(compile(notebook_code(script), str(script), "exec"), {"__name__": "__main__"})
        else:
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit:
        if exit.code not in (None, 0):
            return {"text": f"SystemExit: {exit.code}", "missing_module": None}
    except BaseException as error:
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        return {"text": traceback.format_exc(), "missing_module": missing}
    return None


def notebook_code(notebook: Path) -> str:
    """A notebook's code cells, one after the other, without IPython's magics."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    code = ["".join(cell["source"]) for cell in cells if cell.get("cell_type") == "code"]
    return "".join(
        line + "\n" for cell in code for line in cell.splitlines() if not line.lstrip().startswith(("%", "!"))
    )


def seed(value: int = SEED) -> None:
    """Python's, NumPy's and torch's generators, for a script that seeds none itself."""
    random.seed(value)
    torch.manual_seed(value)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(value)


def main(argv: list[str] | None = None) -> int:
    record_path, steps, script, *args = sys.argv[1:] if argv is None else argv
    recorder = Recorder(Path.cwd(), None if steps == "none" else int(steps))
    recorder.install()
    seed()
    started = time.monotonic()
    error = run_script(Path(script).resolve(), args)
    record = recorder.record(error)
    record["seconds"] = time.monotonic() - started
    torch.save(record, record_path)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
