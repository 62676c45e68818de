# shellcheck shell=bash
# The set-up the compare scripts of one program set share (cublas_compare.sh, cudnn_compare.sh,
# driver_compare.sh), sourced with REPO and COMPARE_NAME set and the script's own arguments:
#
#   COMPARE_NAME=cudnn
#   . "$REPO/tests/gpu/compare_setup.sh" "$@"
#
# Sets OUT (/tmp/pilot-gpu-out), PILOT_SITE (/tmp/site), PYTHON (python3), NVCC_ARCH (sm_90) where
# the environment does not; SOCK_DIR (/tmp/pilot-gpu-NAME) and SOCK; PILOT_SITE first on
# PYTHONPATH; say() ("[NAME] ..." on stderr). Installs pilot (run_compare.sh --install-only; exit
# 2 if that fails) unless the first argument is --no-install. LOG: $OUT/NAME-compare.log, emptied;
# WORK: a temporary folder, removed at exit after pilotd_stop (pilotd.sh, sourced here). NVCC: the
# toolkit's nvcc, TOOLKIT_LIB: its lib64.

OUT=${OUT:-/tmp/pilot-gpu-out}
PILOT_SITE=${PILOT_SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
NVCC_ARCH=${NVCC_ARCH:-sm_90}
SOCK_DIR=/tmp/pilot-gpu-$COMPARE_NAME
SOCK=$SOCK_DIR/pilot.sock
export PYTHONPATH="$PILOT_SITE${PYTHONPATH:+:$PYTHONPATH}"

say() { printf '[%s] %s\n' "$COMPARE_NAME" "$*" >&2; }

if [ "${1:-}" != --no-install ]; then
    bash "$REPO/tests/gpu/run_compare.sh" --install-only || exit 2
fi
mkdir -p "$OUT" "$SOCK_DIR"
LOG=$OUT/$COMPARE_NAME-compare.log
: >"$LOG"
WORK=$(mktemp -d "/tmp/pilot-$COMPARE_NAME.XXXXXX")

# shellcheck source=tests/gpu/pilotd.sh
. "$REPO/tests/gpu/pilotd.sh"
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    pilotd_stop
    rm -rf "$WORK"
}
trap cleanup EXIT

NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
TOOLKIT_LIB=$(dirname "$(dirname "$(readlink -f "$NVCC")")")/lib64
