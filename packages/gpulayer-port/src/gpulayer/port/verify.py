"""``gpulayer port --verify``: the project run twice from copies of the same files, the original under Lightning and
the port under GPUlayer, each in a fresh process (``run_recorded.py``) with the same seed, arguments and caps, on
the CPU; their records compared (``comparison.py``) and the verdict printed. The sources are never touched: both
copies, and the runs' files, live in a temporary folder the caller removes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from gpulayer.port.comparison import compare_records
from gpulayer.port.registry import LIGHTNING_ROOTS

DEFAULT_STEPS = 32
DEFAULT_TIMEOUT_S = 600.0
SCRIPTS = (".py", ".ipynb")
FRAMEWORKS = ("Lightning", "GPUlayer")
_SKIPPED = ("__pycache__", ".ipynb_checkpoints", ".*")  # as gpulayer port leaves them out of a folder
_TAIL_LINES = 12


class VerifyInputError(ValueError):
    """Input ``--verify`` cannot run, found before the runs or by them (exit status 2)."""


@dataclass(frozen=True)
class Entry:
    """The script both runs start, by its path under each copy, and the folder each runs in (under each copy)."""

    script: Path  # the user's
    relative: Path
    folder: Path


@dataclass(frozen=True)
class Run:
    framework: str
    returncode: int
    record: dict[str, Any] | None  # None when the process ended without saving one
    output: str  # the tail of what it printed


def entry_point(sources: list[Path], script: Path | None) -> Entry:
    """``--script``, else the first SOURCE when it is a script; it must be one of the SOURCE files or inside a
    SOURCE folder, which is then the folder the runs start in (the project's root)."""
    named = "--script " if script is not None else ""
    if script is None and sources[0].suffix in SCRIPTS:
        script = sources[0]
    if script is None:
        raise VerifyInputError(
            f"--verify runs a script: give it as the first SOURCE, or name it with --script PATH (accepted: a "
            f"{' or '.join(SCRIPTS)} file among the SOURCE files or in a SOURCE folder; {sources[0]} is neither)"
        )
    if not script.is_file():
        raise VerifyInputError(f"{named}{script}: no such file")
    if script.suffix not in SCRIPTS:
        raise VerifyInputError(f"{named}{script}: not a script (accepted: {', '.join(SCRIPTS)})")
    for source in sources:
        if source.is_file() and source.resolve() == script.resolve():
            return Entry(script, Path(source.name), Path())
        if source.is_dir() and script.resolve().is_relative_to(source.resolve()):
            relative = script.resolve().relative_to(source.resolve())
            if not any(part in _SKIPPED or part.startswith(".") for part in relative.parts):
                return Entry(script, source.name / relative, Path(source.name))
    raise VerifyInputError(
        f"{named}{script}: not among the SOURCE files, nor in a SOURCE folder outside its hidden folders and caches"
    )


def lightning_version() -> str:
    """The installed Lightning's name and version; a ``VerifyInputError`` when neither distribution is there."""
    for name in LIGHTNING_ROOTS:
        if importlib.util.find_spec(name) is not None:
            with contextlib.suppress(PackageNotFoundError):
                return f"{name} {version(name)}"
            return name
    raise VerifyInputError(
        "--verify runs the original under Lightning, which is not installed here "
        f"({sys.executable}): pip install 'lightning==2.6.*'"
    )


def verify(
    sources: list[Path], entry: Entry, args: list[str], *, lightning: str, steps: int, timeout: float, folder: Path
) -> int:
    """Run the original (copied under ``folder/lightning``) and its port (already under ``folder/gpulayer``),
    print what each did and the verdict; the exit status: 0 identical or close, 1 a difference or a failed run,
    2 input that cannot be verified, 3 a port that ran Lightning's Trainer alone (``not ported``). ``lightning``: the
    installed Lightning, named in the heading."""
    copy_sources(sources, folder / "lightning")
    command = " ".join(map(str, [entry.script, *args]))
    print(
        f"gpulayer port --verify: {command} under {lightning}, its port under GPUlayer "
        f"{version('gpulayer-trainer')} (the CPU, one process, each fit one epoch of at most {steps} steps)"
    )
    try:
        runs = run_both(entry, args, steps=steps, timeout=timeout, folder=folder)
    except TimeoutError as late:
        return _refused(str(late))
    theirs, ours = runs
    missing = not_installed(runs)
    if missing is not None:
        return _refused(missing)
    for run in runs:
        print(_summary(run))
    if any(_failed(run) for run in runs):
        failed = " and ".join(f"the {run.framework} run" for run in runs if _failed(run))
        print(f"failed: {failed} did not finish (the end of its error above)")
        return 1
    if not theirs.record["trainers"]:
        why = f"{entry.script} built no Trainer under Lightning: nothing to compare (name the script that trains)"
        return _refused(why)
    built = ours.record["trainers"]
    if built and not any(trainer.startswith("gpulayer.") for trainer in built):
        print(
            f"not ported: no GPUlayer Trainer ran in the port (it built {', '.join(sorted(set(built)))} alone): both runs trained on "
            "Lightning, so they were not compared (a library that builds Lightning's Trainer itself keeps the "
            "project on Lightning: the report above names it)"
        )
        return 3
    comparison = compare_records(theirs.record, ours.record)
    print(f"compared: {_compared(theirs.record)}")
    print(comparison.verdict)
    return 1 if comparison.difference else 0


def not_installed(runs: tuple[Run, Run]) -> str | None:
    """Why the runs cannot be compared when one failed importing the framework it runs on: Lightning for the
    original, a GPUlayer distribution the port imports (``gpulayer.callbacks`` is gpulayer-callbacks'); else None."""
    for run in runs:
        module = ((run.record or {}).get("error") or {}).get("missing_module") or ""
        root, _, package = module.partition(".")
        if run.framework == "Lightning" and root in LIGHTNING_ROOTS:
            return f"the original imports {module}, which is not installed here: pip install 'lightning==2.6.*'"
        if run.framework == "GPUlayer" and root == "gpulayer" and package:
            distribution = f"gpulayer-{package.split('.')[0]}"
            return f"the port imports {module}, which is not installed here: pip install {distribution}"
    return None


def copy_sources(sources: list[Path], out: Path) -> None:
    """The sources under ``out`` as ``gpulayer port --out`` lays them out (each under its own name)."""
    out.mkdir(parents=True, exist_ok=True)
    for source in sources:
        if source.is_dir():  # "." (the project one runs in) has no name: its files go to ``out`` itself
            shutil.copytree(source, out / source.name, ignore=shutil.ignore_patterns(*_SKIPPED), dirs_exist_ok=True)
        else:
            shutil.copy2(source, out / source.name)


def run_both(entry: Entry, args: list[str], *, steps: int, timeout: float, folder: Path) -> tuple[Run, Run]:
    """Both runs at once, each in a process group of its own, killed with everything it started when it ends or
    when ``timeout`` (seconds) passes; a ``TimeoutError`` then names the runs still going."""
    started: list[tuple[str, subprocess.Popen, Path, Path]] = []
    temporaries: list[str] = []
    try:
        for framework in FRAMEWORKS:
            root = folder / framework.lower()
            record, log = folder / f"{framework.lower()}.record", folder / f"{framework.lower()}.log"
            # The run's temporary folder (torch's caches included), removed after it. Made just inside the caller's,
            # not deeper in ``folder``: a DataLoader worker's socket (TMPDIR/pymp-*/listener-*) must fit AF_UNIX's
            # 107 bytes, else the worker cannot hand its batch over and the run waits until the timeout.
            temporary = tempfile.mkdtemp(prefix="gl-")
            temporaries.append(temporary)
            environment = {**os.environ, "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": "", "TMPDIR": temporary}
            command = [sys.executable, "-m", "gpulayer.port.run_recorded", str(record), str(steps)]
            command += [str(root / entry.relative), *args]
            with log.open("wb") as output:
                process = subprocess.Popen(
                    command,
                    cwd=root / entry.folder,
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append((framework, process, record, log))
        _wait(started, timeout)
        return tuple(_finished(framework, process, record, log) for framework, process, record, log in started)
    finally:
        for _, process, _, _ in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # what it started, and itself past the deadline
            process.wait()
        for temporary in temporaries:
            shutil.rmtree(temporary, ignore_errors=True)


def _wait(started: list[tuple[str, subprocess.Popen, Path, Path]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        for _, process, _, _ in started:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        late = [framework for framework, process, _, _ in started if process.poll() is None]
        runs = f"the {' and '.join(late)} run{' was' if len(late) == 1 else 's were'}"
        raise TimeoutError(
            f"--timeout {timeout:g}: {runs} still going after {timeout:g} s, and stopped; give the runs longer "
            "(--timeout SECONDS) or fewer steps (--steps N)"
        ) from None


def _finished(framework: str, process: subprocess.Popen, record: Path, log: Path) -> Run:
    output = log.read_text(encoding="utf-8", errors="replace")
    saved = torch.load(record, weights_only=True) if record.exists() else None
    return Run(framework, process.returncode, saved, _tail(output))


def _failed(run: Run) -> bool:
    return run.record is None or run.record["error"] is not None


def _summary(run: Run) -> str:
    """``Lightning: exit status 0: fit (step 32, epoch 1), test``, and the tail of the error of a failed run."""
    calls = (run.record or {}).get("calls", [])
    shown = [
        f"{call['call']} (step {call['global_step']}, epoch {call['current_epoch']})"
        if call["call"] == "fit"
        else call["call"]
        for call in calls
    ]
    line = f"{run.framework}: exit status {run.returncode}: {', '.join(shown) or 'no Trainer call'}"
    if not _failed(run):
        return line
    error = run.record["error"]["text"] if run.record else f"no record saved; its output ends:\n{run.output}"
    if error.startswith("SystemExit"):  # no traceback: why it exited is in what it printed (argparse's error)
        error = f"{run.output}\n{error}"
    return line + "\n" + "\n".join("    " + text for text in _tail(error).splitlines())


def _compared(record: dict[str, Any]) -> str:
    """What the comparison went through, counted in Lightning's record."""
    calls = record["calls"]
    counts = [
        (len(calls), "call"),
        (sum(len(call["rows"]) for call in calls), "logged row"),
        (len(calls[-1]["checkpoints"]) if calls else 0, "checkpoint file"),
        (len(record["weights"]), "weight tensor"),
        (len(record["optimizers"]), "optimizer state"),
    ]
    return ", ".join(f"{count} {noun}{'' if count == 1 else 's'}" for count, noun in counts)


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-_TAIL_LINES:])


def _refused(why: str) -> int:
    sys.stdout.flush()
    print(f"gpulayer port --verify: {why}", file=sys.stderr)
    return 2
