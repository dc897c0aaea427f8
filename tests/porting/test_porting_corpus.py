"""The porting corpus: Lightning scripts written in the shapes public Lightning code takes, each run under
``lightning==2.6.*`` and, with only its imports changed, under GPUlayer; the two runs end alike.

``to_gpulayer`` rewrites the ``from lightning.pytorch... import`` statements and nothing else, and
``test_only_the_imports_change`` proves it for every script: the two sources' syntax trees, imports left out, are
the same. A logger or display callback GPUlayer does not ship (``TensorBoardLogger``, ``RichProgressBar``) stays
imported from Lightning: the Trainer takes it as it is. Each run is recorded by ``run_script.py`` (steps, epoch,
metrics, what validate/test returned, weights, TensorBoard scalars).
"""

import ast
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CORPUS = sorted((HERE / "corpus").glob("*.py"))
SCRIPT_TIMEOUT_S = 300
METRIC_RTOL = 1e-6
# Where each Lightning name lives in GPUlayer, and the GPUlayer name when it differs.
_HOMES = {
    ("lightning.pytorch", "LightningModule"): ("gpulayer.trainer", "Module"),
    ("lightning.pytorch", "LightningDataModule"): ("gpulayer.trainer", "DataModule"),
    ("lightning.pytorch.callbacks", "Callback"): ("gpulayer.trainer", "Callback"),
}
_MODULES = {
    "lightning.pytorch": "gpulayer.trainer",
    "lightning.pytorch.callbacks": "gpulayer.callbacks",
    "lightning.pytorch.loggers": "gpulayer.trainer",
}


def to_gpulayer(source: str) -> str:
    """``source`` with each ``from lightning.pytorch[.callbacks|.loggers] import ...`` replaced by GPUlayer's
    imports of the same names (a renamed class imported under its Lightning name); a logger or callback GPUlayer
    does not ship stays imported from Lightning."""
    lines = source.splitlines(keepends=True)
    for node in reversed(ast.parse(source).body):
        if not (isinstance(node, ast.ImportFrom) and node.module in _MODULES):
            continue
        by_module: dict[str, list[str]] = {}
        for alias in node.names:
            module, name = _HOMES.get((node.module, alias.name), (_MODULES[node.module], alias.name))
            if _kept_from_lightning(node.module, alias.name):
                module = node.module
            bound = alias.asname or alias.name
            by_module.setdefault(module, []).append(name if name == bound else f"{name} as {bound}")
        statements = [f"from {module} import {', '.join(names)}\n" for module, names in sorted(by_module.items())]
        lines[node.lineno - 1 : node.end_lineno] = statements
    return "".join(lines)


def _kept_from_lightning(module: str, name: str) -> bool:
    """A logger or callback of Lightning's that GPUlayer does not ship (its Trainer takes Lightning's own)."""
    shipped = hasattr(importlib.import_module(_MODULES[module]), name) or (module, name) in _HOMES
    return module != "lightning.pytorch" and not shipped


def _without_imports(source: str) -> str:
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    return ast.dump(tree)


def _run(script: Path, folder: Path) -> dict:
    folder.mkdir(parents=True)
    record = folder / "record.json"
    environment = {**os.environ, "OUT_DIR": str(folder / "out"), "PYTHONHASHSEED": "0"}
    finished = subprocess.run(
        [sys.executable, str(HERE / "run_script.py"), str(script), str(record)],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert finished.returncode == 0, f"{script.name} failed:\n{finished.stderr[-4000:]}"
    return json.loads(record.read_text())


def _same(expected, actual, where: str) -> None:
    if isinstance(expected, dict):
        assert sorted(expected) == sorted(actual), f"{where}: {sorted(expected)} != {sorted(actual)}"
        for key in expected:
            _same(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(expected) == len(actual), where
        for index, (a, b) in enumerate(zip(expected, actual, strict=True)):
            _same(a, b, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert math.isclose(expected, actual, rel_tol=METRIC_RTOL, abs_tol=1e-9), f"{where}: {expected} != {actual}"
    else:
        assert expected == actual, f"{where}: {expected!r} != {actual!r}"


@pytest.mark.parametrize("script", CORPUS, ids=[path.stem for path in CORPUS])
def test_only_the_imports_change(script):
    lightning = script.read_text()
    gpulayer = to_gpulayer(lightning)
    imported = [
        (node.module or "", alias.name) if isinstance(node, ast.ImportFrom) else (alias.name, "")
        for node in ast.parse(gpulayer).body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    from_lightning = [(module, name) for module, name in imported if module.split(".")[0] == "lightning"]
    assert all(module in _MODULES and _kept_from_lightning(module, name) for module, name in from_lightning), imported
    assert _without_imports(gpulayer) == _without_imports(lightning)


@pytest.mark.porting
@pytest.mark.parametrize("script", CORPUS, ids=[path.stem for path in CORPUS])
def test_the_script_trains_alike_under_lightning_and_gpulayer(script, tmp_path):
    if "TensorBoardLogger" in script.read_text():
        pytest.importorskip("tensorboard")
    ported = tmp_path / script.name
    ported.write_text(to_gpulayer(script.read_text()))
    theirs = _run(script, tmp_path / "lightning")
    ours = _run(ported, tmp_path / "gpulayer")
    for key in ("global_step", "current_epoch", "callback_metrics", "logged_metrics", "returned", "tensorboard"):
        _same(theirs[key], ours[key], key)
    for name, weights in theirs["weights"].items():
        assert ours["weights"][name] == weights, f"weights {name} differ"


def test_the_corpus_has_the_scripts_the_readme_counts():
    readme = (HERE.parents[1] / "README.md").read_text()
    assert f"{len(CORPUS)} Lightning scripts" in " ".join(readme.split())
