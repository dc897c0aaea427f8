"""The porting corpus: Lightning scripts written in the shapes public Lightning code takes, each run under
``lightning==2.6.*`` and, ported by ``gpulayer port``, under GPUlayer; the two runs end alike.

``test_only_the_imports_change`` proves for every script that the port changed nothing but the imports and the
Lightning names it renames (``pl.LightningModule`` -> ``Module``): the two syntax trees, imports left out and the
names mapped, are the same. Scripts that use what GPUlayer does not adopt are not run; their reports are checked
line by line. Each run is recorded by ``run_script.py`` with gpulayer-port's recorder and compared by its comparison,
the ones ``gpulayer port --verify`` uses (each call's steps, epochs, metrics, returned values, logged rows and
checkpoint files; weights and optimizer state; here also TensorBoard scalars and images). ``gpulayer port --verify``
itself runs them too, capped. CI runs a sample, each of it one way (``VERIFIED``, ``WHOLE``); ``nox -s porting``
every script both ways.
"""

import ast
import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from gpulayer.port import registry
from gpulayer.port.comparison import compare_records, compare_values
from gpulayer.port.files import port_paths
from gpulayer.port.run_recorded import notebook_code
from gpulayer.runtime.testing import run_command

HERE = Path(__file__).resolve().parent
FOLDER = HERE / "corpus"
README = HERE.parents[1] / "README.md"
GUIDE = HERE.parents[1] / "docs" / "porting-from-lightning.md"
SCRIPT_TIMEOUT_S = 300
# What the port reports for the scripts that use what GPUlayer does not adopt: PATH:LINE:COL: NAME: note.
REPORTS = {
    "24_tuner_lr_find.py": [
        f"6:37: Tuner: {registry.REGISTRY['lightning.pytorch.tuner.'].note}",
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
# The libraries a script trains with beyond Lightning's (noxfile.py's test requirements): without them it is skipped.
LIBRARIES = {"29_vit_lora_cli.py": ("transformers", "peft")}
CORPUS = sorted(path for path in FOLDER.iterdir() if path.suffix in (".py", ".ipynb"))
TRAINED = [path for path in CORPUS if path.name not in REPORTS]
# CI runs a sample of the corpus, each script of it once (every script both ways took 6.4 of its minutes). These
# through ``gpulayer port --verify``, capped, one for each way the command finds or caps a run: a test of the best
# checkpoint, accumulation, a resume from a capped run's checkpoint, a package, a notebook, a Trainer instantiated by
# Hydra, a LightningCLI.
VERIFIED = [
    "08_test_best_checkpoint.py",
    "10_accumulation_clipping_plateau.py",
    "15_resume_training.py",
    "22_package_of_modules.py",
    "23_notebook.ipynb",
    "26_hydra_main_instantiate.py",
    "28_autoencoder_cli.py",
]
# These whole, one for each shape of project the others do not train: torchmetrics, a DataModule, custom callbacks,
# pretraining then fine-tuning, early stopping, predict, two validation sets, manual optimization, a Hydra DictConfig,
# a bucketing sampler, TensorBoard images, a LightningCLI, a Hugging Face ViT under LoRA. The rest (a VAE, warmup, a
# config-driven run, a GRU, a MetricCollection, both import aliases) trains what these do.
WHOLE = [
    "01_image_classifier_torchmetrics.py",
    "04_datamodule.py",
    "06_custom_callbacks.py",
    "07_pretrain_then_finetune.py",
    "09_early_stopping.py",
    "11_regression_predict.py",
    "12_two_validation_sets.py",
    "16_gan_manual_optimization.py",
    "17_hydra_config_kwargs.py",
    "18_bucketing_sampler_ddp.py",
    "19_tensorboard_images_rich.py",
    "27_backbone_image_classifier_cli.py",
    "29_vit_lora_cli.py",
]
# ``nox -s porting`` sets GPULAYER_WHOLE_CORPUS=1: every trained script both ways.
WHOLE_CORPUS = os.environ.get("GPULAYER_WHOLE_CORPUS") == "1"
RUN_WHOLE = TRAINED if WHOLE_CORPUS else [path for path in TRAINED if path.name in WHOLE]
RUN_VERIFIED = TRAINED if WHOLE_CORPUS else [path for path in TRAINED if path.name in VERIFIED]


@pytest.fixture(scope="module")
def ported(tmp_path_factory) -> Path:
    """The whole corpus folder through ``gpulayer port --out``: the folder that holds its ported copy."""
    out = tmp_path_factory.mktemp("ported")
    port_paths([FOLDER], out=out)
    return out / FOLDER.name


def _code(path: Path) -> str:
    return notebook_code(path) if path.suffix == ".ipynb" else path.read_text()


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


class _WithoutWrittenLogger(ast.NodeTransformer):
    """A ported Trainer call without the ``logger=TensorBoardLogger(..., name="lightning_logs")`` the port writes
    where the project relies on Lightning's default logger (19_tensorboard_images_rich does, for the whole corpus)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        node.keywords = [
            keyword
            for keyword in node.keywords
            if not (
                keyword.arg == "logger"
                and isinstance(keyword.value, ast.Call)
                and ast.unparse(keyword.value.func) == "TensorBoardLogger"
                and any(k.arg == "name" and ast.unparse(k.value) == "'lightning_logs'" for k in keyword.value.keywords)
            )
        ]
        return self.generic_visit(node)


def _without_imports(source: str, *, as_ported: bool) -> str:
    tree = ast.parse(source)
    if not as_ported:
        tree = _WithoutWrittenLogger().visit(tree)
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


def _skip_without_libraries(script: Path) -> None:
    missing = [name for name in LIBRARIES.get(script.name, ()) if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{script.name} needs {', '.join(missing)}")


def _run(script: Path, folder: Path) -> dict:
    folder.mkdir(parents=True)
    record = folder / "record.pt"
    environment = {**os.environ, "OUT_DIR": str(folder / "out"), "PYTHONHASHSEED": "0"}
    finished = run_command(
        [sys.executable, str(HERE / "run_script.py"), str(script), str(record)],
        cwd=str(folder),
        env=environment,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert finished.returncode == 0 and record.exists(), f"{script.name} failed:\n{finished.stderr[-4000:]}"
    recorded = torch.load(record, weights_only=True)
    assert recorded["error"] is None, f"{script.name} failed:\n{recorded['error']['text']}"
    return recorded


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
@pytest.mark.parametrize("script", RUN_WHOLE, ids=[path.stem for path in RUN_WHOLE])
def test_the_script_trains_alike_under_lightning_and_gpulayer(script, ported, tmp_path):
    _skip_without_libraries(script)
    theirs = _run(script, tmp_path / "lightning")
    ours = _run(ported / script.name, tmp_path / "gpulayer")
    # The port alone moved the run to GPUlayer's Trainer (a config-built one too, for the Hydra project).
    assert {call["trainer"].split(".", 1)[0] for call in theirs["calls"]} <= {"lightning", "pytorch_lightning"}
    assert {call["trainer"] for call in ours["calls"]} == {"gpulayer.trainer.trainer.Trainer"}
    # Each call's steps, epochs, metrics, returned values, logged rows and checkpoint files, then weights and the
    # optimizers' state: bit for bit.
    assert compare_records(theirs, ours).verdict == "identical"
    if "TensorBoardLogger" in _code(script):  # logger=True is a TensorBoardLogger in Lightning alone (tensorboard here)
        assert compare_values(theirs["tensorboard"], ours["tensorboard"], "tensorboard").verdict == "identical"


@pytest.mark.porting
@pytest.mark.parametrize("script", RUN_VERIFIED, ids=[path.stem for path in RUN_VERIFIED])
def test_gpulayer_port_verify_finds_the_capped_runs_identical(script):
    """``gpulayer port corpus --verify --script SCRIPT``: the corpus folder ported into a temporary folder, the
    script run under both trainers capped at 8 steps, and found identical; nothing is left in the temporary folder."""
    _skip_without_libraries(script)
    temporary = Path(tempfile.mkdtemp(prefix="gl-"))  # the command's TMPDIR: it must be left empty
    environment = {**os.environ, "OUT_DIR": "out", "TMPDIR": str(temporary), "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "gpulayer.runtime", "port", str(FOLDER), "--verify", "--steps", "8"]
    finished = run_command([*command, "--script", str(script)], env=environment, timeout=2 * SCRIPT_TIMEOUT_S)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert finished.stdout.splitlines()[-1] == "identical", finished.stdout
    assert list(temporary.iterdir()) == []
    temporary.rmdir()


def _block(page: Path, marker: str) -> str:
    """The fenced block after ``<!-- marker -->`` in ``page``."""
    found = re.search(rf"<!-- {re.escape(marker)} -->\n```\w*\n(.*?)```\n", page.read_text(), re.DOTALL)
    assert found, f"no block marked {marker} in {page.name}"
    return found.group(1)


def _without_versions(shown: str) -> str:
    return re.sub(r"under (\w+) \S+, its port under GPUlayer \S+", r"under \1 X, its port under GPUlayer Y", shown)


@pytest.mark.porting
@pytest.mark.parametrize(
    ("script", "name", "output"), [("example", "train.py", "output"), ("resume", "resume.py", "differs")]
)
def test_the_verify_runs_the_guide_and_readme_show_are_real(script, name, output, tmp_path):
    """The guide's ``--verify`` examples, run: what they print (stderr and stdout as a terminal shows them) and their
    exit status; the README shows the first."""
    (tmp_path / name).write_text(_block(GUIDE, f"verify: {script}"))
    command = [sys.executable, "-m", "gpulayer.runtime", "port", name, "--verify"]
    shell = ["sh", "-c", '"$@" 2>&1; echo "(exit status $?)"', "sh", *command]
    finished = run_command(shell, cwd=str(tmp_path), timeout=2 * SCRIPT_TIMEOUT_S)
    shown = f"$ gpulayer port {name} --verify\n{finished.stdout}"
    assert _without_versions(shown) == _without_versions(_block(GUIDE, f"verify: {output}"))
    if output == "output":
        assert _block(README, "verify: output") == _block(GUIDE, "verify: output")


def test_ci_runs_a_sample_of_trained_scripts_each_once():
    trained = {path.name for path in TRAINED}
    assert set(VERIFIED) <= trained and set(WHOLE) <= trained and not set(VERIFIED) & set(WHOLE)


def test_the_corpus_has_the_scripts_the_readme_counts():
    readme = README.read_text()
    assert f"{len(TRAINED)} Lightning scripts" in " ".join(readme.split())
