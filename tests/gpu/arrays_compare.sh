#!/usr/bin/env bash
# CUDA arrays, 3D memory, texture and surface objects on a real GPU (tests/apps/arrays.cu): the
# program natively (twice: its output must not vary) and under pilot (cuda backend), stdout
# compared byte for byte; then the pilot-only checks: a freed array's memory is zeroed before the
# next allocation gets it (`scrub`), and another process cannot use a session's array, texture or
# surface handles (`hold` / `forge`). Usage, from anywhere (about 30 s with the build):
#
#   bash tests/gpu/arrays_compare.sh               install pilot (wheels, then the tree), compare
#   bash tests/gpu/arrays_compare.sh --no-install  pilot is already installed in $PILOT_SITE
#
# Environment: OUT (default /tmp/pilot-gpu-out; arrays_compare.log and pilotd-arrays.log go
# there), PILOT_SITE (default /tmp/site), PYTHON (default python3), NVCC_ARCH (default sm_90);
# for a machine without a GPU (checks this script), PILOT_BACKEND=sim with PILOT_SIM_KERNELS (the
# emulation files) and COMPARE_DRY_RUN=1, which runs the "native" side under pilot too.
# Exit status 0 when everything matched, 1 otherwise, 2 when pilot or the program could not be
# set up.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" arrays
PILOT_BACKEND=${PILOT_BACKEND:-cuda}
PILOT_SIM_KERNELS=${PILOT_SIM_KERNELS:-}
COMPARE_DRY_RUN=${COMPARE_DRY_RUN:-0}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG=$OUT/arrays_compare.log
: >"$LOG"

say() { printf '[arrays] %s\n' "$*" | tee -a "$LOG" >&2; }

if [ "${1:-}" != --no-install ]; then
    install_site_wheels || { say "wheels failed to install"; exit 2; }
    install_site_pilot || { say "pilot failed to install"; exit 2; }
fi

WORK=$(mktemp -d /tmp/pilot-arrays.XXXXXX)
SOCK_DIR=$WORK/sock
mkdir -p "$SOCK_DIR"
SOCK=$SOCK_DIR/pilot.sock
cleanup() {
    pilotd_stop
    rm -rf "$WORK"
}
trap cleanup EXIT

BIN=$WORK/arrays
if ! "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -o "$BIN" "$REPO/tests/apps/arrays.cu" \
        >>"$LOG" 2>&1; then
    say "nvcc failed (see $LOG)"
    exit 2
fi
SHIM=$("$PYTHON" -m pilot.cli.pilot shim-path) || { say "pilot shim-path failed"; exit 2; }
daemon_args=(--backend "$PILOT_BACKEND" --socket "$SOCK")
for f in $PILOT_SIM_KERNELS; do daemon_args+=(--sim-kernels "$f"); done
pilotd_start "$OUT/pilotd-arrays.log" "${daemon_args[@]}" || exit 2

pilot() { env LD_PRELOAD="$SHIM" PILOT_SOCKET="$SOCK" timeout -k 5 120 "$@"; }
native() {
    if [ "$COMPARE_DRY_RUN" = 1 ]; then pilot "$@"; else env -u LD_PRELOAD -u PILOT_SOCKET timeout -k 5 120 "$@"; fi
}

bad=0
native "$BIN" >"$WORK/native1" 2>>"$LOG"; rc_n=$?
native "$BIN" >"$WORK/native2" 2>>"$LOG"
pilot "$BIN" >"$WORK/pilot" 2>>"$LOG"; rc_p=$?
{ echo "### native (rc $rc_n)"; cat "$WORK/native1"; echo "### pilot (rc $rc_p)"; cat "$WORK/pilot"; } >>"$LOG"
if ! cmp -s "$WORK/native1" "$WORK/native2"; then
    say "the native output varies between runs:"; diff "$WORK/native1" "$WORK/native2" | tee -a "$LOG"; bad=1
fi
if [ "$rc_n" != "$rc_p" ] || ! cmp -s "$WORK/native1" "$WORK/pilot"; then
    say "native and pilot differ (rc $rc_n vs $rc_p):"
    diff "$WORK/native1" "$WORK/pilot" | tee -a "$LOG"
    bad=1
else
    say "native and pilot print the same $(wc -l <"$WORK/pilot") lines (rc $rc_p)"
fi

# pilot only: scrubbed arrays
got=$(pilot "$BIN" scrub 2>>"$LOG")
if [ "$got" = "scrub nonzero=0" ]; then say "scrub: ok"; else say "scrub: got '$got'"; bad=1; fi

# pilot only: another process's handles
coproc HOLD { pilot "$BIN" hold 2>>"$LOG"; }
read -r -t 60 hold_line <&"${HOLD[0]}" || hold_line=
read -r -t 60 _ <&"${HOLD[0]}" || true
read -r _ a t s <<<"$hold_line"
forged=$(pilot "$BIN" forge "$a" "$t" "$s" 2>>"$LOG")
want="errors read=cudaErrorInvalidResourceHandle
errors write=cudaErrorInvalidResourceHandle
errors texture_over=cudaErrorInvalidResourceHandle
errors destroy_texture=cudaErrorInvalidValue
errors destroy_surface=cudaErrorInvalidValue
errors free_array=cudaErrorInvalidResourceHandle"
echo go >&"${HOLD[1]}"
read -r -t 60 held <&"${HOLD[0]}" || held=
wait "$HOLD_PID" 2>/dev/null
if [ -n "$hold_line" ] && [ "$forged" = "$want" ] && [ "$held" = "hold ok" ]; then
    say "foreign handles refused: ok"
else
    say "foreign handles: hold '$hold_line', forge:"; echo "$forged" | tee -a "$LOG"
    say "holder after: '$held'"
    bad=1
fi

[ "$bad" = 0 ] && say "PASS" || say "FAIL (details in $LOG)"
exit "$bad"
