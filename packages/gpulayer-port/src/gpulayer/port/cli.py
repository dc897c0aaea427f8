"""``gpulayer port``: a Lightning 2.6 project ported to GPUlayer in one command, with a report of what GPUlayer does
not adopt (ADR 0023). libcst rewrites the code and keeps every other byte.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpulayer.port.files import PortInputError, port_paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpulayer port",
        description="Rewrite Lightning's imports and names GPUlayer adopts to GPUlayer's, and report, as "
        "PATH:LINE:COL: NAME: what to do, each use of a name it does not adopt. Exit status: 0 nothing left to do "
        "by hand, 1 findings, 2 a file that cannot be parsed (not written).",
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
    args = parser.parse_args(argv)
    try:
        report = port_paths(args.sources, out=args.out, in_place=args.in_place)
    except PortInputError as bad:
        parser.error(str(bad))
    for line in report.findings + report.notes:
        print(line)
    for line in report.failures:
        print(line, file=sys.stderr)
    done = f"{_count(report.written, 'file')} written" if not args.check else "nothing written (--check)"
    failed = f", {_count(report.failures, 'file')} not parsed" if report.failures else ""
    if report.copied:
        done += f", {_count(report.copied, 'other file')} copied"
    summary = f"{_count(report.ported, 'file')} ported, {done}, {_count(report.findings, 'finding')} to do by hand"
    if report.notes:
        summary += f", {_count(report.notes, 'integration')} known to work"
    print(f"gpulayer port: {summary}{failed}", file=sys.stderr)
    return report.exit_status


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"
