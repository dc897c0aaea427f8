"""The README as a newcomer uses it: its example runs, `.ci/run` runs its test command, and the newcomer check
(`tools/newcomer_check.py`, CI's step that runs the main-job command in a fresh clone) can fail."""

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import newcomer_check  # noqa: E402

README = (ROOT / "README.md").read_text()


def _block_after(marker: str, text: str = README) -> str:
    found = re.search(re.escape(marker) + r"[^\n]*\n```[a-z]*\n(.*?)\n```", text, re.DOTALL)
    assert found, f"README.md: no code block after {marker}"
    return found.group(1)


def test_the_readme_example_is_twenty_lines_and_trains_and_its_curves_can_be_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    example = _block_after("<!-- readme-example -->")
    assert len([line for line in example.splitlines() if line.strip()]) <= 20
    (tmp_path / "train.py").write_text(example)
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["step"] for row in rows] == ["49"]  # logged every 50 of its 80 steps (16 batches x 5 epochs)
    assert float(rows[0]["train_loss"]) < 1e-3  # it learned x.sum()
    plot = Path(sys.executable).with_name("gpulayer")
    drawn = subprocess.run([str(plot), "plot", "lightning_logs", "-o", "curves.png"], cwd=tmp_path, timeout=120)
    assert drawn.returncode == 0
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")


def _ci_run_with(tmp_path: Path, readme: str) -> subprocess.CompletedProcess:
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text(readme)
    return subprocess.run(["bash", ".ci/run"], cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_ci_runs_the_command_under_the_readmes_test_command_marker(tmp_path):
    assert "nox -s tests" in _block_after("<!-- test-command")
    marked = README.split("<!-- test-command")[0] + "<!-- test-command -->\n```sh\necho ran > ran.txt\n```\n"
    done = _ci_run_with(tmp_path, marked)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran.txt").read_text() == "ran\n"


def test_ci_fails_when_the_readme_has_no_test_command(tmp_path):
    done = _ci_run_with(tmp_path, "# A README without the marker\n")
    assert done.returncode == 1
    assert "README.md has no test command" in done.stderr


def test_the_readmes_main_job_is_the_demo_and_promises_its_files():
    command, outputs = newcomer_check.main_job(README)
    assert command == _block_after("<!-- main-job")
    assert "nox -s demo" in command
    assert outputs == ["runs/digits/curves.png", "runs/digits/lightning_logs/version_0/metrics.csv"]


def _repository(tmp_path: Path, command: str, outputs: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text(f"# Demo\n\n<!-- main-job; outputs: {outputs} -->\n```sh\n{command}\n```\n")
    for git in (["init", "--quiet"], ["add", "README.md"], ["commit", "--quiet", "-m", "readme"]):
        identity = ["-c", "user.name=test", "-c", "user.email=test@example.invalid"]
        subprocess.run(["git", *identity, *git], cwd=repo, check=True)
    return repo


def test_the_newcomer_check_passes_when_the_main_job_writes_what_the_readme_promises(tmp_path, capsys):
    newcomer_check.check(_repository(tmp_path, "mkdir -p out && echo done > out/result.txt", "out/result.txt"))
    assert "passed; the main job wrote out/result.txt" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "outputs", "message"),
    [
        ("exit 3", "out.txt", "the README's main-job command exited 3: exit 3"),
        ("echo done > out.txt", "out.txt missing.txt", "the main job did not write ['missing.txt']"),
        ("touch out.txt", "out.txt", "the main job did not write ['out.txt']"),  # empty
    ],
)
def test_the_newcomer_check_fails_naming_what_went_wrong(tmp_path, command, outputs, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        newcomer_check.check(_repository(tmp_path, command, outputs))
