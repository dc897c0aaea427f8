"""The porting corpus: Lightning scripts written in the shapes public Lightning code takes, each run under
``lightning==2.6.*`` and, ported by ``gpulayer port``, under GPUlayer; the two runs end alike.

``test_only_the_imports_change`` proves for every script that the port changed nothing but the imports and the
Lightning names it renames (``pl.LightningModule`` -> ``Module``): the two syntax trees, imports left out and the
names mapped, are the same. Scripts that use what GPUlayer does not adopt are not run; their reports are checked
line by line. Each run is recorded by ``run_script.py`` (steps, epoch, metrics, what validate/test returned, weights,
TensorBoard scalars).
"""

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer.port import registry
from gpulayer.port.files import port_paths

HERE = Path(__file__).resolve().parent
FOLDER = HERE / "corpus"
SCRIPT_TIMEOUT_S = 300
METRIC_RTOL = 1e-6
_PROFILER = (
    "profiler='simple': GPUlayer has no profiler; wrap fit in torch.profiler.profile(...) yourself, or use "
    "benchmarks/ (accepted: None)"
)
# What the port reports for the scripts that use what GPUlayer does not adopt: PATH:LINE:COL: NAME: note.
REPORTS = {
    "24_tuner_lr_find.py": [
        f"6:37: Tuner: {registry.REGISTRY['lightning.pytorch.tuner.'].note}",
        f"28:55: Trainer: {_PROFILER}",
    ],
    "25_model_summary.py": [
        f"7:55: ModelSummary: {registry.REGISTRY['lightning.pytorch.utilities.model_summary.'].note}",
        "27:5: Trainer: accelerator='tpu': accepted values are 'auto', 'cpu', 'gpu', 'cuda'",
        '29:5: Trainer: plugins=[pl.plugins.MixedPrecision("bf16-mixed", "cpu")]: GPUlayer takes no plugins: '
        "precision= sets the precision, and the cluster environment (torchrun, Slurm) is detected; run your own "
        "script with gpulayer.runtime.launch() for anything else (accepted: None)",
        f"29:14: pl.plugins.MixedPrecision: {registry.REGISTRY['lightning.pytorch.plugins.'].note}",
    ],
}
CORPUS = sorted(path for path in FOLDER.iterdir() if path.suffix in (".py", ".ipynb"))
TRAINED = [path for path in CORPUS if path.name not in REPORTS]


@pytest.fixture(scope="module")
def ported(tmp_path_factory) -> Path:
    """The whole corpus folder through ``gpulayer port --out``: the folder that holds its ported copy."""
    out = tmp_path_factory.mktemp("ported")
    port_paths([FOLDER], out=out)
    return out / FOLDER.name


def _code(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
    return "\n".join(line for cell in code for line in cell.splitlines() if not line.startswith(("%", "!")))


class _AsPorted(ast.NodeTransformer):
    """Lightning's adopted names as the port writes them: a chain through an imported Lightning module is GPUlayer's
    bare name (``L.pytorch.callbacks.ModelCheckpoint`` -> ``ModelCheckpoint``), and the renamed classes renamed."""

    def __init__(self, modules: dict[str, str]) -> None:
        self.modules = modules  # bound name -> Lightning module

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        root, path = node, []
        while isinstance(root, ast.Attribute):
            root, path = root.value, [root.attr, *path]
        lightning = isinstance(root, ast.Name) and root.id in self.modules
        if lightning and registry.answer(".".join([self.modules[root.id], *path])).rewritten:
            return ast.Name(registry.renames().get(node.attr, node.attr), node.ctx)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(registry.renames().get(node.id, node.id), node.ctx)


def _without_imports(source: str, *, as_ported: bool) -> str:
    tree = ast.parse(source)
    modules = {
        alias.asname or alias.name: alias.name if alias.asname else alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if registry.is_lightning(alias.name)
    }
    if as_ported:
        tree = _AsPorted(modules).visit(tree)
    tree.body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    return ast.dump(tree)


def _lightning_imports(source: str) -> list[str]:
    return [
        f"{node.module}.{alias.name}" if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
        for alias in node.names
        if registry.is_lightning(node.module if isinstance(node, ast.ImportFrom) else alias.name)
    ]


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
def test_only_the_imports_change(script, ported):
    lightning, gpulayer = _code(script), _code(ported / script.name)
    left = [name for name in _lightning_imports(gpulayer) if registry.answer(name).status != registry.KEPT]
    assert not left if script in TRAINED else left, left  # only the names GPUlayer does not adopt stay
    assert _without_imports(gpulayer, as_ported=False) == _without_imports(lightning, as_ported=True)


@pytest.mark.parametrize("script", sorted(REPORTS))
def test_the_report_names_what_is_not_adopted_line_by_line(script, tmp_path):
    report = port_paths([FOLDER / script])
    assert report.findings == [f"{FOLDER / script}:{line}" for line in REPORTS[script]]
    assert report.exit_status == 1
    port_paths([FOLDER / script], out=tmp_path)
    ported_code = (tmp_path / script).read_text()
    for line in REPORTS[script]:
        name, note = line.split(": ", 2)[1:]
        if name != "Trainer":
            assert f"# gpulayer port: {name}: {note}\n" in ported_code


@pytest.mark.porting
@pytest.mark.parametrize("script", TRAINED, ids=[path.stem for path in TRAINED])
def test_the_script_trains_alike_under_lightning_and_gpulayer(script, ported, tmp_path):
    theirs = _run(script, tmp_path / "lightning")
    ours = _run(ported / script.name, tmp_path / "gpulayer")
    # The port alone moved the run to GPUlayer's Trainer (a config-built one too, for the Hydra project).
    assert theirs["trainer"].split(".", 1)[0] in ("lightning", "pytorch_lightning")
    assert ours["trainer"] == "gpulayer.trainer.trainer.Trainer"
    keys = ["global_step", "current_epoch", "callback_metrics", "logged_metrics", "returned"]
    if "TensorBoardLogger" in _code(script):  # logger=True is a TensorBoardLogger in Lightning alone (tensorboard here)
        keys.append("tensorboard")
    for key in keys:
        _same(theirs[key], ours[key], key)
    for name, weights in theirs["weights"].items():
        assert ours["weights"][name] == weights, f"weights {name} differ"


def test_the_corpus_has_the_scripts_the_readme_counts():
    readme = (HERE.parents[1] / "README.md").read_text()
    assert f"{len(TRAINED)} Lightning scripts" in " ".join(readme.split())
