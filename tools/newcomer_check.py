"""The newcomer's check: clone the repository, run the README's main-job command as written there, check its files.

``python tools/newcomer_check.py`` reads the command and the files it promises from the README's
``<!-- main-job; outputs: PATH ... -->`` marker (the command is the first line of the next code block), runs it in
a fresh clone of this repository's HEAD, and fails when it fails or a promised file is missing or empty.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- main-job; outputs: (?P<outputs>[^>]*?) -->\n```[a-z]*\n(?P<command>[^\n]+)\n")
TIMEOUT_S = 20 * 60


def main_job(readme: str) -> tuple[str, list[str]]:
    """The README's main-job command and the files it writes, relative to the repository root."""
    found = MARKER.search(readme)
    if found is None:
        raise SystemExit("README.md: no main-job command after a <!-- main-job; outputs: PATH ... --> marker")
    return found["command"], found["outputs"].split()


def check(root: Path = ROOT) -> None:
    command, outputs = main_job((root / "README.md").read_text())
    changed = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    if changed.strip():
        print("newcomer check: uncommitted changes are not in the clone; it checks HEAD", flush=True)
    with tempfile.TemporaryDirectory(prefix="newcomer-") as folder:
        clone = Path(folder) / "gpulayer"
        subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True)
        print(f"newcomer check: in a fresh clone, {command}", flush=True)
        done = subprocess.run(["bash", "-c", f"set -euo pipefail; {command}"], cwd=clone, timeout=TIMEOUT_S)
        if done.returncode != 0:
            raise SystemExit(f"newcomer check: the README's main-job command exited {done.returncode}: {command}")
        missing = [path for path in outputs if not (clone / path).is_file() or (clone / path).stat().st_size == 0]
        if missing:
            raise SystemExit(f"newcomer check: the main job did not write {missing} (the README promises them)")
    print(f"newcomer check: passed; the main job wrote {', '.join(outputs)}")


if __name__ == "__main__":
    check()
