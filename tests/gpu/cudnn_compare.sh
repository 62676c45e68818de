#!/usr/bin/env bash
# cuDNN on a real GPU (issue 13): tests/apps/cudnn_conv.cu (convolutions through the backend API,
# batch normalization's legacy calls, each checked against the CPU) natively, on NVIDIA's
# libcudnn.so.9 from the Python packages (PyTorch's nvidia-cudnn), and under `pilot run`
# (libpilot-cudnn.so preloaded; pilotd runs NVIDIA's library): stdout must be identical. Then
# `cudnn_conv isolation` under pilot: an execution whose output runs past its buffer is refused.
#
#   tests/gpu/cudnn_compare.sh [--no-install]
#
# Environment: OUT (/tmp/pilot-gpu-out: cudnn-compare.log, pilotd-cudnn.log), PILOT_SITE
# (/tmp/site), PYTHON (python3), NVCC_ARCH (sm_90). Exit status: 0 identical and isolated, 1
# different or failed, 2 pilot not installable, pilotd not started or no cuDNN found.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
COMPARE_NAME=cudnn
# shellcheck source=tests/gpu/compare_setup.sh
. "$REPO/tests/gpu/compare_setup.sh" "$@"

CUDNN_LIB=$("$PYTHON" -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
[ -f "$CUDNN_LIB/libcudnn.so.9" ] || { say "no libcudnn.so.9 in the Python packages ($CUDNN_LIB)"; exit 2; }
say "NVIDIA's cuDNN: $CUDNN_LIB ($(ls "$CUDNN_LIB" | grep -c so) libraries)"
STANDIN=$("$PYTHON" -c 'from pilot.shim import standin_path; print(standin_path("libcudnn.so.9"))')
mkdir -p "$WORK/link"
ln -s "$STANDIN" "$WORK/link/libcudnn.so"
"$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -o "$WORK/cudnn_conv" "$REPO/tests/apps/cudnn_conv.cu" \
    -L "$WORK/link" -lcudnn >>"$LOG" 2>&1 || { say "build failed"; cat "$LOG" >&2; exit 1; }

pilotd_start "$OUT/pilotd-cudnn.log" --backend cuda --socket "$SOCK" || exit 2
status=0
env -u LD_PRELOAD -u PILOT_SOCKET LD_LIBRARY_PATH="$CUDNN_LIB:$TOOLKIT_LIB" "$WORK/cudnn_conv" \
    >"$WORK/native.out" 2>"$WORK/native.err"
native=$?
env PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- "$WORK/cudnn_conv" \
    >"$WORK/pilot.out" 2>"$WORK/pilot.err"
under=$?
{
    echo "### native (exit $native)"; cat "$WORK/native.out" "$WORK/native.err"
    echo "### pilot (exit $under)"; cat "$WORK/pilot.out" "$WORK/pilot.err"
} >>"$LOG"
if [ "$native" = "$under" ] && diff -u "$WORK/native.out" "$WORK/pilot.out" >>"$LOG"; then
    say "cudnn_conv: identical (exit $native, $(grep -c ': ok$' "$WORK/pilot.out") checks ok)"
else
    say "cudnn_conv: DIFFERENT (native exit $native, pilot exit $under)"
    diff -u "$WORK/native.out" "$WORK/pilot.out" >&2
    status=1
fi
cat "$WORK/native.out"
env PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- "$WORK/cudnn_conv" isolation \
    >"$WORK/isolation.out" 2>"$WORK/isolation.err"
isolation=$?
{ echo "### isolation under pilot (exit $isolation)"; cat "$WORK/isolation.out" "$WORK/isolation.err"; } >>"$LOG"
if grep -q "refused at the next synchronize" "$WORK/isolation.out" && [ "$isolation" = 0 ]; then
    say "isolation: the execution past its buffer was refused"
else
    say "isolation: NOT refused as expected:"
    cat "$WORK/isolation.out" "$WORK/isolation.err" >&2
    status=1
fi
grep -iE "dnn|refused" "$OUT/pilotd-cudnn.log" | tail -20 >>"$LOG"
exit $status
