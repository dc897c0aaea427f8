"""The built wheels: none ships gpulayer/__init__.py (a PEP 420 namespace), each carries the one version."""

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VERSION = (ROOT / "VERSION").read_text().strip()
DISTRIBUTIONS = sorted(path.parent.name for path in (ROOT / "packages").glob("*/pyproject.toml"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    for name in DISTRIBUTIONS:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "build",
                "--wheel",
                "--no-isolation",
                "--outdir",
                str(out),
                str(ROOT / "packages" / name),
            ],
            check=True,
            capture_output=True,
        )
    return {name: next(out.glob(f"{name.replace('-', '_')}-{VERSION}-*.whl")) for name in DISTRIBUTIONS}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_no_wheel_ships_the_namespace_init(wheels, name):
    files = zipfile.ZipFile(wheels[name]).namelist()
    assert "gpulayer/__init__.py" not in files


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_each_code_wheel_owns_one_typed_subpackage(wheels, name):
    files = zipfile.ZipFile(wheels[name]).namelist()
    code = sorted({f.split("/")[1] for f in files if f.startswith("gpulayer/")})
    if name == "gpulayer":
        assert code == [], "the meta distribution ships no code"
    else:
        assert code == [name.removeprefix("gpulayer-")]
        assert f"gpulayer/{code[0]}/py.typed" in files


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_wheel_metadata_carries_the_version_and_exact_sibling_pins(wheels, name):
    with zipfile.ZipFile(wheels[name]) as wheel:
        metadata_name = next(f for f in wheel.namelist() if f.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
    assert metadata["Version"] == VERSION
    siblings = [req for req in metadata.get_all("Requires-Dist") or [] if req.startswith("gpulayer")]
    assert all(f"=={VERSION}" in req for req in siblings), siblings
