"""``port_paths``: ``gpulayer port``'s work on files: the ``.py`` files, notebooks and YAML configs given or found in
the folders given, each ported (``rewrite``, ``configs``) and written under ``out``, in place, or nowhere. Under ``out`` a folder's other
files (configs, data, READMEs) are copied unchanged, so the ported project is whole; folders and files whose name
starts with a dot (``.git``), ``__pycache__`` and ``.ipynb_checkpoints`` are left out, as from porting.

Every input is checked before anything is written. A notebook's code cells are ported as one source (they share
one namespace), with IPython's magics (``%time``, ``!pip``) kept aside and a ``%%`` cell left whole.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import yaml

from gpulayer.port import tensorboard_logger
from gpulayer.port.configs import port_config
from gpulayer.port.rewrite import Finding, Ported, port_code
from gpulayer.trainer.private_files import make_folders, write_atomically

CONFIGS = (".yaml", ".yml")
SUFFIXES = (".py", ".ipynb", *CONFIGS)
_SKIPPED_FOLDERS = ("__pycache__", ".ipynb_checkpoints")
_CELL = "#gpulayer-port-cell\n"
_MAGIC = "#gpulayer-port-magic:"
_DEFAULT_LOGGER = (
    "no logger given: GPUlayer's default logger is a CSVLogger where Lightning's is a TensorBoardLogger (tensorboard "
    "installed), and {use} relies on TensorBoard; pass logger=TensorBoardLogger(...) from lightning.pytorch.loggers, "
    "which GPUlayer takes as it is"
)


class PortInputError(ValueError):
    """A source or ``--out`` that cannot be ported, named with what is accepted."""


@dataclass
class Report:
    findings: list[str] = field(default_factory=list)  # PATH:LINE:COL: NAME: what to do
    notes: list[str] = field(default_factory=list)  # PATH:LINE:COL: NAME: no finding: what works, or was written
    failures: list[str] = field(default_factory=list)  # PATH: cannot be parsed: the parser's message
    ported: list[Path] = field(default_factory=list)  # the files read and ported
    written: list[Path] = field(default_factory=list)
    copied: list[Path] = field(default_factory=list)  # a folder's other files, under ``out``

    @property
    def exit_status(self) -> int:
        """0: nothing left by hand; 1: findings; 2: a file could not be parsed."""
        return 2 if self.failures else 1 if self.findings else 0


@dataclass(frozen=True)
class _Source:
    path: Path
    relative: Path  # its name under ``out``
    notebook: dict | None


def port_paths(sources: list[Path], *, out: Path | None = None, in_place: bool = False) -> Report:
    """Port ``sources`` (files and folders): write them under ``out`` (same relative names), in place, or, with
    neither, only report. Raises ``PortInputError`` before writing anything when an input cannot be used."""
    files, others = _collect(sources, out)
    report = Report()
    ported: list[tuple[_Source, str, str, _Found]] = []  # each file read: its text, its port, what was found
    for source in files:
        try:
            text = source.path.read_bytes().decode("utf-8")
            ported.append((source, text, *_port(source, text, "")))
        except (cst.ParserSyntaxError, yaml.YAMLError, UnicodeDecodeError) as unparsable:
            report.failures.append(f"{source.path}: cannot be parsed: {_one_line(unparsable)}")
    uses = [
        f"{_file(s.path, cell)}:{use.line} ({use.name})" for s, _, _, f in ported for cell, use in f.tensorboard_uses
    ]
    if uses and tensorboard_logger.installed():  # Lightning's default logger written where it can be
        ported = [
            (source, text, *_port(source, text, uses[0])) if found.default_loggers else (source, text, code, found)
            for source, text, code, found in ported
        ]
    for source, text, code, found in ported:
        report.ported.append(source.path)
        report.findings += [_where(source.path, cell, finding) for cell, finding in found.findings]
        report.notes += [_where(source.path, cell, note) for cell, note in found.notes]
        if uses:
            note = _DEFAULT_LOGGER.format(use=uses[0])
            report.findings += [
                _where(source.path, cell, Finding(c.line, c.column, c.name, note)) for cell, c in found.default_loggers
            ]
        target = out / source.relative if out is not None else source.path if in_place else None
        if target is not None and (out is not None or code != text):
            make_folders(str(target.parent))
            write_atomically(str(target), code.encode("utf-8"))
            shutil.copymode(source.path, target)
            report.written.append(target)
    for path, relative in others if out is not None else []:
        target = out / relative
        make_folders(str(target.parent))
        shutil.copy2(path, target)
        report.copied.append(target)
    return report


def _port(source: _Source, text: str, tensorboard: str) -> tuple[str, _Found]:
    """One file's port (``tensorboard``: where the project relies on TensorBoard, or empty; ``rewrite.port_code``)."""
    if source.notebook is not None:
        return _port_notebook(source.notebook, text, tensorboard)
    port = port_config if source.path.suffix in CONFIGS else port_code
    return _port_python(text, functools.partial(port, tensorboard=tensorboard))


