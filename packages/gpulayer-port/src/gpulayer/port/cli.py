"""``gpulayer port``: a Lightning 2.6 project ported to GPUlayer in one command, with a report of what GPUlayer does
not adopt (ADR 0023). libcst rewrites the code and keeps every other byte. ``--verify`` then runs the original
under Lightning and the port under GPUlayer and compares the two runs (``verify.py``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from gpulayer.port.files import PortInputError, Report, port_paths
from gpulayer.port.verify import (
    DEFAULT_STEPS,
    DEFAULT_TIMEOUT_S,
    VerifyInputError,
    entry_point,
    lightning_version,
    verify,
)

_VERIFY_OPTIONS = ("steps", "timeout", "script")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.verify:
        given = [f"--{name}" for name in _VERIFY_OPTIONS if getattr(args, name) is not None]
        if script_args:
            given.append("arguments after --")
        if given:
            parser.error(f"{', '.join(given)}: only with --verify")
        try:
            report = port_paths(args.sources, out=args.out, in_place=args.in_place)
        except PortInputError as bad:
            parser.error(str(bad))
        written = f"{_count(report.written, 'file')} written" if not args.check else "nothing written (--check)"
        _print(report, written)
        return report.exit_status
    try:
        entry = entry_point(args.sources, args.script)
        lightning = lightning_version()
    except VerifyInputError as bad:
        parser.error(str(bad))
    with tempfile.TemporaryDirectory(prefix="gpulayer-verify-") as folder:
        try:
            report = port_paths(args.sources, out=Path(folder) / "gpulayer")
        except PortInputError as bad:
            parser.error(str(bad))
        _print(report, "nothing written (--verify runs a temporary copy)", copied=False)
        if report.failures:
            return 2
        steps = DEFAULT_STEPS if args.steps is None else args.steps
        timeout = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
        return verify(
            args.sources, entry, script_args, lightning=lightning, steps=steps, timeout=timeout, folder=Path(folder)
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpulayer port",
        usage="%(prog)s SOURCE... (--out DIR | --in-place | --check | --verify [--steps N] [--timeout S] "
        "[--script PATH] [-- SCRIPT ARGS...])",
        description="Rewrite Lightning's imports and names GPUlayer adopts to GPUlayer's, and report, as "
        "PATH:LINE:COL: NAME: what to do, each use of a name it does not adopt. Exit status: 0 nothing left to do "
        "by hand, 1 findings, 2 a file that cannot be parsed (not written). With --verify: 0 the two runs are "
        "identical or close, 1 they differ or one failed, 2 input that cannot be verified, 3 the port ran no GPUlayer "
        "Trainer (a library builds Lightning's itself).",
    )
    parser.add_argument(
        "sources", nargs="+", type=Path, metavar="SOURCE", help=".py files, notebooks, YAML configs, folders"
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write the ported files under DIR (same names; a folder's other files are copied as they are)",
    )
    mode.add_argument("--in-place", action="store_true", help="rewrite the files where they are")
    mode.add_argument("--check", action="store_true", help="write nothing, report only")
    mode.add_argument(
        "--verify",
        action="store_true",
        help="write nothing; port into a temporary folder, run the original under Lightning and the port under "
        "GPUlayer on the CPU (same seed, arguments and caps), and compare the two runs",
    )
    verifying = parser.add_argument_group("--verify")
    verifying.add_argument(
        "--steps",
        type=_at_least(1, int, "a whole number"),
        metavar="N",
        help=f"each fit trains one epoch of at most N optimizer steps (default {DEFAULT_STEPS})",
    )
    verifying.add_argument(
        "--timeout",
        type=_at_least(1, float, "a number of seconds"),
        metavar="S",
        help=f"stop both runs after S seconds, as bad input (default {DEFAULT_TIMEOUT_S:g})",
    )
    verifying.add_argument(
        "--script",
        type=Path,
        metavar="PATH",
        help="the script to run, among the SOURCE files or in a SOURCE folder (default: the first SOURCE)",
    )
    return parser


def _at_least(low: float, kind: type, accepted: str):
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value >= low:
            raise argparse.ArgumentTypeError(f"{text!r} (accepted: {accepted} of at least {low:g})")
        return value

    return parse


def _print(report: Report, written: str, *, copied: bool = True) -> None:
    for line in report.findings + report.notes:
        print(line)
    sys.stdout.flush()  # before what goes to stderr, in the order it was printed
    for line in report.failures:
        print(line, file=sys.stderr)
    failed = f", {_count(report.failures, 'file')} not parsed" if report.failures else ""
    if report.copied and copied:
        written += f", {_count(report.copied, 'other file')} copied"
    summary = f"{_count(report.ported, 'file')} ported, {written}, {_count(report.findings, 'finding')} to do by hand"
    if report.notes:
        summary += f", {_count(report.notes, 'note')}"
    print(f"gpulayer port: {summary}{failed}", file=sys.stderr)


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"
