#!/usr/bin/env bash
# cuBLAS and cuBLASLt on a real GPU (issue 13, route B): tests/apps/cublas_gemm.cu and
# cublas_level.cu, linked with NVIDIA's -lcublas -lcublasLt, run natively and under `pilot run`
# (libpilot.so and the stand-ins libpilot-cublas.so, libpilot-cublasLt.so preloaded; pilotd runs
# NVIDIA's libraries), and their stdout must be identical byte for byte. Then `cublas_gemm isolation` under pilot: a
# GEMM reaching past the program's memory is refused and the next synchronize reports it.
#
#   tests/gpu/cublas_compare.sh               install pilot (run_compare.sh --install-only), compare
#   tests/gpu/cublas_compare.sh --no-install  pilot is already installed in $PILOT_SITE
#
# Environment: OUT (default /tmp/pilot-gpu-out: cublas-compare.log, pilotd-cublas.log),
# PILOT_SITE (/tmp/site), PYTHON (python3), NVCC_ARCH (sm_90).
# Exit status: 0 identical and isolated, 1 different or failed, 2 pilot not installable or
# pilotd not started.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
COMPARE_NAME=cublas
# shellcheck source=tests/gpu/compare_setup.sh
. "$REPO/tests/gpu/compare_setup.sh" "$@"
PROGRAMS=(cublas_gemm cublas_level)
for prog in "${PROGRAMS[@]}"; do
    say "building $prog with $NVCC -arch=$NVCC_ARCH against $TOOLKIT_LIB"
    "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -o "$WORK/$prog" \
        "$REPO/tests/apps/$prog.cu" -L "$TOOLKIT_LIB" -lcublasLt -lcublas >>"$LOG" 2>&1 ||
        { say "build failed; see $LOG"; cat "$LOG" >&2; exit 1; }
done

pilotd_start "$OUT/pilotd-cublas.log" --backend cuda --socket "$SOCK" || exit 2
status=0
# runs: a program and its argument (cublas_gemm graph: its calls captured into a CUDA graph)
for run in cublas_gemm cublas_level "cublas_gemm graph"; do
    read -r prog mode <<<"$run"
    tag=$prog${mode:+-$mode}
    env -u LD_PRELOAD -u PILOT_SOCKET LD_LIBRARY_PATH="$TOOLKIT_LIB" "$WORK/$prog" $mode \
        >"$WORK/$tag.native.out" 2>"$WORK/$tag.native.err"
    native=$?
    env PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- "$WORK/$prog" $mode \
        >"$WORK/$tag.pilot.out" 2>"$WORK/$tag.pilot.err"
    under=$?
    {
        echo "### $tag native (exit $native)"; cat "$WORK/$tag.native.out" "$WORK/$tag.native.err"
        echo "### $tag pilot (exit $under)"; cat "$WORK/$tag.pilot.out" "$WORK/$tag.pilot.err"
        echo "### $tag diff"
    } >>"$LOG"
    if [ "$native" = "$under" ] && diff -u "$WORK/$tag.native.out" "$WORK/$tag.pilot.out" >>"$LOG"; then
        say "$tag: identical (exit $native, $(grep -c ': ok$' "$WORK/$tag.pilot.out") checks ok)"
    else
        say "$tag: DIFFERENT (native exit $native, pilot exit $under); see $LOG"
        diff -u "$WORK/$tag.native.out" "$WORK/$tag.pilot.out" >&2
        status=1
    fi
done
env PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- "$WORK/cublas_gemm" isolation \
    >"$WORK/isolation.out" 2>"$WORK/isolation.err"
isolation=$?
{
    echo "### isolation under pilot (exit $isolation)"; cat "$WORK/isolation.out" "$WORK/isolation.err"
} >>"$LOG"
if [ "$(grep -c "next synchronize: cudaErrorInvalidValue" "$WORK/isolation.out")" = 2 ] && [ "$isolation" = 0 ]; then
    say "isolation: the out-of-range GEMM and the foreign pointer array were refused"
else
    say "isolation: NOT refused as expected:"
    cat "$WORK/isolation.out" "$WORK/isolation.err" >&2
    status=1
fi
grep -E "libraries|refused" "$OUT/pilotd-cublas.log" >>"$LOG"
exit $status
