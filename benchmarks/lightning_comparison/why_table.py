"""The README's "Why." table, written from a full comparison run's results (``compare.py --readme``).

It sits between ``START`` and ``END`` in README.md; ``tests/test_why_table.py`` checks that it is what the committed
``results.json`` gives, so the README and RESULTS.md quote the same run. A row whose workload the results lack
(an older run) is left out.
"""

from __future__ import annotations

import textwrap

from figures import LIGHTNING_TARGETS, TARGETS, framework_import_s, per_step, ratio, round_ratios

START = (
    "<!-- why-table:start: compare.py --readme writes this block from benchmarks/lightning_comparison/results.json -->"
)
END = "<!-- why-table:end -->"
RESULTS = "benchmarks/lightning_comparison/RESULTS.md"
ROWS = (  # label, placement, workload
    ("overhead-bound MLP, 1 process", "1 process", "mlp"),
    ("MLP, DDP on 2 processes", "DDP, 2 processes", "mlp"),
    ("small transformer, 1 process", "1 process", "transformer"),
    ("MLP, default install (checkpoints, CSV logger, `StepLR`, LR monitor), 1 process", "1 process", "default_install"),
    ("the same with a callback's `on_train_batch_end`", "1 process", "default_install_batch_hook"),
)
DEFAULT_INSTALL = ("default_install", "default_install_batch_hook")


def why_block(results: dict) -> str:
    """The block's text: the run, the table, and what it does not show."""
    machine = results["machine"]
    when = f" on {results['date']}" if results.get("date") else ""
    lines = [
        _wrapped(
            "**Why.** Measured on the same model, data and steps, with proof that every variant did the same work"
            f" (equal final losses), on {machine['cpus']} CPU cores{when} ([{RESULTS}]({RESULTS})):"
        ),
        "",
        "| time per step | raw PyTorch loop | GPUlayer | Lightning 2.6 (progress bar, model summary off) |",
        "| --- | ---: | ---: | ---: |",
    ]
    shown = [(label, placement, workload) for label, placement, workload in ROWS if _has(results, placement, workload)]
    for label, placement, workload in shown:
        times = [per_step(results, placement, workload, v) for v in ("raw", "gpulayer", "lightning")]
        to_raw = [ratio(results, placement, workload, v) for v in ("gpulayer", "lightning")]
        unit, scale, digits = ("µs", 1e6, 0) if times[0] < 2e-3 else ("ms", 1e3, 2)
        raw, gpulayer, lightning = (f"{seconds * scale:.{digits}f} {unit}" for seconds in times)
        lines.append(f"| {label} | {raw} | {gpulayer} ({to_raw[0]:.2f} x raw) | {lightning} ({to_raw[1]:.2f} x raw) |")
    if results.get("cold"):
        imports = [f"{framework_import_s(results['cold'], v):.2f} s" for v in ("gpulayer", "lightning")]
        lines.append(f"| `import` of the framework | | {imports[0]} | {imports[1]} |")
    return "\n".join([*lines, "", *_notes(results, [workload for _, _, workload in shown])]) + "\n"


def _has(results: dict, placement: str, workload: str) -> bool:
    variants = results["placements"].get(placement, {}).get(workload, {}).get("variants", {})
    return {"raw", "gpulayer", "lightning"} <= set(variants)


def _notes(results: dict, shown: list[str]) -> list[str]:
    notes = []
    if (
        _has(results, "1 process", "mlp")
        and "raw_lightning_order" in results["placements"]["1 process"]["mlp"]["variants"]
    ):
        order = ratio(results, "1 process", "mlp", "raw_lightning_order")
        gpulayer = ratio(results, "1 process", "mlp", "gpulayer", to="raw_lightning_order")
        notes.append(
            "On the MLP, keeping Lightning's order of a step (`training_step` before `zero_grad`) costs a hand-written"
            f" loop {order:.2f} x by itself, and GPUlayer takes {gpulayer:.2f} x that loop."
        )
    if _has(results, "DDP, 2 processes", "mlp"):
        rounds = round_ratios(results, "DDP, 2 processes", "mlp", "gpulayer")
        notes.append(
            f"The DDP row moves between rounds on {results['machine']['cpus']} shared cores (GPUlayer {min(rounds):.2f}"
            f" to {max(rounds):.2f} x raw over {len(rounds)} rounds)."
        )
    installs = [workload for workload in DEFAULT_INSTALL if workload in shown]
    if installs:
        notes.append(
            "In the default-install rows both trainers keep their default checkpoint and CSV logger on and the raw loop"
            " does the same work by hand (`torch.save` per epoch, CSV rows); the first rows have both off."
        )
    for workload in installs:
        reference, target = TARGETS[(workload, "1 process")]
        if reference in results["placements"]["1 process"][workload]["variants"]:
            notes.append(
                f"`{workload}`: GPUlayer {ratio(results, '1 process', workload, 'gpulayer', to=reference):.2f} x the"
                f" raw loop in Lightning's order (target {target}), Lightning"
                f" {ratio(results, '1 process', workload, 'lightning', to='gpulayer'):.2f} x GPUlayer (target at least"
                f" {LIGHTNING_TARGETS[(workload, '1 process')]})."
            )
    notes.append("[benchmarks/README.md](benchmarks/README.md) breaks the MLP's time down.")
    return [_wrapped(" ".join(notes))]


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=118, break_long_words=False, break_on_hyphens=False)


def block_of(readme: str) -> str:
    """The text between the markers; a ValueError naming them when README.md lacks them."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md: no why-table block (a line {START!r}, then a line {END!r})")
    return readme[start + len(START) + 1 : end]


def with_why_block(readme: str, results: dict) -> str:
    """``readme`` with its block rewritten from ``results``."""
    old = block_of(readme)
    start = readme.find(START) + len(START) + 1
    return readme[:start] + why_block(results) + readme[start + len(old) :]
