"""RESULTS.md and chart.png from a comparison run's results (``compare.py`` writes both)."""

from __future__ import annotations

import sys
from pathlib import Path

from figures import (
    ASYNC_SAVE_TARGETS,
    BF16_LOSS_TOLERANCE,
    CUDA_LOSS_TOLERANCE,
    EMA_TARGETS,
    LIGHTNING_TARGETS,
    LOSS_TOLERANCE,
    TARGETS,
    framework_import_s,
    median,
    met,
    per_step,
    ratio,
    round_ratios,
)

IMPORT_TARGET_S, FIRST_STEP_TARGET_S = 0.1, 0.2
LOG_CALL_SHARE_TARGET = 0.1  # issue 24: a self.log call between log steps costs at most a tenth of Lightning's
CHART = "![time per step relative to the raw loop](chart.png)"


def report(results: dict) -> str:
    """The text of RESULTS.md."""
    machine = results["machine"]
    lines = [
        "# GPUlayer, a raw PyTorch loop and Lightning 2.6, side by side",
        "",
        "Written by `benchmarks/lightning_comparison/compare.py`"
        + (" (`--quick`: a quarter of the steps, fewer rounds)" if results["quick"] else "")
        + f" in {results['seconds']} s"
        + (f" on {results['date']}" if results.get("date") else "")
        + ". "
        + ", ".join(f"{key} {value}" for key, value in machine.items())
        + ". Time per step is the median over interleaved rounds of the steady state (warm-up excluded); a ratio is"
        " the median over rounds of the two variants' times in the same round. `raw_lightning_order` is the raw loop"
        " with its step in Lightning's order (`optimizer.step(closure)`; the forward pass, then `zero_grad`, then"
        " `backward`): the floor for a trainer that keeps Lightning's hook order. Every variant's final loss equals the"
        f" raw loop's (relative tolerance {LOSS_TOLERANCE:.0e} on the CPU, {CUDA_LOSS_TOLERANCE:.0e} on a GPU at"
        f" 32-true, {BF16_LOSS_TOLERANCE:.0e} at bf16-mixed), so each did the same work. Ratios compare runs on this"
        " machine only.",
        "",
    ]
    if results.get("selection"):
        chosen = "; ".join(f"{key}: {', '.join(names)}" for key, names in results["selection"].items())
        lines += [f"A focused run ({chosen}), without cold starts.", ""]
    if results["cuda_skipped"]:
        lines += [f"CUDA rows: skipped, {results['cuda_skipped']}", ""]
    for placement, workloads in results["placements"].items():
        for workload in workloads:
            lines += _workload_report(results, placement, workload)
    lines += _cold_report(results["cold"]) if results["cold"] else [CHART]
    if results["cold_two_devices"]:
        lines += _cold_two_devices_report(results["cold_two_devices"])
    return "\n".join(lines) + "\n"


