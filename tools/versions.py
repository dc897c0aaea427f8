"""The one version: read it, check every sibling pin against it, and rewrite them all (``nox -s bump``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION_FILE = ROOT / "VERSION"
# A pin on a sibling distribution: "gpulayer==0.1.0", "gpulayer-runtime==0.1.0", "gpulayer[fsdp]==0.1.0".
PIN = re.compile(r'"(gpulayer(?:-[a-z]+)?(?:\[[a-z,]+\])?)==([^"]+)"')
RELEASE = re.compile(r"^\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?$")


def pyprojects(root: Path = ROOT) -> list[Path]:
    return sorted((root / "packages").glob("*/pyproject.toml"))


def read_version(root: Path = ROOT) -> str:
    return (root / "VERSION").read_text().strip()


def pins(root: Path = ROOT) -> list[tuple[Path, str, str]]:
    """Every sibling pin as (pyproject, distribution, pinned version)."""
    return [(path, name, pinned) for path in pyprojects(root) for name, pinned in PIN.findall(path.read_text())]


def drift(root: Path = ROOT) -> list[str]:
    """The pins that differ from VERSION, described; empty when all agree."""
    version = read_version(root)
    return [
        f"{path.relative_to(root)}: {name}=={pinned} (VERSION is {version})"
        for path, name, pinned in pins(root)
        if pinned != version
    ]


def bump(new_version: str, root: Path = ROOT) -> None:
    """Write ``new_version`` to VERSION and to every sibling pin."""
    if not RELEASE.match(new_version):
        raise ValueError(f"version {new_version!r}: expected X.Y.Z (optionally aN, bN, rcN, .devN)")
    for path in pyprojects(root):
        path.write_text(PIN.sub(lambda m: f'"{m.group(1)}=={new_version}"', path.read_text()))
    (root / "VERSION").write_text(new_version + "\n")


if __name__ == "__main__":
    bump(sys.argv[1])
