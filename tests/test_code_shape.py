"""tools/code_shape.py counts a module's lines and lists the functions past the limit, methods by class."""

import sys
from pathlib import Path

from gpulayer.runtime.testing import run_command

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "code_shape.py"


def _function(name: str, lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x = {index}\n" for index in range(lines - 1))
    return f"{indent}def {name}():\n{body}"


def test_lines_per_module_and_the_functions_over_the_limit(tmp_path):
    module = tmp_path / "packages" / "gpulayer-x" / "src" / "gpulayer" / "x" / "m.py"
    module.parent.mkdir(parents=True)
    source = _function("short", 60) + _function("long", 61) + "class Loop:\n" + _function("run", 62, "    ")
    module.write_text(source)
    shown = run_command([sys.executable, str(SCRIPT), "--root", str(tmp_path)], timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"| `packages/gpulayer-x/src/gpulayer/x/m.py` | {len(source.splitlines())} |" in shown.stdout
    listed = [line for line in shown.stdout.splitlines() if ".py: " in line]
    assert listed == [
        "| `packages/gpulayer-x/src/gpulayer/x/m.py: long` | 61 |",
        "| `packages/gpulayer-x/src/gpulayer/x/m.py: Loop.run` | 62 |",
    ]


def test_a_root_without_packages_is_refused(tmp_path):
    shown = run_command([sys.executable, str(SCRIPT), "--root", str(tmp_path)], timeout=60)
    assert shown.returncode == 2 and f"--root {tmp_path}: no packages" in shown.stderr
