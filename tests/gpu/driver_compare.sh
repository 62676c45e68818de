#!/usr/bin/env bash
# The driver API on a real GPU (issue 13): tests/apps/driver_api.cu, tests/apps/linker.cu (the
# linker, cuLink*), tests/apps/driver_host.cu (host registration and functions, 2D copies) and
# driver_api.cu again built with `-default-stream per-thread` (the _ptsz/_ptds forms),
# linked with -lcuda, run natively and under `pilot run` (libpilot.so +
# libpilot-cuda.so preloaded), and their stdout must be identical byte for byte. Also records what the machine's real libcuda.so.1 exports against
# shim/tables/cuda_driver_exports.tsv and whether its symbols are versioned (informational).
#
#   tests/gpu/driver_compare.sh               install pilot (run_compare.sh --install-only), compare
#   tests/gpu/driver_compare.sh --no-install  pilot is already installed in $PILOT_SITE
#
# Environment: OUT (default /tmp/pilot-gpu-out: driver-compare.log, pilotd-driver.log), PILOT_SITE
# (default /tmp/site), PYTHON (python3), NVCC_ARCH (sm_90); PILOT_BACKEND=sim with
# PILOT_SIM_KERNELS (emulation files) and COMPARE_DRY_RUN=1 run the "native" side under pilot too
# (checks this script on a machine without a GPU).
# Exit status: 0 identical, 1 different or failed, 2 pilot not installable or pilotd not started.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
COMPARE_NAME=driver
# shellcheck source=tests/gpu/compare_setup.sh
. "$REPO/tests/gpu/compare_setup.sh" "$@"
PILOT_BACKEND=${PILOT_BACKEND:-cuda}
PILOT_SIM_KERNELS=${PILOT_SIM_KERNELS:-}
COMPARE_DRY_RUN=${COMPARE_DRY_RUN:-0}
STUBS=$TOOLKIT_LIB/stubs
if [ ! -e "$STUBS/libcuda.so" ]; then  # a toolkit without the stub: link with pilot's libcuda.so.1
    STUBS=$WORK/stubs
    mkdir -p "$STUBS"
    ln -s "$("$PYTHON" -c 'from pilot.shim import driver_path; print(driver_path())')" "$STUBS/libcuda.so"
fi
KERNELS=$REPO/tests/apps/driver_kernels.cu
say "building driver_api with $NVCC -arch=$NVCC_ARCH"
"$NVCC" -cubin "-arch=$NVCC_ARCH" -o "$WORK/driver_kernels.cubin" "$KERNELS" >>"$LOG" 2>&1 &&
    "$NVCC" -fatbin "-arch=$NVCC_ARCH" -o "$WORK/driver_kernels.fatbin" "$KERNELS" >>"$LOG" 2>&1 &&
    "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" "-DDRV_FATBIN=$WORK/driver_kernels.fatbin" \
        -o "$WORK/driver_api" "$REPO/tests/apps/driver_api.cu" -L "$STUBS" -lcuda >>"$LOG" 2>&1 &&
    "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" "-DDRV_FATBIN=$WORK/driver_kernels.fatbin" \
        -default-stream per-thread -o "$WORK/driver_api_ptds" "$REPO/tests/apps/driver_api.cu" \
        -L "$STUBS" -lcuda >>"$LOG" 2>&1 &&
    "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -o "$WORK/linker" "$REPO/tests/apps/linker.cu" \
        -L "$STUBS" -lcuda >>"$LOG" 2>&1 &&
    "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -o "$WORK/driver_host" \
        "$REPO/tests/apps/driver_host.cu" -L "$STUBS" -lcuda >>"$LOG" 2>&1 ||
    { say "build failed; see $LOG"; cat "$LOG" >&2; exit 1; }

REAL=$(env -u LD_PRELOAD ldd "$WORK/driver_api" | awk '/libcuda\.so\.1/ {print $3}')
{
    echo "### the machine's libcuda.so.1: $REAL"
    readelf -V "$REAL" 2>&1 | head -20
    echo "### hack/check_api_table.py --libcuda $REAL"
    "$PYTHON" "$REPO/hack/check_api_table.py" --libcuda "$REAL" 2>&1 | sed -n '/cuda_driver_exports/,$p'
} >>"$LOG"

daemon_args=(--backend "$PILOT_BACKEND" --socket "$SOCK")
for f in $PILOT_SIM_KERNELS; do daemon_args+=(--sim-kernels "$f"); done
pilotd_start "$OUT/pilotd-driver.log" "${daemon_args[@]}" || exit 2
CUBIN=$WORK/driver_kernels.cubin
status=0
# compare NAME ARGS...: the program natively and under pilot, stdout identical
compare() {
    local name=$1 native under
    shift
    if [ "$COMPARE_DRY_RUN" = 1 ]; then
        env PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- "$WORK/$name" "$@" \
            >"$WORK/$name.native.out" 2>"$WORK/$name.native.err"
    else
        env -u LD_PRELOAD -u PILOT_SOCKET "$WORK/$name" "$@" \
            >"$WORK/$name.native.out" 2>"$WORK/$name.native.err"
    fi
    native=$?
    env PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- "$WORK/$name" "$@" \
        >"$WORK/$name.pilot.out" 2>"$WORK/$name.pilot.err"
    under=$?
    if ! kill -0 "$DAEMON_PID" 2>/dev/null; then  # the next program gets a pilotd again
        say "pilotd died during $name (see $OUT/pilotd-driver.log): started again for the next program"
        pilotd_stop
        cp "$OUT/pilotd-driver.log" "$OUT/pilotd-driver.$name.log"
        pilotd_start "$OUT/pilotd-driver.log" "${daemon_args[@]}" || exit 2
    fi
    {
        echo "### $name native (exit $native)"; cat "$WORK/$name.native.out" "$WORK/$name.native.err"
        echo "### $name pilot (exit $under)"; cat "$WORK/$name.pilot.out" "$WORK/$name.pilot.err"
        echo "### $name diff"
    } >>"$LOG"
    if [ "$native" = "$under" ] && diff -u "$WORK/$name.native.out" "$WORK/$name.pilot.out" >>"$LOG"; then
        say "$name: identical (exit $native); log $LOG"
        return 0
    fi
    say "$name: DIFFERENT (native exit $native, pilot exit $under); see $LOG"
    diff -u "$WORK/$name.native.out" "$WORK/$name.pilot.out" >&2
    status=1
}
compare driver_api "$CUBIN"
compare driver_api_ptds "$CUBIN"  # the same, built with per-thread default streams: _ptsz/_ptds
compare linker
compare driver_host
exit $status
