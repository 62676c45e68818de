#!/usr/bin/env bash
# The shared-memory rings (issue 25 item 4) against the socket, side by side in one run on the
# GPU: bench.py's launch and round-trip rows (native, pilot with rings, pilot with PILOT_RING=0,
# pilot with rings and the shim spinning 200 us before it sleeps), REPEATS runs each. Tables in
# $OUT/ring_<mode>.md (each against native); every run's values are printed.
#
#   OUT=/tmp/out bash bench/ring_ab.sh        # after tests/gpu/run_all.sh installed, or alone
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" ring_ab
REPEATS=${REPEATS:-5}  # MODES: a subset of "on off spin200"
mkdir -p "$OUT"
cd "$REPO" || exit 2
"$PYTHON" -c "import pilot" 2>/dev/null || { install_site_wheels && install_site_pilot; } || exit 2
rc=0
for mode in ${MODES:-on off spin200}; do
    extra=()
    [ "$mode" = off ] && extra=(--pilot-env PILOT_RING=0)
    [ "$mode" = spin200 ] && extra=(--pilot-env PILOT_SPIN_US=200)
    say "rings $mode"
    timeout -k 10 300 "$PYTHON" bench/bench.py --start-daemon --only launch --only roundtrip \
        --repeats "$REPEATS" --arch "$NVCC_ARCH" "${extra[@]}" \
        --daemon-log "$OUT/pilotd-ring-$mode.log" --out "$OUT/ring_$mode.md" \
        --json "$OUT/ring_$mode.json" > "$OUT/ring_$mode.out" 2>&1 || rc=1
done
for mode in ${MODES:-on off spin200}; do
    echo "== rings $mode"
    grep -E '^\| `(launch_sync_us|d2h_4b_us|d2h_4b_p99_us|h2d_4b_us)`' "$OUT/ring_$mode.out"
    grep -E 'launch_sync_us|d2h_4b|h2d_4b' "$OUT/ring_$mode.md" 2>/dev/null
done
exit $rc
