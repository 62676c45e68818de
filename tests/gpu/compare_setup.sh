# shellcheck shell=bash
# The set-up the compare scripts of one program set share (cublas_compare.sh, cudnn_compare.sh,
# driver_compare.sh), sourced with REPO and COMPARE_NAME set and the script's own arguments:
#
#   COMPARE_NAME=cudnn
#   . "$REPO/tests/gpu/compare_setup.sh" "$@"
#
# The GPU scripts' common environment first (tests/gpu/env.sh: OUT, PILOT_SITE, PYTHON,
# NVCC_ARCH, PYTHONPATH, NVCC, TOOLKIT_LIB, say() as "[NAME] ...", pilotd.sh); then SOCK_DIR
# (/tmp/pilot-gpu-NAME) and SOCK. Installs pilot (run_compare.sh --install-only; exit 2 if that
# fails) unless the first argument is --no-install. LOG: $OUT/NAME-compare.log, emptied; WORK: a
# temporary folder, removed at exit after pilotd_stop.

# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" "$COMPARE_NAME"
SOCK_DIR=/tmp/pilot-gpu-$COMPARE_NAME
SOCK=$SOCK_DIR/pilot.sock

if [ "${1:-}" != --no-install ]; then
    install_site_pilot || exit 2
fi
mkdir -p "$OUT" "$SOCK_DIR"
LOG=$OUT/$COMPARE_NAME-compare.log
: >"$LOG"
WORK=$(mktemp -d "/tmp/pilot-$COMPARE_NAME.XXXXXX")

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    pilotd_stop
    rm -rf "$WORK"
}
trap cleanup EXIT
