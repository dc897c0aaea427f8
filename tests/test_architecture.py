"""ARCHITECTURE.md names only modules that exist, and lists every module of gpulayer-trainer."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINER = ROOT / "packages" / "gpulayer-trainer" / "src" / "gpulayer" / "trainer"


def test_architecture_lists_every_trainer_module_and_no_missing_one():
    named = set(re.findall(r"`(packages/[^`\s]+\.py)`", (ROOT / "ARCHITECTURE.md").read_text()))
    gone = sorted(path for path in named if not (ROOT / path).is_file())
    assert gone == [], f"ARCHITECTURE.md names modules that do not exist: {gone}"
    modules = {str(path.relative_to(ROOT)) for path in TRAINER.rglob("*.py")}
    missing = sorted(modules - named)
    assert missing == [], f"gpulayer-trainer modules not listed in ARCHITECTURE.md: {missing}"
