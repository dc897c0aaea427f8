#!/usr/bin/env bash
# A flake hunt: the test command, again and again, on a fresh clone of this repository while the machine is loaded.
#
#   bash tools/flake_hunt.sh OUT [--full N] [--tiers N] [--load K] [--commit REV]
#
# Clones REV (default HEAD) into OUT/clone, starts K CPU-bound processes beside the tests (default 1: on a 2-core
# machine that leaves the tests one core's worth of headroom, as a busy CI runner does), then runs the README's
# `nox -s tests` N times (--full, default 5) and the multi-process tiers alone (`nox -s gloo multinode`) N times
# (--tiers, default 20). Each run's log is OUT/full-I.log or OUT/tiers-I.log; OUT/summary.tsv has a line a run
# (kind, index, exit status, seconds, failed tests). The load stops with the hunt, however the hunt ends; Ctrl-C
# stops the run under way too (`kill -- -PGID` from elsewhere).
set -euo pipefail
usage() { echo "usage: bash tools/flake_hunt.sh OUT [--full N] [--tiers N] [--load K] [--commit REV]" >&2; exit 2; }
[ $# -ge 1 ] || usage
out=$(realpath -m "$1"); shift
full=5 tiers=20 load=1 commit=HEAD
while [ $# -gt 0 ]; do
    case "$1" in
        --full) full=$2 ;; --tiers) tiers=$2 ;; --load) load=$2 ;; --commit) commit=$2 ;; *) usage ;;
    esac
    shift 2 || usage
done
for number in "$full" "$tiers" "$load"; do [[ "$number" =~ ^[0-9]+$ ]] || usage; done
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
mkdir -p "$out"
git clone --quiet --no-local "$repo" "$out/clone"
git -C "$out/clone" checkout --quiet --detach "$(git -C "$repo" rev-parse "$commit")"
echo "commit $(git -C "$out/clone" rev-parse --short HEAD), load $load, $(nproc) cores" | tee "$out/summary.tsv"

loaders=()
stop_load() { [ ${#loaders[@]} -eq 0 ] || kill "${loaders[@]}" 2>/dev/null || true; }
trap stop_load EXIT
trap 'exit 130' INT  # bash runs the EXIT trap on a signal only when the signal is trapped
trap 'exit 143' TERM
for _ in $(seq 1 "$load"); do
    python3 -c "while True: pass" &
    loaders+=($!)
done

python3 -m pip install --quiet "nox==2026.10.20"
run() {  # run KIND INDEX NOX-ARGS...
    local kind=$1 index=$2 start status; shift 2
    start=$(date +%s)
    status=0
    # Each session's venv is made by the first run and reused after it (installs still run, as no-ops): the runs
    # repeat the tests, not pip.
    (cd "$out/clone" && python3 -m nox --reuse-existing-virtualenvs "$@") > "$out/$kind-$index.log" 2>&1 || status=$?
    local failed
    failed=$(grep -E "^(FAILED|ERROR) " "$out/$kind-$index.log" | cut -d' ' -f2 | paste -sd, - || true)
    printf '%s\t%s\t%s\t%s\t%s\n' "$kind" "$index" "$status" "$(( $(date +%s) - start ))" "${failed:--}" \
        | tee -a "$out/summary.tsv"
}
for index in $(seq 1 "$full"); do run full "$index" -s tests; done
for index in $(seq 1 "$tiers"); do run tiers "$index" -s gloo multinode; done
