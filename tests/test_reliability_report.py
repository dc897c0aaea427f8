"""docs/reliability.md is written from the suite's records, and --check fails when its cases differ from them."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import reliability_report  # noqa: E402

sys.path.pop(0)


def _record(folder: Path, name: str, area: str, case: str, **measured) -> None:
    folder.mkdir(exist_ok=True)
    entry = {"area": area, "case": case, "test": f"tests/reliability/test_x.py::{name}", "measured": measured}
    (folder / f"{name}.json").write_text(json.dumps(entry))


def test_the_report_lists_every_case_by_area_with_what_it_measured(tmp_path):
    records, report = tmp_path / "records", tmp_path / "reliability.md"
    _record(records, "a", "Security", "pickle | payload", result="refused")
    _record(records, "b", "Faults", "SIGKILL", exit_status=1, seconds_to_exit=1.5, processes_left=0, result="ends")
    assert reliability_report.main([str(records), str(report)]) == 0
    text = report.read_text()
    assert text.index("## Faults (1 case)") < text.index("## Security (1 case)")
    assert "| SIGKILL | 1 | 1.5 | 0 | ends | `test_x.py::b` |" in text
    assert reliability_report.cases_in(text) == {("Faults", "SIGKILL"), ("Security", "pickle | payload")}
    assert reliability_report.main(["--check", str(records), str(report)]) == 0


def test_check_fails_when_the_suite_gained_or_lost_a_case(tmp_path, capsys):
    records, report = tmp_path / "records", tmp_path / "reliability.md"
    _record(records, "a", "Faults", "SIGKILL", result="ends")
    reliability_report.main([str(records), str(report)])
    _record(records, "b", "Bad input", "devices=0", result="refused")
    (records / "a.json").unlink()
    assert reliability_report.main(["--check", str(records), str(report)]) == 1
    errors = capsys.readouterr().err
    assert "missing Bad input: devices=0" in errors and "no longer in the suite Faults: SIGKILL" in errors


def test_the_hand_written_flake_hunts_survive_a_rewrite_and_are_no_cases(tmp_path):
    records, report = tmp_path / "records", tmp_path / "reliability.md"
    _record(records, "a", "Faults", "SIGKILL", result="ends")
    reliability_report.main([str(records), str(report)])
    hunts = "\n## Flake hunts\n\n| run | result |\n| --- | --- |\n| full 1 | passed |\n"
    report.write_text(report.read_text() + hunts)
    _record(records, "b", "Faults", "SIGTERM", result="ends")
    assert reliability_report.main([str(records), str(report)]) == 0
    text = report.read_text()
    assert text.endswith(hunts) and "| SIGTERM |" in text
    assert reliability_report.cases_in(text) == {("Faults", "SIGKILL"), ("Faults", "SIGTERM")}
