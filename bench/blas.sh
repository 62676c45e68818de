#!/usr/bin/env bash
# What a cuBLAS call costs under pilot against natively (bench/blas.cu, built against NVIDIA's
# cuBLAS on the GPU machine): both sides run in one call, interleaved REPEATS times; prints each
# metric's medians and pilot / native.
#
#   OUT=... bash bench/blas.sh [--no-install] [REPEATS (3)]
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" blas
SOCK=/tmp/pilot-gpu-blas/pilot.sock
if [ "${1:-}" = --no-install ]; then shift; else install_site_pilot || exit 2; fi
REPEATS=${1:-3}
mkdir -p "$OUT/blas" "$(dirname "$SOCK")"
LIB=$TOOLKIT_LIB
"$NVCC" -cudart shared -O2 -arch=sm_90 -o "$OUT/blas/blas" "$REPO/bench/blas.cu" -L "$LIB" \
    -lcublasLt -lcublas || exit 2
trap pilotd_stop EXIT
pilotd_start "$OUT/blas/pilotd.log" --backend cuda --socket "$SOCK" || exit 2
: >"$OUT/blas/native.txt"
: >"$OUT/blas/pilot.txt"
for _ in $(seq "$REPEATS"); do
    env -u LD_PRELOAD LD_LIBRARY_PATH="$LIB" "$OUT/blas/blas" >>"$OUT/blas/native.txt" || exit 1
    env PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- "$OUT/blas/blas" >>"$OUT/blas/pilot.txt" || exit 1
done
"$PYTHON" - "$OUT/blas/native.txt" "$OUT/blas/pilot.txt" <<'PY'
import statistics, sys
def read(path):
    out = {}
    for line in open(path):
        name, value = line.split()
        out.setdefault(name, []).append(float(value))
    return {k: statistics.median(v) for k, v in out.items()}
native, pilot = read(sys.argv[1]), read(sys.argv[2])
print("| metric | native | pilot | pilot / native |\n| --- | --- | --- | --- |")
for k in native:
    print(f"| {k} | {native[k]:.2f} | {pilot[k]:.2f} | {pilot[k] / native[k]:.2f}x |")
PY
