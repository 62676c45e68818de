#!/usr/bin/env bash
# Launch-and-wait latency and CUDA-graph inference, natively and under pilot (a pilotd of its
# own; extra arguments go to pilotd), side by side:
#   bench/sync_latency.cu  a kernel spinning T us, alone or as a one-node graph, then a wait
#                          (IDLE=n idle streams besides, as PyTorch keeps pools of them)
#   bench/graph_probe.py   torch.compile(mode="reduce-overhead") MLP inference, per call
# Needs pilot installed in $PILOT_SITE (tests/gpu/run_compare.sh --install-only).
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" graph_latency
IDLE=${IDLE:-64}
WORK=$(mktemp -d /tmp/graph-latency.XXXXXX)
mkdir -p -m 700 "$WORK/sock"
trap 'pilotd_stop; rm -rf "$WORK"' EXIT
nvcc -cudart shared -O2 -arch=sm_90 -o "$WORK/sync_latency" "$REPO/bench/sync_latency.cu" || exit 2
pilotd_start "$WORK/pilotd.log" --socket "$WORK/sock/pilot.sock" "$@" || exit 2
SHIM=$("$PYTHON" -m pilot.cli.pilot shim-path)
under_pilot=(env LD_PRELOAD="$SHIM" PILOT_SOCKET="$WORK/sock/pilot.sock")
echo "## sync_latency native"; "$WORK/sync_latency" "$IDLE"
echo "## sync_latency pilot"; "${under_pilot[@]}" "$WORK/sync_latency" "$IDLE"
echo "## graph_probe native: $("$PYTHON" "$REPO/bench/graph_probe.py" 2>&1 | tail -n 1)"
echo "## graph_probe pilot: $(PILOT_SOCKET="$WORK/sock/pilot.sock" "$PYTHON" -m pilot.cli.pilot run -- \
    "$PYTHON" "$REPO/bench/graph_probe.py" 2>&1 | tail -n 1)"
