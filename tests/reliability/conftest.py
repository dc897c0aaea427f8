"""The reliability suite: each case records what it measured, and ``nox -s reliability`` turns the records into
``docs/reliability.md`` (``tools/reliability_report.py``), so the table says what the suite last saw.

A test takes the ``outcome`` fixture and calls it once per case it proves::

    outcome("Faults", "SIGKILL of rank 1 mid-epoch", exit_status=-9, seconds_to_exit=1.2, processes_left=0,
            data_lost="none", result="the job ends naming rank 1")

Records are written only when ``GPULAYER_RELIABILITY_OUT`` names a folder (one JSON file per case). A test the
suite expects to fail (strict xfail) is recorded by itself, under "Known gaps", with its reason.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

AREAS = ("Faults", "Preemption and restart", "Bad input", "Data and model faults", "Checkpoint writes", "Security")
KNOWN_GAPS = "Known gaps"


@pytest.fixture
def outcome(request):
    def record(area: str, case: str, **measured: object) -> None:
        assert area in AREAS, f"area {area!r}: one of {AREAS}"
        _write(request.node.nodeid, area, case, measured)

    return record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" and getattr(report, "wasxfail", None):
        case = item.name.removeprefix("test_").replace("_", " ")
        _write(item.nodeid, KNOWN_GAPS, case, {"result": report.wasxfail})
    return report


def _write(test: str, area: str, case: str, measured: dict) -> None:
    folder = os.environ.get("GPULAYER_RELIABILITY_OUT")
    if not folder:
        return
    name = hashlib.sha1(f"{test}::{case}".encode()).hexdigest()[:16]
    entry = {"area": area, "case": case, "test": test, "measured": measured}
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{name}.json").write_text(json.dumps(entry, default=str, indent=1))
