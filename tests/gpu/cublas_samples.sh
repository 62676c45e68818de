#!/usr/bin/env bash
# The CUDA samples that use cuBLAS (issue 13, route B), built on the GPU machine against NVIDIA's
# cuBLAS and run natively and under `pilot run`: batchCUBLAS (gemm on several streams, pointer-
# array batches), matrixMulCUBLAS, simpleCUBLAS (Set/GetVector, Sgemm), simpleCUBLAS_LU
# (getrfBatched), UnifiedMemoryStreams (dgemv on managed memory from OpenMP threads). Their
# stdout is compared with the timing lines dropped (the regex of tests/gpu/real_programs.sh);
# UnifiedMemoryStreams seeds from the clock and schedules OpenMP threads dynamically, so only its
# verdict lines and exit status are compared.
#
#   tests/gpu/cublas_samples.sh [--no-install]
#
# Needs the samples' sources (hack/fetch_real_programs.sh): carry .realprogs-src/cuda-samples/
# Common and the five sample directories. Environment: OUT (/tmp/pilot-gpu-out:
# cublas-samples.log, pilotd-samples.log), PILOT_SITE (/tmp/site), PYTHON, NVCC_ARCH (sm_90).
# Exit status: 0 every program the same, 1 a difference, 2 setup failed.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" samples
CS=$REPO/.realprogs-src/cuda-samples
SOCK=/tmp/pilot-gpu-samples/pilot.sock
# tests/gpu/real_programs.sh's "generic" filter: lines that report times or rates
DROP='\b(time|timing|elapsed|throughput|bandwidth|gflops|tflops|flops|tops)\b|[0-9][[:space:]]*(ms|msec|msecs|millisec|milliseconds|s|sec|secs|seconds|us|usec|usecs|ns)\b|/sec\b|per second|[a-z]/s\b|^exec:'

if [ "${1:-}" != --no-install ]; then
    install_site_pilot || exit 2
fi
[ -d "$CS/Common" ] || { say "no $CS/Common: carry the samples' sources"; exit 2; }
mkdir -p "$OUT" "$(dirname "$SOCK")"
LOG=$OUT/cublas-samples.log
: >"$LOG"
WORK=$(mktemp -d /tmp/pilot-samples.XXXXXX)
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() { pilotd_stop; rm -rf "$WORK"; }
trap cleanup EXIT

LIB=$TOOLKIT_LIB
# name | source | extra flags | compare (all: filtered stdout; verdict: lines matching the ERE)
PROGRAMS=(
    "batchCUBLAS|4_CUDA_Libraries/batchCUBLAS/batchCUBLAS.cpp||all"
    "matrixMulCUBLAS|4_CUDA_Libraries/matrixMulCUBLAS/matrixMulCUBLAS.cpp||all"
    "simpleCUBLAS|4_CUDA_Libraries/simpleCUBLAS/simpleCUBLAS.cpp||all"
    "simpleCUBLAS_LU|4_CUDA_Libraries/simpleCUBLAS_LU/simpleCUBLAS_LU.cpp||all"
    "UnifiedMemoryStreams|0_Introduction/UnifiedMemoryStreams/UnifiedMemoryStreams.cu|-Xcompiler -fopenmp -lgomp|verdict"
)
pilotd_start "$OUT/pilotd-samples.log" --backend cuda --socket "$SOCK" || exit 2
status=0
for row in "${PROGRAMS[@]}"; do
    IFS='|' read -r name src flags compare <<<"$row"
    # shellcheck disable=SC2086  # flags is a list of words
    if ! "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -std=c++17 -I "$CS/Common" \
            -o "$WORK/$name" "$CS/Samples/$src" $flags -L "$LIB" -lcublas >>"$LOG" 2>&1; then
        say "$name: build failed (see $LOG)"
        status=1
        continue
    fi
    (cd "$WORK" && env -u LD_PRELOAD -u PILOT_SOCKET timeout 120 "./$name" >"$name.native" 2>&1)
    nrc=$?
    (cd "$WORK" && env PILOT_SOCKET="$SOCK" timeout 120 "$PYTHON" -m pilot.cli.pilot run -- \
        "./$name" >"$name.pilot" 2>&1)
    prc=$?
    for side in native pilot; do
        if [ "$compare" = verdict ]; then
            grep -E "All Done|PASS|FAIL|Error|error" "$WORK/$name.$side" >"$WORK/$name.$side.cmp"
        else
            grep -Eiv -- "$DROP" "$WORK/$name.$side" >"$WORK/$name.$side.cmp"
        fi
    done
    {
        echo "### $name native (exit $nrc)"; cat "$WORK/$name.native"
        echo "### $name pilot (exit $prc)"; cat "$WORK/$name.pilot"
        echo "### $name diff ($compare)"
    } >>"$LOG"
    if [ "$nrc" = "$prc" ] && diff -u "$WORK/$name.native.cmp" "$WORK/$name.pilot.cmp" >>"$LOG"; then
        say "$name: same (exit $nrc, $(wc -l <"$WORK/$name.pilot.cmp") lines compared)"
    else
        say "$name: DIFFERENT (native exit $nrc, pilot exit $prc); see $LOG"
        status=1
    fi
done
grep -E "libraries|refused|Traceback" "$OUT/pilotd-samples.log" >>"$LOG"
exit $status
