"""Turn the reliability suite's records into ``docs/reliability.md``, or check that file against them.

``python tools/reliability_report.py RECORDS docs/reliability.md`` writes the report from the JSON records the suite
left in RECORDS (``GPULAYER_RELIABILITY_OUT``, see ``tests/reliability/conftest.py``); ``--check`` instead fails when
the report lists other cases than the records do, so a case added or dropped cannot leave the table stale. The
report's hand-written part, from its ``## Flake hunts`` heading on, is kept as it is.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

AREAS = (
    "Faults",
    "Preemption and restart",
    "Bad input",
    "Data and model faults",
    "Checkpoint writes",
    "Security",
    "Known gaps",
)
# The columns every area shows, in order, when any of its cases measured them; ``result`` comes last.
COLUMNS = {
    "exit_status": "exit",
    "seconds_to_exit": "time to exit (s)",
    "rank_seconds_to_exit": "failing rank's exit (s)",
    "processes_left": "processes left",
    "files_written": "files written",
    "data_lost": "data lost",
}
HAND_WRITTEN = "\n## Flake hunts"
HEADER = """# Reliability: what the suite measured

Every row below is a case of the reliability suite (`tests/reliability/`), as measured by its last run on a 2-core
CPU machine with gloo (times are from the fault to the job's exit; "failing rank's exit" is from the exception to the
end of the process that raised it): `nox -s reliability` runs the suite and rewrites this file, and CI fails when the
cases here differ from the suite's. A "Known gaps" section, when there is one, lists the cases the suite expects to
fail (strict xfail), each with what is missing; its test turns red the day it is fixed.
"""


def load(records: Path) -> list[dict]:
    entries = [json.loads(path.read_text()) for path in sorted(records.glob("*.json"))]
    if not entries:
        raise SystemExit(f"{records}: no reliability records; run the suite with GPULAYER_RELIABILITY_OUT={records}")
    unknown = {e["area"] for e in entries} - set(AREAS)
    if unknown:
        raise SystemExit(f"records of unknown areas {sorted(unknown)}; known: {AREAS}")
    return sorted(entries, key=lambda e: (AREAS.index(e["area"]), e["test"], e["case"]))


def render(entries: list[dict], hand_written: str = "") -> str:
    parts = [HEADER]
    for area in AREAS:
        rows = [e for e in entries if e["area"] == area]
        if not rows:
            continue
        columns = [key for key in COLUMNS if any(key in e["measured"] for e in rows)]
        parts.append(f"\n## {area} ({len(rows)} case{'s' if len(rows) > 1 else ''})\n")
        parts.append(_row(["case", *(COLUMNS[c] for c in columns), "result", "test"]))
        parts.append(_row(["---", *("---" if c == "data_lost" else "---:" for c in columns), "---", "---"]))
        for entry in rows:
            measured = entry["measured"]
            cells = [_cell(entry["case"]), *(_cell(measured.get(c, "")) for c in columns)]
            parts.append(_row([*cells, _cell(measured.get("result", "")), f"`{_test_name(entry['test'])}`"]))
    return "\n".join(parts) + "\n" + hand_written


def hand_written_part(report: str) -> str:
    """The part of an existing report that no record writes: from the ``## Flake hunts`` heading to the end."""
    start = report.find(HAND_WRITTEN)
    return report[start:] if start != -1 else ""


def cases_in(report: str) -> set[tuple[str, str]]:
    """(area, case) of every row of a report."""
    found, area = set(), None
    for line in report.splitlines():
        if heading := re.match(r"## (.+) \(\d+ cases?\)$", line):
            area = heading.group(1)
        elif line.startswith("## "):  # a hand-written section: its tables are not cases
            area = None
        elif area and line.startswith("| ") and not line.startswith(("| case |", "| --- |")):
            found.add((area, line[2:].split(" | ", 1)[0].replace("\\|", "|")))
    return found


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _test_name(nodeid: str) -> str:
    return nodeid.rsplit("/", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, help="the folder GPULAYER_RELIABILITY_OUT named")
    parser.add_argument("report", type=Path, help="docs/reliability.md")
    parser.add_argument("--check", action="store_true", help="compare the report's cases with the records'")
    args = parser.parse_args(argv)
    entries = load(args.records)
    if not args.check:
        existing = args.report.read_text() if args.report.exists() else ""
        args.report.write_text(render(entries, hand_written_part(existing)))
        print(f"{args.report}: {len(entries)} cases")
        return 0
    expected = {(e["area"], _cell(e["case"]).replace("\\|", "|")) for e in entries}
    listed = cases_in(args.report.read_text()) if args.report.exists() else set()
    if expected == listed:
        print(f"{args.report}: its {len(listed)} cases are the suite's")
        return 0
    for area, case in sorted(expected - listed):
        print(f"{args.report}: missing {area}: {case}", file=sys.stderr)
    for area, case in sorted(listed - expected):
        print(f"{args.report}: no longer in the suite {area}: {case}", file=sys.stderr)
    print("run `nox -s reliability` to rewrite it", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
