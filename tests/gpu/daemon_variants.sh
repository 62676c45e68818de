#!/usr/bin/env bash
# Runs one program natively and under pilot against pilotd started with each of several sets of
# daemon options, several times each, and prints a checksum of each run's stdout: for telling
# which daemon configuration (GPUs served, vGPUs per GPU) changes a program's output.
#
#   PYTHONPATH=/tmp/site bash tests/gpu/daemon_variants.sh RUNS 'OPTS1' 'OPTS2' ... -- PROGRAM [ARGS...]
#
# e.g. ... 3 '' '--device 0' '--vgpus-per-gpu 1' -- .realprogs/bin/srad_v2 256 256 0 127 0 127 0.5 2
# pilot must be installed (tests/gpu/run_compare.sh --install-only). Each run's stdout goes to
# $OUT/variants/<n>.out; the script prints "<label> run <i>: <md5> (rc)". SHOW_DAEMON_LOG=ERE
# prints the matching lines of each daemon's log after its runs; SHIM=path preloads another shim
# (e.g. libpilot12.so for a CUDA 12 program: `pilot shim-path --cuda 12`).
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/pilot-gpu-out}
PYTHON=${PYTHON:-python3}
runs=$1
shift
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do variants+=("$1"); shift; done
shift
program=("$@")
shim=${SHIM:-$("$PYTHON" -c 'import pilot.shim as s; print(s.shim_path())')}
say() { printf '[variants] %s\n' "$*" >&2; }
# shellcheck source=tests/gpu/pilotd.sh
. "$REPO/tests/gpu/pilotd.sh"
dir=$(mktemp -d /tmp/pilot-variants.XXXXXX)
mkdir -p "$OUT/variants"
n=0

run_one() {  # run_one LABEL ENV...: one run of the program, its checksum printed
    local label=$1 rc
    shift
    n=$((n + 1))
    (cd "$dir" && env "$@" "${program[@]}") >"$OUT/variants/$n.out" 2>"$OUT/variants/$n.err" </dev/null
    rc=$?
    printf '%-28s %s (rc %s)\n' "$label" "$(md5sum <"$OUT/variants/$n.out" | cut -c1-12)" "$rc"
}

for i in $(seq "$runs"); do run_one "native run $i"; done
for opts in "${variants[@]}"; do
    sock=$dir/pilot.sock
    # shellcheck disable=SC2086  # opts is a list of words
    pilotd_start "$dir/pilotd.log" --backend cuda --socket "$sock" --metrics-address "" \
        --state-dir "$dir/state" $opts || continue
    for i in $(seq "$runs"); do
        run_one "pilot '${opts}' run $i" LD_PRELOAD="$shim" PILOT_SOCKET="$sock"
    done
    pilotd_stop
    [ -z "${SHOW_DAEMON_LOG:-}" ] || grep -E "$SHOW_DAEMON_LOG" "$dir/pilotd.log"
done
cd "$REPO" && rm -rf "$dir"
