"""One version for every distribution: VERSION, the built metadata and every sibling pin agree."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import versions  # noqa: E402

sys.path.pop(0)


def test_every_sibling_pin_matches_version():
    assert versions.pins(), "no sibling pins found: the pin pattern no longer matches the pyproject files"
    assert versions.drift() == []


def test_every_distribution_reads_the_root_version_file():
    for path in versions.pyprojects():
        text = path.read_text()
        assert 'dynamic = ["version"]' in text, path
        assert 'path = "../../VERSION"' in text, path


def test_bump_rewrites_version_and_every_pin(tmp_path):
    shutil.copy(ROOT / "VERSION", tmp_path / "VERSION")
    for path in versions.pyprojects():
        (tmp_path / "packages" / path.parent.name).mkdir(parents=True)
        shutil.copy(path, tmp_path / "packages" / path.parent.name / "pyproject.toml")
    before = len(versions.pins(tmp_path))
    versions.bump("0.9.0", tmp_path)
    assert versions.read_version(tmp_path) == "0.9.0"
    assert len(versions.pins(tmp_path)) == before
    assert versions.drift(tmp_path) == []


def test_drift_is_reported(tmp_path):
    test_bump_rewrites_version_and_every_pin(tmp_path)
    (tmp_path / "VERSION").write_text("1.0.0\n")
    assert versions.drift(tmp_path) and all("(VERSION is 1.0.0)" in line for line in versions.drift(tmp_path))


def test_a_malformed_version_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"version .next.: expected X\.Y\.Z"):
        versions.bump("next", tmp_path)
