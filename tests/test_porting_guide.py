"""docs/porting-from-lightning.md: its Lightning script and GPUlayer version differ only where the guide says, the
diff it shows is the real one, and the two scripts train alike; its launch() example runs on two ranks."""

import ast
import csv
import difflib
import json
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from gpulayer.runtime.testing import run_command

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "porting-from-lightning.md"
# The Lightning names whose GPUlayer names differ; every other imported name is the same in both scripts.
RENAMED = {"LightningModule": "Module", "LightningDataModule": "DataModule"}
DIFF_LABELS = ("lightning/train.py", "gpulayer/train.py")
# Epoch metrics are means the two frameworks reduce themselves: allow a float32 rounding of a different summing order.
METRIC_RTOL = 1e-6
SCRIPT_TIMEOUT_S = 240


def guide_block(name: str) -> str:
    """The fenced block on the line after ``<!-- porting: NAME -->``."""
    found = re.findall(rf"^<!-- porting: {name} -->\n```[a-z]*\n(.*?)^```$", GUIDE.read_text(), re.M | re.S)
    assert len(found) == 1, f"{GUIDE.name}: {len(found)} blocks marked <!-- porting: {name} -->, expected 1"
    return found[0]


def real_diff(lightning: str, gpulayer: str) -> str:
    """``diff -u`` with one line of context, as the guide shows it: a blank context line is empty, not one space
    (an editor would strip the space from the page)."""
    lines = difflib.unified_diff(lightning.splitlines(), gpulayer.splitlines(), *DIFF_LABELS, n=1, lineterm="")
    return "".join(f"{line.rstrip()}\n" for line in lines)


def is_import(line: str) -> bool:
    return line.startswith(("import ", "from "))


def imported_packages(script: str) -> set[str]:
    """The top-level packages the script imports from."""
    nodes = ast.parse(script).body
    modules = [alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names]
    modules += [node.module or "" for node in nodes if isinstance(node, ast.ImportFrom)]
    return {module.split(".")[0] for module in modules}


def imported_names(script: str, package: str) -> set[str]:
    """The names bound by the script's ``from PACKAGE... import`` statements."""
    return {
        alias.asname or alias.name
        for node in ast.parse(script).body
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package
        for alias in node.names
    }


def test_the_scripts_differ_in_their_imports_and_base_classes_and_the_diff_shown_is_the_real_one():
    lightning, gpulayer = guide_block("lightning"), guide_block("gpulayer")
    differing = [
        line
        for line in difflib.unified_diff(lightning.splitlines(), gpulayer.splitlines(), n=0, lineterm="")
        if line[:1] in "-+" and not line.startswith(("---", "+++"))
    ]
    removed = [line[1:] for line in differing if line[0] == "-"]
    added = [line[1:] for line in differing if line[0] == "+"]
    assert removed and all(line.startswith("from lightning.") for line in filter(is_import, removed)), removed
    assert added and all(line.startswith("from gpulayer.") for line in filter(is_import, added)), added
    assert "gpulayer" not in imported_packages(lightning) and "lightning" not in imported_packages(gpulayer)
    # Every name the Lightning imports bind is bound by the GPUlayer imports, under its GPUlayer name.
    assert {RENAMED.get(name, name) for name in imported_names(lightning, "lightning")} == imported_names(
        gpulayer, "gpulayer"
    )
    # Outside the imports, a line differs only by a renamed base class: `class Net(LightningModule):`.
    renamed = [re.sub(r"\b\w+\b", lambda word: RENAMED.get(word[0], word[0]), line) for line in removed]
    other_removed = [line for line in renamed if not is_import(line)]
    other_added = [line for line in added if not is_import(line)]
    assert other_removed == other_added, "lines other than imports differ beyond the renamed base classes"
    assert all(re.fullmatch(r"class \w+\((Module|DataModule)\):", line) for line in other_added), other_added
    assert guide_block("diff") == real_diff(lightning, gpulayer), (
        f"the ```diff block in {GUIDE.name} is stale; the real diff is:\n{real_diff(lightning, gpulayer)}"
    )


def read_run(out: Path) -> dict:
    """What one script left in its OUT_DIR: weights, counters and metrics, and every file's relative path."""
    log_dir = out / "lightning_logs" / "version_0"
    with open(log_dir / "metrics.csv", newline="") as file:
        reader = csv.DictReader(file)
        metrics_csv = (reader.fieldnames, list(reader))
    return {
        "weights": torch.load(out / "weights.pt", weights_only=True),
        "results": json.loads((out / "results.json").read_text()),
        "metrics_csv": metrics_csv,
        "hparams_yaml": (log_dir / "hparams.yaml").read_text(),
        "files": sorted(str(path.relative_to(out)) for path in out.rglob("*") if path.is_file()),
    }