def _workload_report(results: dict, placement: str, workload: str) -> list[str]:
    data = results["placements"][placement][workload]
    variants = data["variants"]
    lines = [
        f"## {workload}, {placement} ({data['steps']} steps per fit)",
        "",
        "| variant | µs/step | to raw | to raw, range over rounds | to Lightning | final loss |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for variant in variants:
        rounds = round_ratios(results, placement, workload, variant)
        spread = f"{min(rounds):.3f} to {max(rounds):.3f}" if variant != "raw" else ""
        to_lightning = (
            f"{ratio(results, placement, workload, variant, 'lightning'):.3f}" if "lightning" in variants else ""
        )
        lines.append(
            f"| {variant} | {per_step(results, placement, workload, variant) * 1e6:.1f} | {median(rounds):.3f} |"
            f" {spread} | {to_lightning} | {variants[variant]['final_loss'][0]:.6f} |"
        )
    if "raw_lightning_order" in variants and "gpulayer" in variants:
        in_order = ratio(results, placement, workload, "gpulayer", to="raw_lightning_order")
        lines += ["", f"GPUlayer over the raw loop in Lightning's order of a step: {in_order:.3f}."]
    lines += _log_call_report(variants)
    reference, target = TARGETS.get((workload, placement), (None, None))
    if reference in variants and "gpulayer" in variants:  # --quick runs no raw_lightning_order
        measured = ratio(results, placement, workload, "gpulayer", to=reference)
        lines += [
            "",
            f"Target: GPUlayer at most {target} x {reference}; measured {measured:.3f}: {met(measured <= target)}.",
        ]
    reference, target = ASYNC_SAVE_TARGETS.get((workload, placement), (None, None))
    if reference in variants and "gpulayer_async_save" in variants:
        measured = ratio(results, placement, workload, "gpulayer_async_save", to=reference)
        lines += [
            "",
            f"Target: GPUlayer with async_save=True at most {target} x {reference}; measured {measured:.3f}:"
            f" {met(measured <= target)}.",
        ]
    lines += _ema_report(results, placement, workload)
    slower = LIGHTNING_TARGETS.get((workload, placement))
    if slower is not None and "lightning" in variants and "gpulayer" in variants:
        measured = ratio(results, placement, workload, "lightning", to="gpulayer")
        lines += [
            "",
            f"Target: Lightning at least {slower} x GPUlayer; measured {measured:.3f}: {met(measured >= slower)}.",
        ]
    return [*lines, ""]


def _ema_report(results: dict, placement: str, workload: str) -> list[str]:
    """Issue 49's targets for ``EMAWeightAveraging``, and what the EMA adds to each loop's step (the median over
    rounds of the EMA variant's time per step less its plain variant's, where both ran)."""
    variants = results["placements"][placement][workload]["variants"]
    if "gpulayer_ema" not in variants:
        return []
    lines = []
    added = []
    for name, ema, plain in (
        ("the raw loop", "raw_ema", "raw_lightning_order"),
        ("GPUlayer", "gpulayer_ema", "gpulayer"),
        ("Lightning", "lightning_ema", "lightning"),
    ):
        if ema in variants and plain in variants:
            pairs = zip(variants[ema]["seconds_per_step"], variants[plain]["seconds_per_step"], strict=True)
            added.append(f"{name} {median([mine - theirs for mine, theirs in pairs]) * 1e6:+.1f} µs")
    if added:
        lines += ["", f"What the EMA adds to a step (median over rounds): {', '.join(added)}."]
    reference, target = EMA_TARGETS.get((workload, placement), ("raw_ema", None))
    if target is not None and reference in variants:
        measured = ratio(results, placement, workload, "gpulayer_ema", to=reference)
        lines += [
            "",
            f"Target: GPUlayer with EMAWeightAveraging at most {target} x {reference}; measured {measured:.3f}:"
            f" {met(measured <= target)}.",
        ]
    if "lightning_ema" in variants:
        measured = ratio(results, placement, workload, "gpulayer_ema", to="lightning_ema")
        lines += [
            "",
            f"Target: GPUlayer with EMAWeightAveraging below Lightning with its EMAWeightAveraging; measured"
            f" {measured:.3f} x Lightning's: {met(measured < 1)}.",
        ]
    return lines


def _log_call_report(variants: dict) -> list[str]:
    """The cost of one ``self.log`` call on a step that does not log, each trainer's (issue 24's target: GPUlayer's
    at most a tenth of Lightning's; ``log_heavy`` makes 8 such calls a step, the other workloads one)."""
    if "seconds_per_log_call" not in variants.get("gpulayer", {}) or "lightning" not in variants:
        return []
    per_call = {name: median(variants[name]["seconds_per_log_call"]) * 1e6 for name in ("gpulayer", "lightning")}
    share = per_call["gpulayer"] / per_call["lightning"]
    return [
        "",
        f"`self.log` on a step that does not log, per call (median over the timed steps, then over rounds): GPUlayer"
        f" {per_call['gpulayer']:.2f} µs, Lightning {per_call['lightning']:.2f} µs: {share:.3f} of Lightning's."
        f" Target: at most {LOG_CALL_SHARE_TARGET} of Lightning's: {met(share <= LOG_CALL_SHARE_TARGET)}.",
    ]


def _cold_report(cold: dict) -> list[str]:
    lines = [
        "## Cold start (one process, 20 steps; medians)",
        "",
        "| workload | variant | import torch s | framework import s | process start to end of first step s | peak RSS MB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for workload, variants in cold.items():
        for variant, runs in variants.items():
            med = {key: median([run[key] for run in runs]) for key in runs[0]}
            lines.append(
                f"| {workload} | {variant} | {med['import_torch_s']:.3f} | {med['import_framework_s']:.3f} | "
                f"{med['first_step_s']:.3f} | {med['peak_rss_mb']:.0f} |"
            )
    gpulayer_import = framework_import_s(cold, "gpulayer")
    first_step_gap = max(
        median([r["first_step_s"] for r in w["gpulayer"]]) - median([r["first_step_s"] for r in w["raw"]])
        for w in cold.values()
    )
    return [
        *lines,
        "",
        f"Target: `import gpulayer.trainer` adds at most {IMPORT_TARGET_S} s to `import torch`; measured "
        f"{gpulayer_import:.3f} s: {met(gpulayer_import <= IMPORT_TARGET_S)}.",
        "",
        f"Target: the first step ends at most {FIRST_STEP_TARGET_S} s after the raw loop's; measured at most "
        f"{first_step_gap:+.3f} s: {met(first_step_gap <= FIRST_STEP_TARGET_S)}.",
        "",
        CHART,
    ]


def _cold_two_devices_report(runs: dict[str, list[dict]]) -> list[str]:
    lines = [
        "",
        "## Cold start on two processes (`python cold.py` with `devices=2` on the CPU, 20 steps; medians of 3)",
        "",
        "GPUlayer runs the script again under `gpulayer launch`; Lightning's DDP strategy runs it again for rank 1.",
        "",
        "| variant | process start to end of rank 0's first step s |",
        "| --- | ---: |",
    ]
    for variant, variant_runs in runs.items():
        lines.append(f"| {variant} | {median([run['first_step_s'] for run in variant_runs]):.3f} |")
    return lines


def chart(results: dict, path: Path) -> None:
    """One PNG: time per step over the raw loop's, per workload, placement and variant (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no chart: matplotlib is not installed (nox -s bench installs it)", file=sys.stderr)
        return
    groups = [(placement, workload) for placement, workloads in results["placements"].items() for workload in workloads]
    ran = [results["placements"][placement][workload]["variants"] for placement, workload in groups]
    variants = list(dict.fromkeys(variant for group in ran for variant in group))  # not every workload runs each
    figure, axes = plt.subplots(figsize=(1.7 * len(groups), 4.5))
    width = 0.8 / len(variants)
    for index, variant in enumerate(variants):
        ratios = [
            ratio(results, placement, workload, variant) if variant in group else float("nan")
            for (placement, workload), group in zip(groups, ran, strict=True)
        ]
        axes.bar([g + index * width for g in range(len(groups))], ratios, width, label=variant)
    axes.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    axes.set_xticklabels([f"{workload}\n{placement}" for placement, workload in groups])
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_ylabel("time per step / raw loop's")
    axes.set_title("Time per step relative to a hand-written PyTorch loop (lower is better)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
