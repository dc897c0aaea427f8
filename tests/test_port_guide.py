"""The porting guide's `gpulayer port` section is the command's real behaviour: its example's output (also in the
README) and diff, the complete script's GPUlayer version, and the table of Lightning's names from the registry."""

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("libcst")

from gpulayer.trainer import port_registry as registry
from gpulayer.trainer.port import main
from gpulayer.trainer.port_rewrite import port_code

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


def test_the_installed_gpulayer_command_ports(tmp_path):
    """``gpulayer port`` through the entry point the trainer's distribution declares (ADR 0014), as a user runs it:
    ``--check`` reports and writes nothing; without it the file is ported."""
    command = Path(sys.executable).with_name("gpulayer")
    script = tmp_path / "train.py"
    script.write_text("import lightning.pytorch as pl\n\n\nclass Net(pl.LightningModule):\n    pass\n")
    checked = subprocess.run([command, "port", script, "--check"], capture_output=True, text=True, timeout=120)
    assert (checked.returncode, checked.stdout) == (0, "")  # no finding
    assert checked.stderr == "gpulayer port: 1 file ported, nothing written (--check), 0 findings to do by hand\n"
    assert "pl.LightningModule" in script.read_text()
    ported = subprocess.run([command, "port", script, "--in-place"], capture_output=True, text=True, timeout=120)
    assert ported.returncode == 0, ported.stderr
    assert script.read_text() == "from gpulayer.trainer import Module\n\n\nclass Net(Module):\n    pass\n"
