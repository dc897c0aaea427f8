"""``gpulayer plot``: the training and validation curves of a run's ``metrics.csv``, drawn to an image file.

GPUlayer ships no logger integrations; this is the picture of a run without one. matplotlib is an optional
extra (``pip install "gpulayer-trainer[plot]"``).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpulayer.trainer.private_files import make_folders, write_atomically

INSTALL_HINT = 'gpulayer plot needs matplotlib: pip install "gpulayer-trainer[plot]" (or pip install matplotlib)'
# "train_loss_step", "val_loss" and "test_loss" share the panel "loss"; Lightning's names for the loader of a
# metric logged from several evaluation loaders keep their suffix in the label only.
_STAGE_PREFIX = re.compile(r"^(train|val|valid|validation|test)[_/]")
_FORK_SUFFIX = re.compile(r"_(step|epoch)$")
_LOADER_SUFFIX = re.compile(r"/dataloader_idx_\d+$")


@dataclass
class Curve:
    name: str
    steps: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpulayer plot",
        description="Draw the curves of a run's metrics.csv (a CSVLogger's version folder, or any folder above it).",
    )
    parser.add_argument("source", help="a metrics.csv, or a folder: its newest metrics.csv below is drawn")
    parser.add_argument("-o", "--output", default="curves.png", help="the image to write (default curves.png)")
    args = parser.parse_args(argv)
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ModuleNotFoundError:
        print(INSTALL_HINT, file=sys.stderr)
        return 1
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if Path(args.output).suffix.lstrip(".").lower() not in formats:
        parser.error(f"--output {args.output!r}: expected a file name ending in one of .{', .'.join(formats)}")
    try:
        metrics_csv = find_metrics_csv(Path(args.source))
        panels = read_panels(metrics_csv)
    except ValueError as bad:
        parser.error(str(bad))
    draw(panels, title=str(metrics_csv), output=Path(args.output))
    count = sum(len(curves) for curves in panels.values())
    print(f"gpulayer plot: wrote {args.output} ({count} curves from {metrics_csv})")
    return 0


def find_metrics_csv(source: Path) -> Path:
    """``source`` itself, or the most recently written ``metrics.csv`` below the folder ``source``."""
    if source.is_file():
        return source
    if not source.is_dir():
        raise ValueError(f"source {str(source)!r}: no such file or folder")
    found = sorted(source.rglob("metrics.csv"), key=lambda path: path.stat().st_mtime)
    if not found:
        raise ValueError(f"source {str(source)!r}: no metrics.csv below it (a CSVLogger writes <name>/version_N/)")
    return found[-1]


def read_panels(metrics_csv: Path) -> dict[str, list[Curve]]:
    """Each logged metric as a curve over ``step``, grouped by what it measures (its name without the stage)."""
    with open(metrics_csv, newline="", encoding="utf-8") as file:
        reader = csv.DictReader(file)
        if reader.fieldnames is None or "step" not in reader.fieldnames:
            raise ValueError(f"source {str(metrics_csv)!r}: not a metrics.csv (expected a 'step' column)")
        curves = {name: Curve(name) for name in reader.fieldnames if name not in ("step", "epoch")}
        for row in reader:
            for name, curve in curves.items():
                if row[name] not in ("", None):
                    curve.steps.append(float(row["step"]))
                    curve.values.append(float(row[name]))
    panels: dict[str, list[Curve]] = {}
    for curve in sorted((curve for curve in curves.values() if curve.values), key=lambda curve: curve.name):
        panel = _FORK_SUFFIX.sub("", _STAGE_PREFIX.sub("", _LOADER_SUFFIX.sub("", curve.name)))
        panels.setdefault(panel, []).append(curve)
    if not panels:
        raise ValueError(f"source {str(metrics_csv)!r}: has no logged values to draw")
    return dict(sorted(panels.items(), key=lambda item: (item[0] != "loss", item[0])))  # loss first


def draw(panels: dict[str, list[Curve]], title: str, output: Path) -> None:
    """One panel per measure, its curves over the step; the image file is written atomically."""
    from matplotlib.figure import Figure

    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(5 * columns, 3.6 * rows), layout="constrained")
    axes = list(figure.subplots(rows, columns, squeeze=False).flat)
    for ax, (panel, curves) in zip(axes, panels.items(), strict=False):  # a grid of 3 columns may have cells left
        for curve in curves:
            sparse = len(curve.values) <= 20  # validation and epoch means: few points, drawn with markers
            ax.plot(curve.steps, curve.values, marker="o" if sparse else None, markersize=3, label=curve.name)
        ax.set(title=panel, xlabel="step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(panels) :]:  # the grid's unused cells
        ax.set_visible(False)
    figure.suptitle(title, fontsize="small")
    image = io.BytesIO()
    figure.savefig(image, format=output.suffix.lstrip(".").lower(), dpi=110)
    make_folders(str(output.parent))
    write_atomically(str(output), image.getvalue())
