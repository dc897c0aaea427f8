"""ARCHITECTURE.md names only modules that exist, lists every module of gpulayer-trainer, and lists the private
APIs of torch and torchmetrics that GPUlayer uses exactly as their pinning tests do."""

import ast
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


def test_every_private_api_listed_has_its_pinning_test_and_every_pinning_test_is_listed():
    section = (ROOT / "ARCHITECTURE.md").read_text().split("\n## Private APIs of torch and torchmetrics\n")[1]
    section = section.split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)/(\w+\.py)` \| `([^`]+)`[^|]*\|.*\| `(test_\w+)` \|$", section, re.MULTILINE)
    table = [line for line in section.splitlines() if line.startswith("|")][2:]  # below the header and its rule
    assert len(rows) == len(table) > 0, "each row reads | `package/module.py` | `API` | ... | `test_name` |"
    listed = {}
    for package, module, api, test in rows:
        source = ROOT / "packages" / f"gpulayer-{package}" / "src" / "gpulayer" / package / module
        used = _names(api.rsplit(".", 1)[-1], source.read_text())
        assert used, f"ARCHITECTURE.md lists {api} for {module}, which does not use it"
        listed[package, test] = api
    pinned = {}
    for path in ROOT.glob("packages/gpulayer-*/tests/test_private_apis.py"):
        package, text = path.parent.parent.name.removeprefix("gpulayer-"), path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                pinned[package, node.name] = ast.get_source_segment(text, node)
    assert sorted(listed.keys() - pinned.keys()) == [], "private APIs in ARCHITECTURE.md without their pinning test"
    assert sorted(pinned.keys() - listed.keys()) == [], "pinning tests whose private API ARCHITECTURE.md does not list"
    named_elsewhere = sorted(key for key, api in listed.items() if not _names(api, pinned[key]))
    assert named_elsewhere == [], "these tests do not name the private API their ARCHITECTURE.md row gives"


def _names(name: str, text: str) -> bool:
    """Whether ``text`` names ``name`` whole (``_rebuild_bucket`` is not named by ``_rebuild_buckets``)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None