def close(expected: float, actual: float) -> bool:
    return math.isclose(expected, actual, rel_tol=METRIC_RTOL)


@pytest.mark.slow
def test_the_lightning_script_and_its_gpulayer_version_train_alike(tmp_path: Path):
    pytest.importorskip("lightning.pytorch", reason="the Lightning script needs lightning==2.6")
    env = {name: value for name, value in os.environ.items() if name not in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    commands = {}
    for framework in ("lightning", "gpulayer"):
        script = tmp_path / f"{framework}_train.py"
        script.write_text(guide_block(framework))
        commands[framework] = [sys.executable, str(script), str(tmp_path / framework)]
    with ThreadPoolExecutor(2) as pool:  # the two runs side by side: most of each is importing
        runs = {
            framework: pool.submit(run_command, argv, timeout=SCRIPT_TIMEOUT_S, env=env, cwd=str(ROOT))
            for framework, argv in commands.items()
        }
    for framework, run in runs.items():
        process = run.result()
        output = f"{process.stdout[-3000:]}\n{process.stderr[-3000:]}"
        assert process.returncode == 0, f"the {framework} script failed:\n{output}"
    lightning, gpulayer = read_run(tmp_path / "lightning"), read_run(tmp_path / "gpulayer")

    # Bit for bit: the same torch operations run in the same order on the same data, seed and shuffling order,
    # so nothing can round differently: a difference of any size means some step ran differently.
    assert list(gpulayer["weights"]) == list(lightning["weights"])
    for name, weight in lightning["weights"].items():
        torch.testing.assert_close(gpulayer["weights"][name], weight, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")

    fit, fit_expected = gpulayer["results"]["fit"], lightning["results"]["fit"]
    counters = ("global_step", "current_epoch")
    assert {key: fit[key] for key in counters} == {key: fit_expected[key] for key in counters}
    assert fit["callback_metrics"].keys() == fit_expected["callback_metrics"].keys()
    assert all(close(fit_expected["callback_metrics"][k], v) for k, v in fit["callback_metrics"].items()), (
        f"callback_metrics: {fit_expected['callback_metrics']} (lightning) != {fit['callback_metrics']} (gpulayer)"
    )
    test, test_expected = gpulayer["results"]["test"], lightning["results"]["test"]
    assert [sorted(metrics) for metrics in test] == [sorted(metrics) for metrics in test_expected]
    assert all(close(want[k], got[k]) for want, got in zip(test_expected, test, strict=True) for k in want), (
        f"test metrics: {test_expected} (lightning) != {test} (gpulayer)"
    )

    # The same checkpoint names (ModelCheckpoint's top 2 and last.ckpt), logs and outputs.
    assert [name for name in lightning["files"] if name.endswith(".ckpt")], "the script saved no checkpoint"
    assert gpulayer["files"] == lightning["files"]
    assert gpulayer["hparams_yaml"] == lightning["hparams_yaml"]
    columns, rows = gpulayer["metrics_csv"]
    expected_columns, expected_rows = lightning["metrics_csv"]
    assert columns == expected_columns
    assert len(rows) == len(expected_rows)
    for index, (want, got) in enumerate(zip(expected_rows, rows, strict=True)):
        same = all(want[k] == got[k] or (want[k] and got[k] and close(float(want[k]), float(got[k]))) for k in want)
        assert same, f"metrics.csv row {index}: {want} (lightning) != {got} (gpulayer)"


@pytest.mark.multiprocess
def test_the_launch_example_trains_on_two_ranks(tmp_path: Path):
    script = tmp_path / "own_loop.py"
    script.write_text(guide_block("launch"))
    process = run_command([sys.executable, str(script)], timeout=SCRIPT_TIMEOUT_S, cwd=str(ROOT))
    assert process.returncode == 0, f"{process.stdout[-3000:]}\n{process.stderr[-3000:]}"
    returned = ast.literal_eval(process.stdout.strip().splitlines()[-1])
    assert sorted(returned) == [0, 1]
    assert returned[0] == returned[1] < 1e-3, returned  # the mean over the ranks, the same on both: it learned
