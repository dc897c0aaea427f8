"""Every check GPUlayer runs: `nox -s tests newest_torch` is what CI runs (see README.md)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))
import versions  # noqa: E402

nox.needs_version = ">=2024.03.02"
nox.options.default_venv_backend = "virtualenv"  # pip, not uv: pip finds the local CPU build of torch
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint"]

# The CPU build on local disk; a GPU machine sets GPULAYER_TORCH to a CUDA build, with pip's options if it needs
# them: "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128".
TORCH = os.environ.get("GPULAYER_TORCH", "torch==2.13.0")
# The ends of the range the distributions declare (torch>=2.12), beside the pin above: the oldest release they allow
# and the newest on PyPI (ADR 0035). PyPI's Linux builds are CUDA builds (several GB with NVIDIA's libraries); they
# run on the CPU here, as the CPU build does. `nox -s torch_range` runs the unit and gloo tiers on each.
TORCH_RANGE = {"oldest": "torch==2.12.1", "newest": "torch==2.15.0"}
# What CI runs of the gloo tier on the newest torch (`tests` runs all of it on the pin; `torch_range` all of it on
# either end): where torch's distributed internals have moved between releases, and where torch 2.9.1 failed. Ranks
# this process starts (fork and spawn), torch's elastic agent naming the rank that raised, a resume on another world
# size, FSDP2 against DDP's weights.
NEWEST_GLOO_SAMPLE = [
    "packages/gpulayer-runtime/tests/test_started.py",
    "packages/gpulayer-runtime/tests/test_launch.py::test_the_rank_that_raised_is_blamed_even_when_its_peer_dies_first",
    "packages/gpulayer-trainer/tests/ddp/test_elastic_resume.py",
    "packages/gpulayer-fsdp/tests/test_fsdp_trains_like_ddp.py",
]
PYTEST_TOOLS = ["pytest>=8", "pytest-xdist>=3"]
TEST_TOOLS = [*PYTEST_TOOLS, "build>=1", "hatchling>=1.27,<1.34"]
# What a distribution's tests need beyond it: Lightning is the reference of the trainer's differential tests.
# omegaconf: a Hydra config as hyperparameters (Lightning's own bound, from its pytorch-extra extra); tensorboard and
# rich: Lightning's TensorBoardLogger and Rich callbacks, passed to GPUlayer as they are. optuna and
# optuna-integration: a third-party callback built on Lightning's (its pruning callback), taken as it is. hydra-core:
# the porting corpus's Hydra project, its Trainer, callbacks and logger instantiated from YAML.
TEST_REQUIREMENTS = {
    "gpulayer-trainer": [
        "lightning==2.6.*",
        "omegaconf>=2.2.3,<3.0",
        "tensorboard>=2.15",
        "rich>=13",
        "optuna>=4",
        "optuna-integration>=4",
        "hydra-core>=1.3",
        "mlflow>=2.8",
        "wandb>=0.17",
        "ray[tune]>=2.9",
        "pytorch-forecasting>=1.4",  # a library's LightningModules (DeepAR, NBeats) fitted by GPUlayer's Trainer
        "scikit-learn>=1.3",  # load_digits, the data of the Optuna DDP example's differential test
    ],
    # psutil: DeviceStatsMonitor's CPU stats (neither torch nor Lightning requires it).
    "gpulayer-callbacks": ["lightning==2.6.*", "psutil>=5"],
    # Its differential tests run Lightning's LightningCLI, a config naming Lightning's TensorBoardLogger among them.
    "gpulayer-cli": ["lightning==2.6.*", "tensorboard>=2.15"],
    # gpulayer port --verify runs the original under Lightning; the port writes Lightning's default TensorBoardLogger
    # where tensorboard is installed, as Lightning's default is one only then.
    "gpulayer-port": ["lightning==2.6.*", "tensorboard>=2.15"],
}
# What the porting corpus's ViT LoRA fine-tune (29_vit_lora_cli.py) needs beyond the test requirements, installed by
# the porting step alone: where transformers is installed, torchmetrics imports it, and every `import lightning` in the
# tiers before took about 0.9 s longer (4.7 s instead of 3.8 s here).
CORPUS_REQUIREMENTS = ["transformers>=5.25", "peft>=0.21"]
EXTRAS = {"gpulayer-trainer": "[plot]"}  # matplotlib, for gpulayer plot and its tests
# Installed in dependency order: runtime, trainer, callbacks, fsdp, port and cli, then the meta distribution that pins
# them.
DISTRIBUTIONS = [
    "gpulayer-runtime",
    "gpulayer-trainer",
    "gpulayer-callbacks",
    "gpulayer-fsdp",
    "gpulayer-port",
    "gpulayer-cli",
    "gpulayer",
]
PYTEST = ["pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]


def _install(session: nox.Session, torch: str = TORCH) -> None:
    """Torch first (pinned), then every distribution editable (the trainer with its plot extra), then the test tools
    and every test requirement."""
    session.install(*shlex.split(torch))
    test_requirements = [req for name in DISTRIBUTIONS for req in TEST_REQUIREMENTS.get(name, [])]
    editable = [f"packages/{name}" + EXTRAS.get(name, "") for name in DISTRIBUTIONS]
    session.install(*[arg for path in editable for arg in ("-e", path)], *TEST_TOOLS, *test_requirements)


# The CPU suites hide any GPU: Trainer(accelerator="auto") would otherwise put their runs on it.
ON_CPU = {"CUDA_VISIBLE_DEVICES": ""}


def _pytest(
    session: nox.Session,
    marker: str,
    *extra: str,
    env: dict[str, str] | None = None,
    paths: Sequence[str] = ("packages", "tests"),
) -> None:
    session.run(*PYTEST, "-m", marker, *extra, *session.posargs, *paths, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    _lint(session)


@nox.session
def unit(session: nox.Session) -> None:
    """Single-process tests of every package and the cross-package checks."""
    _install(session)
    _unit(session)


@nox.session
def gloo(session: nox.Session) -> None:
    """Multi-process tests: real gloo ranks on CPU."""
    _install(session)
    _gloo(session)


@nox.session
def multinode(session: nox.Session) -> None:
    """Two simulated nodes on loopback."""
    _install(session)
    _multinode(session)


@nox.session
def porting(session: nox.Session) -> None:
    """The porting corpus: Lightning scripts run under Lightning and, with only their imports changed, GPUlayer;
    every script both whole and through `gpulayer port --verify` (CI's `tests` runs each one way)."""
    _install(session)
    _porting(session, whole_corpus=True)


@nox.session(default=False)
def cuda(session: nox.Session) -> None:
    """Tests marked cuda; skipped, saying so, where no GPU is present (an error under GPULAYER_REQUIRE_CUDA=1)."""
    _install(session)
    probe = "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())"
    version, cuda, gpus = session.run("python", "-c", probe, silent=True).strip().splitlines()[-1].split()
    session.log(f"torch {version}, CUDA {cuda}, {gpus} GPU(s) visible")
    if int(gpus) == 0:
        why = f"no CUDA GPU visible to torch {version} (CUDA {cuda}): the cuda tests did not run"
        if os.environ.get("GPULAYER_REQUIRE_CUDA") == "1":
            session.error(f"{why}; GPULAYER_REQUIRE_CUDA=1 asks for them (is GPULAYER_TORCH a CUDA build?)")
        session.skip(why)
    _pytest(session, "cuda")


@nox.session(default=False)
@nox.parametrize("torch", list(TORCH_RANGE))
def torch_range(session: nox.Session, torch: str) -> None:
    """The unit and gloo tiers on either end of the declared torch range (`nox -s "torch_range(torch='oldest')"`)."""
    _install(session, TORCH_RANGE[torch])
    _unit(session)
    _gloo(session)


@nox.session
def newest_torch(session: nox.Session) -> None:
    """What CI runs beside `tests`: the unit tier and a sample of the gloo tier on the newest torch release."""
    _install(session, TORCH_RANGE["newest"])
    _unit(session)
    _gloo(session, NEWEST_GLOO_SAMPLE)


@nox.session
def isolation(session: nox.Session) -> None:
    """Build every distribution, then test each alone in a fresh venv, installed from its built files only."""
    _isolation(session)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train the digits example (fails below 95% test accuracy), then draw its curves.

    It installs what a user of the example needs, no test tools; runs/digits/ keeps the logs and curves.png.
    """
    session.install(TORCH)
    session.install("-e", "packages/gpulayer-runtime", "-e", "packages/gpulayer-trainer[plot]", "scikit-learn")
    _demo(session)


# What `isolation` runs of the launcher where gpulayer-runtime is installed alone from its wheel: `gpulayer launch`
# running a script on two ranks, then reporting a rank's failure. The rest of test_launch.py runs in `gloo`.
LAUNCHER_TESTS = [
    f"packages/gpulayer-runtime/tests/test_launch.py::{name}"
    for name in (
        "test_a_script_runs_on_every_rank_with_its_arguments",
        "test_a_failing_script_reports_its_rank_and_traceback",
    )
]
# pytest-xdist's workers for a distribution's unit tests in `isolation`, where two gain: the trainer's ran 86 s on
# one, 65 s on two; the port's 28 s, 18 s. The others' suites are too short to pay for a second worker's start.
ISOLATION_WORKERS = {"gpulayer-trainer": ["-n", "2"], "gpulayer-port": ["-n", "2"]}
RELIABILITY_REPORT = "tools/reliability_report.py"
NEWCOMER_CHECK = "tools/newcomer_check.py"
COMPARISON = "benchmarks/lightning_comparison/compare.py"
# Run where gpulayer-trainer is installed alone: neither the porting code nor its command come with it.
WITHOUT_PORT_OR_CLI = (
    "import importlib.metadata as m, importlib.util as u; assert u.find_spec('gpulayer.port') is None; "
    "assert 'port' not in m.entry_points(group='gpulayer.commands').names; "
    "assert u.find_spec('gpulayer.cli') is None and u.find_spec('jsonargparse') is None"
)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """GPUlayer, a raw loop and Lightning side by side; writes RESULTS.md and checks the baseline within 10%.

    `nox -s bench -- --quick` for a 2-minute run; any arguments replace the defaults (see benchmarks/README.md).
    """
    _install(session)
    session.install("matplotlib")
    session.run("python", COMPARISON, *(session.posargs or ["--guard", "0.10"]))


@nox.session
def bench_guard(session: nox.Session) -> None:
    """The quick comparison against the committed baseline, with a tolerance wide enough for a noisy 2-core runner."""
    _install(session)
    _bench_guard(session)


@nox.session
def tests(session: nox.Session) -> None:
    """What CI runs, then `newest_torch`: lint, unit, gloo, multinode, porting, isolation, the newcomer check (the
    README's main job in a fresh clone) and the benchmark guard.

    The same steps as those sessions, in one venv: installing torch and Lightning once instead of six times saves
    CI minutes. A step that fails ends the run, naming it.
    """
    _install(session)
    records = _fresh_folder(session, "reliability")  # the reliability suite's cases run in unit and gloo
    session.env["GPULAYER_RELIABILITY_OUT"] = records
    steps = [_lint, _unit, _gloo, _multinode, _porting, _isolation, _newcomer, _bench_guard]
    for step in steps:
        session.log(f"step {step.__name__.removeprefix('_')}")
        step(session)
        if step is _gloo:
            session.run("python", RELIABILITY_REPORT, "--check", records, "docs/reliability.md")
    session.log(", ".join(step.__name__.removeprefix("_") for step in steps) + " passed")


@nox.session(default=False)
def reliability(session: nox.Session) -> None:
    """The reliability suite (tests/reliability), then docs/reliability.md rewritten from what it measured."""
    _install(session)
    records = _fresh_folder(session, "reliability")
    env = {"GPULAYER_RELIABILITY_OUT": records, "OMP_NUM_THREADS": "1"}
    session.run(*PYTEST, "-m", "not cuda and not multinode", *session.posargs, "tests/reliability", env=env)
    session.run("python", RELIABILITY_REPORT, records, "docs/reliability.md")


def _fresh_folder(session: nox.Session, name: str) -> str:
    folder = Path(session.create_tmp()).resolve() / name
    shutil.rmtree(folder, ignore_errors=True)
    return str(folder)


def _lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def _unit(session: nox.Session) -> None:
    _pytest(session, "not multiprocess and not multinode and not cuda and not porting", "-n", "auto", env=ON_CPU)


def _gloo(session: nox.Session, paths: Sequence[str] = ("packages", "tests")) -> None:
    _pytest(session, "multiprocess", env={"OMP_NUM_THREADS": "1", **ON_CPU}, paths=paths)


def _multinode(session: nox.Session) -> None:
    _pytest(session, "multinode", env={"OMP_NUM_THREADS": "1", **ON_CPU})


def _porting(session: nox.Session, whole_corpus: bool = False) -> None:
    session.install(*CORPUS_REQUIREMENTS)
    corpus = {"GPULAYER_WHOLE_CORPUS": "1"} if whole_corpus else {}
    _pytest(session, "porting", "-n", "auto", env={"OMP_NUM_THREADS": "1", **ON_CPU, **corpus})


def _demo(session: nox.Session) -> None:
    session.run("python", "docs/examples/digits.py", "--root-dir", "runs/digits")
    session.run("gpulayer", "plot", "runs/digits", "-o", "runs/digits/curves.png")


def _newcomer(session: nox.Session) -> None:
    """The README's main-job command, as written there, in a fresh clone (it runs `demo`)."""
    session.run("python", NEWCOMER_CHECK)


def _bench_guard(session: nox.Session) -> None:
    session.run("python", COMPARISON, "--quick", "--guard", "1.0", "--out", session.create_tmp())


def _isolation(session: nox.Session) -> None:
    session.install("build>=1", "hatchling>=1.27,<1.34", "virtualenv")  # hatchling: the backend all name
    tmp = Path(session.create_tmp()).resolve()
    dist = tmp / "dist"
    for name in DISTRIBUTIONS:
        # build makes the sdist, then the wheel from the sdist, as pip would from PyPI (in this venv's hatchling).
        build = ["python", "-m", "build", "--no-isolation", "--outdir", str(dist), f"packages/{name}"]
        session.run(*build, silent=True)
    # Torch (with its own requirements) is installed once into a folder every venv reads through a .pth file: it is
    # not ours, and installing it five times cost CI over two minutes. Nothing of gpulayer or Lightning is there.
    shared = tmp / "shared-torch"
    if not (shared / "torch").is_dir():
        session.run("python", "-m", "pip", "install", "--quiet", "--target", str(shared), TORCH)
    for name in DISTRIBUTIONS:
        venv = tmp / f"venv-{name}"
        session.run("python", "-m", "virtualenv", "--quiet", "--clear", str(venv))  # seconds faster than venv
        python = str(venv / "bin" / "python")
        site = session.run(
            python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", silent=True, external=True
        )
        (Path(site.strip().splitlines()[-1]) / "shared-torch.pth").write_text(f"{shared}\n")
        # Third-party requirements come from the index; gpulayer distributions only from the built files.
        third_party = _third_party_requirements(dist, name) + TEST_REQUIREMENTS.get(name, [])
        session.run(python, "-m", "pip", "install", "--quiet", *PYTEST_TOOLS, *third_party, external=True)
        session.run(
            python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(dist), name, external=True
        )
        package = "gpulayer." + (name.removeprefix("gpulayer-") if name != "gpulayer" else "runtime")
        where = f"import {package} as p; assert str(p.__file__).startswith({str(venv)!r}), p.__file__"
        session.run(python, "-c", where, external=True)
        if name == "gpulayer-trainer":  # the loop only: the porting tool is gpulayer-port's, the CLI gpulayer-cli's
            session.run(python, "-c", WITHOUT_PORT_OR_CLI, external=True)
        # Multi-process tests run the same code in `gloo` (with every distribution installed) and would double
        # the CI time here; only two launcher tests run again, to check the installed `gpulayer` command.
        # Porting tests run a ported project, which imports the other distributions: they run in `porting`.
        pytest = [python, "-m", *PYTEST, "-p", "no:cacheprovider"]
        single = "not cuda and not multiprocess and not multinode and not porting"
        session.run(*pytest, "-m", single, *ISOLATION_WORKERS.get(name, []), f"packages/{name}/tests", external=True)
        if name == "gpulayer-runtime":
            session.run(*pytest, "-m", "multiprocess", *LAUNCHER_TESTS, external=True)


def _third_party_requirements(dist: Path, name: str) -> list[str]:
    """The non-gpulayer requirements of ``name`` and of the gpulayer distributions it pins, from their wheels."""
    requirements: list[str] = []
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        seen.add(current)
        wheel = next(dist.glob(f"{current.replace('-', '_')}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            metadata = next(f for f in archive.namelist() if f.endswith(".dist-info/METADATA"))
            lines = archive.read(metadata).decode().splitlines()
        for line in lines:
            requirement = line.removeprefix("Requires-Dist:").strip()
            if not line.startswith("Requires-Dist:") or "extra ==" in requirement:
                continue
            sibling = re.match(r"(gpulayer(?:-[a-z]+)?)\b", requirement)
            if sibling is None:
                requirements.append(requirement)
            elif sibling.group(1) not in seen:
                pending.append(sibling.group(1))
    return requirements


@nox.session(python=False, default=False)
def bump(session: nox.Session) -> None:
    """`nox -s bump -- X.Y.Z`: rewrite VERSION and every sibling pin."""
    if len(session.posargs) != 1:
        session.error("usage: nox -s bump -- X.Y.Z")
    versions.bump(session.posargs[0])
    session.log(f"VERSION and {len(versions.pins())} sibling pins are now {session.posargs[0]}")
