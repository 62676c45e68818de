#!/usr/bin/env bash
# What a launch-deciding policy costs per launch: bench/uvm/stream (3 MiB, one kernel and a
# synchronize per pass) under a pilotd with the capacity enforced, once per policy, interleaved.
#
#   bash bench/policy_launch_cost.sh [--backend sim|cuda] [--passes N] [--rounds R]
#       [--capacity SIZE] [--managed-device] [POLICY...] [-- PROGRAM ARGS...]
#
# Prints the wall time per pass of each run. With `-- PROGRAM ARGS...` that program is timed
# instead, alone, under each policy (a whole run per line: `us_per_pass` is its wall time with
# --passes 1); --managed-device serves its cudaMalloc from managed memory, as the policy runner
# does for the Rodinia programs. Needs pilot installed (`pilot shim-path`) and nvcc; with
# --backend sim (the default) no GPU. --capacity is 64MiB unless given.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BACKEND=sim PASSES=10000 ROUNDS=3 POLICIES=() CAPACITY=64MiB MANAGED_DEVICE=false PROGRAM=()
while [ $# -gt 0 ]; do
    case $1 in
        --backend) BACKEND=$2; shift 2 ;;
        --passes) PASSES=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --capacity) CAPACITY=$2; shift 2 ;;
        --managed-device) MANAGED_DEVICE=true; shift ;;
        --) shift; PROGRAM=("$@"); break ;;
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
        echo "capacity = \"$CAPACITY\""
        echo "enforce_capacity = true"
        echo "managed_device_memory = $MANAGED_DEVICE"
        echo "[policy]"
        echo "name = \"$policy\""
    } >"$dir/pilotd.toml"
    python3 -m pilot.daemon --config "$dir/pilotd.toml" --socket "$dir/p.sock" --log-level warning \
        >"$dir/log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do [ -S "$dir/p.sock" ] && break; sleep 0.1; done
    local t0 t1
    t0=$(date +%s.%N)
    if [ ${#PROGRAM[@]} -gt 0 ]; then
        (cd "$dir" && PILOT_SOCKET=$dir/p.sock LD_PRELOAD=$SHIM "${PROGRAM[@]}" >/dev/null)
    else
        PILOT_SOCKET=$dir/p.sock LD_PRELOAD=$SHIM "$WORK/stream" --bytes 3MiB --passes "$PASSES" >/dev/null
    fi
    t1=$(date +%s.%N)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    python3 -c "print(f'policy_launch_cost backend=$BACKEND policy=$policy round=$2 us_per_pass={($t1 - $t0) / $PASSES * 1e6:.1f}')"
}
for r in $(seq "$ROUNDS"); do
    for p in "${POLICIES[@]}"; do run "$p" "$r"; done
done
