#!/usr/bin/env bash
# The one run a GPU machine owes issues 7 and 10: its GPU, the `cuda` nox session (every test marked cuda, the
# two-GPU ones where there are two), the full comparison with its CUDA rows, and prefetching's speed-up. Usage, from the repository root:
#   GPULAYER_TORCH="torch==2.13.0" OUT=/tmp/gpulayer-gpu bash tools/gpu_check.sh
# GPULAYER_TORCH names a CUDA build of torch where the default index serves a CPU one. Figures land in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpulayer-gpu}"
mkdir -p "$out"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$out/gpus.csv"
python3 -m pip install --quiet "nox==2026.10.20"
status=0
python3 -m nox -s cuda -- -ra -s 2>&1 | tee "$out/cuda.log" || status=$?
python3 -m nox -s bench -- --guard 0.10 --out "$out" 2>&1 | tee "$out/bench.log" || status=$?
.nox/bench/bin/python benchmarks/prefetch/prefetch_speedup.py --out "$out" 2>&1 | tee "$out/prefetch.log" || status=$?
echo "finished with status $status; RESULTS.md, results.json, chart.png and prefetch.md are in $out"
exit "$status"
