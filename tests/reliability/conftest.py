"""The reliability suite: each case records what it measured, and ``nox -s reliability`` turns the records into
``docs/reliability.md`` (``tools/reliability_report.py``), so the table says what the suite last saw.

A test takes the ``outcome`` fixture and calls it once per case it proves::

    outcome("Faults", "SIGKILL of rank 1 mid-epoch", exit_status=-9, seconds_to_exit=1.2, processes_left=0,
            data_lost="none", result="the job ends naming rank 1")

Records are written only when ``GPULAYER_RELIABILITY_OUT`` names a folder (one JSON file per case).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

AREAS = ("Faults", "Preemption and restart", "Bad input", "Data and model faults", "Security")


@pytest.fixture
def outcome(request):
    folder = os.environ.get("GPULAYER_RELIABILITY_OUT")

    def record(area: str, case: str, **measured: object) -> None:
        assert area in AREAS, f"area {area!r}: one of {AREAS}"
        if not folder:
            return
        test = request.node.nodeid
        name = hashlib.sha1(f"{test}::{case}".encode()).hexdigest()[:16]
        entry = {"area": area, "case": case, "test": test, "measured": measured}
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.json").write_text(json.dumps(entry, default=str, indent=1))

    return record
