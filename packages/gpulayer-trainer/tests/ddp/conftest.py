"""Run ``train_script.py`` as a user would (``python train_script.py ...``) and read what each rank recorded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpulayer.runtime.testing import clean_environment, run_command

SCRIPT = str(Path(__file__).with_name("train_script.py"))
DEADLINE_S = 120  # every run is killed with its whole process tree past this


def script_command(framework: str, out: Path, **options) -> list[str]:
    return [sys.executable, SCRIPT, framework, str(out), *(f"{key}={value!r}" for key, value in options.items())]


def train(framework: str, out: Path, *, timeout: float = DEADLINE_S, **options) -> list[dict]:
    """Run the script to the end and return every rank's record, in rank order."""
    finished = run_command(script_command(framework, out, **options), timeout=timeout, env=clean_environment())
    assert finished.returncode == 0, f"{framework} run failed:\n{finished.stdout}\n{finished.stderr}"
    return records(out)


def run_script(framework: str, out: Path, *, timeout: float = DEADLINE_S, **options) -> subprocess.CompletedProcess:
    """Run the script to its end, whatever its exit status, and return it with its output."""
    return run_command(script_command(framework, out, **options), timeout=timeout, env=clean_environment())


def rank_pids(out: Path) -> dict[int, int]:
    """The pid of every rank a launcher started, by rank, as each wrote it on starting."""
    return {int(path.name.removeprefix("pid")): int(path.read_text()) for path in out.glob("pid*")}


def records(out: Path) -> list[dict]:
    files = sorted(out.glob("rank*.pt"), key=lambda p: int(p.stem.removeprefix("rank")))
    return [torch.load(path, weights_only=True) for path in files]


def assert_same_weights(expected: dict, actual: dict, atol: float = 0.0) -> None:
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0.0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.fixture
def popen_killer():
    """Processes a test starts itself (several agents at once); any still running at the end are killed."""
    from gpulayer.runtime.testing import kill_tree

    started: list[subprocess.Popen] = []
    yield started.append
    for process in started:
        if process.poll() is None:
            kill_tree(process.pid)
            process.wait()
