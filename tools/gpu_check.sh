#!/usr/bin/env bash
# The one run a GPU machine owes issues 7 and 10: its GPUs, every test marked cuda (the two-GPU ones where there
# are two), the full comparison with its CUDA rows, and prefetching's speed-up. From the repository root, either
# where pip reaches an index (nox makes fresh environments with that torch):
#   GPULAYER_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" bash tools/gpu_check.sh
# or offline, in a Python that already holds a CUDA build of torch, lightning 2.6, pytest and matplotlib (a GPU
# machine's image), with GPUlayer's wheels built beforehand where `build` and hatchling are installed:
#   bash tools/gpu_check.sh --build-wheels dist       # here
#   GPULAYER_WHEELS=dist bash tools/gpu_check.sh      # there: installs dist/*.whl, without their dependencies
# GPULAYER_BENCH_ARGS passes options to the comparison (`--quick` fits a 15-minute device lease).
# Figures land in $OUT (default /tmp/gpulayer-gpu). It fails when a step fails, and when torch sees no GPU: a run
# whose cuda tests skipped or whose comparison left out its GPU rows checked nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--build-wheels" ]]; then
    for package in packages/*/; do
        python3 -m build --wheel --no-isolation --outdir "${2:?--build-wheels needs a folder}" "$package"
    done
    exit 0
fi
out="${OUT:-/tmp/gpulayer-gpu}"
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$out/gpus.csv"
status=0
if [[ -n "${GPULAYER_WHEELS:-}" ]]; then
    python3 -m pip install --quiet --no-index --no-deps "$GPULAYER_WHEELS"/*.whl
    python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda); \
assert torch.cuda.is_available(), 'torch sees no GPU: the cuda tests would only skip'"
    python3 -m pytest -c pyproject.toml --rootdir . -m cuda -ra -s packages tests 2>&1 | tee "$out/cuda.log" ||
        status=$?
    python=python3
else
    python3 -m pip install --quiet "nox==2026.10.20"
    GPULAYER_REQUIRE_CUDA=1 python3 -m nox --reuse-venv=no -s cuda -- -ra -s 2>&1 | tee "$out/cuda.log" ||
        status=$?
    python3 -m nox --reuse-venv=no -s bench --install-only
    python=.nox/bench/bin/python
fi
# No --guard: the baseline holds the 2-core CPU machine's ratios, which another machine's CPU rows need not match.
# shellcheck disable=SC2086  # the options are words
"$python" benchmarks/lightning_comparison/compare.py ${GPULAYER_BENCH_ARGS:-} --out "$out" 2>&1 | tee "$out/bench.log" || status=$?
"$python" -c "import json, sys; skipped = json.load(open('$out/results.json'))['cuda_skipped']; \
sys.exit(f'the comparison left out its GPU rows: {skipped}' if skipped else 0)" || status=$?
"$python" benchmarks/prefetch/prefetch_speedup.py --out "$out" 2>&1 | tee "$out/prefetch.log" || status=$?
echo "finished with status $status; gpus.csv, cuda.log, RESULTS.md, results.json, chart.png and prefetch.md are in $out"
exit "$status"
