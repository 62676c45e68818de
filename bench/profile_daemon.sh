#!/usr/bin/env bash
# Where pilotd's time goes on the hot paths (issue 14): py-spy samples the daemon while a program
# under the shim launches empty kernels (bench/launch.cu), then while it does 4-byte D2H copies
# (bench/roundtrip.cu); bench/profile_summary.py prints each profile's functions by own and
# inclusive time. On the GPU machine, from the repository root (carry .whl and a static py-spy
# binary in .gl/py-spy; run_all.sh's wheels and install stages must have run, or run them here):
#
#   bash bench/profile_daemon.sh [OUT]        (default OUT: $OUT or /tmp/pilot-gpu-out)
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" profile
OUT=${1:-$OUT}
PYSPY=${PYSPY:-$REPO/.gl/py-spy}
BACKEND=${BACKEND:-cuda}
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$OUT"
work=$(mktemp -d /tmp/pilot-prof-XXXX)
for p in launch roundtrip; do
    nvcc -cudart shared -O2 -o "$work/$p" "$REPO/bench/$p.cu" || exit 2
done
args=(--backend "$BACKEND" --socket "$work/pilot.sock" --state-dir "$work/state" --metrics-address "")
[ "$BACKEND" = sim ] && args+=(--sim-kernels "$REPO/bench/sim_kernels.py")
"$PYTHON" -m pilot.daemon "${args[@]}" >"$OUT/pilotd-profile.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do grep -q "pilotd ready" "$OUT/pilotd-profile.log" && break; sleep 0.1; done
shim=$("$PYTHON" -m pilot.cli.pilot shim-path)
run() { LD_PRELOAD=$shim PILOT_SOCKET=$work/pilot.sock "$@"; }
profile() { # NAME SECONDS COMMAND...: the program runs while py-spy samples pilotd
    local name=$1 secs=$2
    shift 2
    "$PYSPY" record -p "$daemon" --threads -f raw -r 4000 -d "$secs" -o "$OUT/profile-$name.txt" --nonblocking \
        >"$OUT/pyspy-$name.log" 2>&1 &
    local spy=$!
    sleep 0.5
    run "$@" >"$OUT/prog-$name.txt" 2>&1
    wait "$spy"
    echo "== $name: $(tr '\n' ' ' <"$OUT/prog-$name.txt")"
    "$PYTHON" "$REPO/bench/profile_summary.py" "$OUT/profile-$name.txt" | tee "$OUT/summary-$name.txt"
}
profile launch 6 "$work/launch" 1500000 1000
profile roundtrip 6 "$work/roundtrip" 200000
kill "$daemon"
wait "$daemon" 2>/dev/null
rm -rf "$work"
