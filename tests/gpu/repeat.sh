#!/usr/bin/env bash
# Runs one test program natively once, then N times under one pilotd, and reports every run whose
# stdout or exit status differs from the native run (with its stderr and the daemon's log tail):
# for telling a flaky difference from a deterministic one.
#
#   bash tests/gpu/repeat.sh PROGRAM N [NVCC_FLAG...] [-- ARG...]
#   e.g. bash tests/gpu/repeat.sh ptds 5 -default-stream per-thread
#
# Environment: OUT, PILOT_SITE, PYTHON, NVCC_ARCH as in run_compare.sh (pilot already installed
# in PILOT_SITE: run `bash tests/gpu/run_compare.sh --install-only` first).
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" repeat
prog=$1 n=$2
shift 2
flags=() args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
[ "${1:-}" = -- ] && shift && args=("$@")
say() { echo "[repeat] $*"; }  # on stdout, unlike env.sh's
work=$(mktemp -d)
mkdir -p "$OUT"
nvcc -cudart shared -O2 "-arch=$NVCC_ARCH" "${flags[@]}" -o "$work/$prog" "$REPO/tests/apps/$prog.cu" || exit 2
"$work/$prog" "${args[@]}" >"$work/native.out" 2>"$work/native.err"
nrc=$?
pilotd_start "$OUT/pilotd-repeat.log" --backend cuda --socket "$work/pilot.sock" --state-dir "$work/state" \
    --metrics-address "" || exit 2
shim=$("$PYTHON" -m pilot.cli.pilot shim-path)
bad=0
for i in $(seq "$n"); do
    LD_PRELOAD=$shim PILOT_SOCKET="$work/pilot.sock" "$work/$prog" "${args[@]}" >"$work/p.out" 2>"$work/p.err"
    prc=$?
    if [ "$prc" != "$nrc" ] || ! cmp -s "$work/native.out" "$work/p.out"; then
        bad=$((bad + 1))
        say "run $i: rc $prc (native $nrc), stdout diff:"
        diff "$work/native.out" "$work/p.out" | head -20
        say "stderr:"; head -20 "$work/p.err"
        say "pilotd log tail:"; tail -15 "$OUT/pilotd-repeat.log"
    fi
done
pilotd_stop
say "$prog: $bad of $n runs under pilot differ from native (native rc $nrc)"
[ "$bad" = 0 ]