def _collect(sources: list[Path], out: Path | None) -> tuple[list[_Source], list[tuple[Path, Path]]]:
    """The files to port, and a folder's other files with their names under ``out``."""
    found: list[_Source] = []
    others: list[tuple[Path, Path]] = []
    for source in sources:
        if not source.exists():
            raise PortInputError(f"{source}: no such file or folder")
        if source.is_dir():
            if out is not None and out.resolve().is_relative_to(source.resolve()):
                raise PortInputError(f"--out {out} is inside the source folder {source}: choose a folder outside it")
            for path in _tree(source):
                relative = source.name / path.relative_to(source)
                if path.suffix in SUFFIXES:
                    found.append(_source(path, relative))
                else:
                    others.append((path, relative))
        elif source.suffix in SUFFIXES:
            found.append(_source(source, Path(source.name)))
        else:
            raise PortInputError(
                f"{source}: not a Python file, notebook or YAML config (accepted: {', '.join(SUFFIXES)} or a folder)"
            )
    if out is not None and out.exists() and not out.is_dir():
        raise PortInputError(f"--out {out}: not a folder")
    names = [source.relative for source in found] + [relative for _, relative in others]
    twice = sorted({str(name) for name in names if names.count(name) > 1})
    if out is not None and twice:
        raise PortInputError(f"--out {out}: several sources would be written to {', '.join(twice)}")
    return found, others


def _tree(folder: Path) -> list[Path]:
    """Every file below ``folder`` but those in hidden folders and caches."""
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and not any(part in _SKIPPED_FOLDERS or part.startswith(".") for part in path.relative_to(folder).parts)
    )


def _source(path: Path, relative: Path) -> _Source:
    if path.suffix != ".ipynb":
        return _Source(path, relative, None)
    try:
        notebook = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as bad:
        raise PortInputError(f"{path}: a notebook must be JSON: {bad}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise PortInputError(f"{path}: a notebook must be a JSON object with a list of cells")
    return _Source(path, relative, notebook)


@dataclass(frozen=True)
class _Found:
    """What a port found, each with its notebook cell (None in a ``.py`` file)."""

    findings: list[tuple[int | None, Finding]]
    default_loggers: list[tuple[int | None, Finding]]
    tensorboard_uses: list[tuple[int | None, Finding]]
    notes: list[tuple[int | None, Finding]]


def _port_python(text: str, port: Callable[[str], Ported]) -> tuple[str, _Found]:
    """A ``.py`` file or a YAML config, by ``port``."""
    ported = port(text)
    return ported.code, _found(ported, lambda finding: (None, finding))


def _found(ported: Ported, place: Callable[[Finding], tuple[int | None, Finding]]) -> _Found:
    return _Found(
        [place(f) for f in ported.findings],
        [place(f) for f in ported.default_loggers],
        [place(f) for f in ported.tensorboard_uses],
        [place(f) for f in ported.notes],
    )


def _port_notebook(notebook: dict, text: str, tensorboard: str) -> tuple[str, _Found]:
    """The notebook with its code cells ported (``text`` itself when none changes); each finding with its cell's
    1-based number and its line in the cell."""
    notebook = copy.deepcopy(notebook)  # its cells are replaced by their port, and a project may be ported twice
    cells = [
        (number, cell)
        for number, cell in enumerate(notebook["cells"], start=1)
        if cell.get("cell_type") == "code" and not _text(cell).lstrip().startswith("%%")
    ]
    codes = [_hide_magics(_text(cell)) for _, cell in cells]
    ends = ["" if code.endswith("\n") or not code else "\n" for code in codes]  # each cell on lines of its own
    ported = port_code(
        "".join(code + end + _CELL for code, end in zip(codes, ends, strict=True)), tensorboard=tensorboard
    )
    starts = [1]
    for code, end in zip(codes, ends, strict=True):
        starts.append(starts[-1] + (code + end).count("\n") + 1)

    def in_cell(finding: Finding) -> tuple[int | None, Finding]:
        index = max(i for i, start in enumerate(starts[:-1]) if start <= finding.line)
        return cells[index][0], Finding(finding.line - starts[index] + 1, finding.column, finding.name, finding.note)

    pieces = ported.code.split(_CELL)[: len(cells)]
    changed = False
    for (_, cell), end, piece in zip(cells, ends, pieces, strict=True):
        new = _show_magics(piece.removesuffix(end) if end else piece)
        if new != _text(cell):
            cell["source"] = new.splitlines(keepends=True) if isinstance(cell["source"], list) else new
            changed = True
    return (json.dumps(notebook, indent=1, ensure_ascii=False) + "\n" if changed else text), _found(ported, in_cell)


def _text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _hide_magics(code: str) -> str:
    return "".join(
        line[: len(line) - len(line.lstrip())] + _MAGIC + line.lstrip() if line.lstrip()[:1] in ("%", "!") else line
        for line in code.splitlines(keepends=True)
    )


def _show_magics(code: str) -> str:
    return code.replace(_MAGIC, "")


def _where(path: Path, cell: int | None, finding: Finding) -> str:
    return finding.format(_file(path, cell))


def _file(path: Path, cell: int | None) -> str:
    return str(path) if cell is None else f"{path}[cell {cell}]"


def _one_line(error: Exception) -> str:
    message = str(error).strip().splitlines()
    return " ".join(line.strip() for line in message if line.strip()) or type(error).__name__
