#!/usr/bin/env bash
# What a launch-deciding policy costs per launch: bench/uvm/stream (3 MiB, one kernel and a
# synchronize per pass) under a pilotd with the capacity enforced, once per policy, interleaved.
#
#   bash bench/policy_launch_cost.sh [--backend sim|cuda] [--passes N] [--rounds R] [POLICY...]
#
# Prints the wall time per pass of each run. Needs pilot installed (`pilot shim-path`) and nvcc;
# with --backend sim (the default) no GPU.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BACKEND=sim PASSES=10000 ROUNDS=3 POLICIES=()
while [ $# -gt 0 ]; do
    case $1 in
        --backend) BACKEND=$2; shift 2 ;;
        --passes) PASSES=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        *) POLICIES+=("$1"); shift ;;
    esac
done
[ ${#POLICIES[@]} -gt 0 ] || POLICIES=(none mfit amfit)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
nvcc -O2 -arch=sm_90 -cudart shared -I"$REPO/bench/uvm" -I"$REPO/bench" -o "$WORK/stream" "$REPO/bench/uvm/stream.cu"
SHIM=$(pilot shim-path)
run() {
    local policy=$1 dir="$WORK/$1-$2"
    mkdir -p "$dir"
    {
        echo "[daemon]"
        echo "backend = \"$BACKEND\""
        [ "$BACKEND" = sim ] && echo "sim_kernels = [\"$REPO/bench/policy_sim_kernels.py\"]"
        echo "[gpu]"
        echo 'capacity = "64MiB"'
        echo "enforce_capacity = true"
        echo "[policy]"
        echo "name = \"$policy\""
    } >"$dir/pilotd.toml"
    python3 -m pilot.daemon --config "$dir/pilotd.toml" --socket "$dir/p.sock" --log-level warning \
        >"$dir/log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do [ -S "$dir/p.sock" ] && break; sleep 0.1; done
    local t0 t1
    t0=$(date +%s.%N)
    PILOT_SOCKET=$dir/p.sock LD_PRELOAD=$SHIM "$WORK/stream" --bytes 3MiB --passes "$PASSES" >/dev/null
    t1=$(date +%s.%N)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    python3 -c "print(f'policy_launch_cost backend=$BACKEND policy=$policy round=$2 us_per_pass={($t1 - $t0) / $PASSES * 1e6:.1f}')"
}
for r in $(seq "$ROUNDS"); do
    for p in "${POLICIES[@]}"; do run "$p" "$r"; done
done
