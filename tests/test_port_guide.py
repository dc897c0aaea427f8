"""The porting guide's `gpulayer port` section is the command's real behaviour: its example's output (also in the
README) and diff, the complete script's GPUlayer version, and the table of Lightning's names from the registry."""

import difflib
import re
from pathlib import Path

from gpulayer.port import registry
from gpulayer.port.cli import main
from gpulayer.port.rewrite import port_code

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "porting-from-lightning.md"


def _block(marker: str, page: Path = GUIDE) -> str:
    """The fenced block after ``<!-- marker -->`` in ``page``."""
    found = re.search(rf"<!-- {re.escape(marker)} -->\n```\w*\n(.*?)```\n", page.read_text(), re.DOTALL)
    assert found, f"no block marked {marker} in {page.name}"
    return found.group(1)


def table() -> str:
    """The guide's table of Lightning's names, from the registry."""
    rows = ["| Lightning 2.6 | GPUlayer | What to know |", "|---|---|---|"]
    for path, answer in registry.REGISTRY.items():
        name = f"`{path}*`" if path.endswith(".") else f"`{path}`"
        status = answer.status.replace(registry.ADOPTED, f"`{answer.home}`") if answer.rewritten else answer.status
        rows.append(f"| {name} | {status} | {answer.note or 'the same'} |")
    return "\n".join(rows) + "\n"


def test_the_example_shows_the_commands_real_output_and_diff(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = _block("port: example")
    Path("train.py").write_text(before)
    status = main(["train.py", "--in-place"])
    printed = capsys.readouterr()
    shown = f"$ gpulayer port train.py --in-place\n{printed.out}{printed.err}(exit status {status})\n"
    assert shown == _block("port: output") == _block("port: output", ROOT / "README.md")
    after = Path("train.py").read_text().splitlines(True)
    assert "".join(difflib.unified_diff(before.splitlines(True), after, "train.py", "train.py", n=0)) == _block(
        "port: diff"
    )


def test_the_complete_scripts_gpulayer_version_is_the_ports():
    ported = port_code(_block("porting: lightning"))
    assert ported.findings == []
    assert ported.code == _block("porting: gpulayer")


def test_the_guides_table_is_the_registry():
    text = GUIDE.read_text()
    shown = text.split("<!-- port: registry -->\n", 1)[1].split("\n\n", 1)[0] + "\n"
    assert shown == table(), f"the table in {GUIDE.name} should read:\n{table()}"


def test_the_guide_lists_the_libraries_that_build_lightnings_trainer_themselves():
    text = GUIDE.read_text()
    shown = text.split("<!-- port: own trainer -->\n", 1)[1].split("\n", 1)[0]
    assert shown == ", ".join(f"`{name}`" for name in registry.OWN_TRAINER_LIBRARIES) + "."
