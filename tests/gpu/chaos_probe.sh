#!/usr/bin/env bash
# A test program under pilotd's forced preemption (`[priority] preempt_chaos`), in a few settings,
# to find what hangs or differs there; from the repository root on the GPU machine, .whl carried:
#
#   OUT=DIR bash tests/gpu/chaos_probe.sh [--no-install] PROGRAM [ARGS...]
#
# PROGRAM is a tests/apps program (built with nvcc). For each setting of PROBE_SETTINGS (default
# "300us:6 300us:1 1ms:6": the chaos mean, then the most preemptible parts a launch gets,
# scheduling/preempt.CHAOS_PARTS) pilotd starts afresh, the program runs natively once and under
# pilot up to PROBE_RUNS times (default 3) within PROBE_TIMEOUT s each (default 40); a run that
# times out gets py-spy's dump of pilotd's threads (native frames too) and `pilotctl status
# --json` into OUT. Prints a line per run; pilotd's logs go to OUT. Without a GPU:
# PILOT_BACKEND=sim PROBE_DAEMON_ARGS="--sim-kernels tests/apps/sim_kernels.py ...".
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" chaos_probe
install=1
[ "${1:-}" = --no-install ] && { install=0; shift; }
PROG=$1
shift
PROBE_SETTINGS=${PROBE_SETTINGS:-"300us:6 300us:1 1ms:6"}
PROBE_RUNS=${PROBE_RUNS:-3}
PROBE_TIMEOUT=${PROBE_TIMEOUT:-40}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/pilot-probe.XXXXXX)
trap 'pilotd_stop; rm -rf "$WORK"' EXIT
if [ "$install" = 1 ]; then
    install_site_wheels && install_site_pilot || exit 2
fi
"$NVCC" -cudart shared "-arch=$NVCC_ARCH" -O2 -o "$WORK/$PROG" "$REPO/tests/apps/$PROG.cu" || exit 2
SHIM=$("$PYTHON" -m pilot.cli.pilot shim-path) || exit 2
timeout 60 "$WORK/$PROG" "$@" >"$WORK/native.out" 2>&1
echo "native: rc $?"
SOCK=$WORK/pilot.sock
for setting in $PROBE_SETTINGS; do
    chaos=${setting%%:*} parts=${setting##*:}
    tag="$PROG-$chaos-$parts"
    printf '[daemon]\nlog_level = "info"\n[priority]\npreempt_chaos = "%s"\n' "$chaos" >"$WORK/chaos.toml"
    # shellcheck disable=SC2086  # PROBE_DAEMON_ARGS is a list of words
    env -u LD_PRELOAD -u PILOT_SOCKET PROBE_PARTS="$parts" "$PYTHON" -c '
import os, sys
import pilot.daemon.scheduling.preempt as preempt
preempt.CHAOS_PARTS = int(os.environ["PROBE_PARTS"])
from pilot.daemon.main import main
sys.argv[0] = "pilotd"
main()' --backend "${PILOT_BACKEND:-cuda}" ${PROBE_DAEMON_ARGS:-} --socket "$SOCK" --config "$WORK/chaos.toml" </dev/null >"$OUT/pilotd-$tag.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 600); do grep -q "pilotd ready" "$OUT/pilotd-$tag.log" && break; sleep 0.1; done
    for run in $(seq "$PROBE_RUNS"); do
        start=$SECONDS
        timeout -k 5 "$PROBE_TIMEOUT" env LD_PRELOAD="$SHIM" PILOT_SOCKET="$SOCK" "$WORK/$PROG" "$@" \
            >"$WORK/pilot.out" 2>"$WORK/pilot.err" &
        prog=$!
        while kill -0 "$prog" 2>/dev/null && [ $((SECONDS - start)) -lt $((PROBE_TIMEOUT - 5)) ]; do sleep 0.5; done
        if kill -0 "$prog" 2>/dev/null; then  # about to time out: what pilotd's threads do
            py-spy dump --native --pid "$DAEMON_PID" >"$OUT/dump-$tag-$run.txt" 2>&1
            "$PYTHON" -m pilot.cli.pilotctl --control-socket "$WORK/control.sock" status --json \
                >"$OUT/status-$tag-$run.json" 2>&1
        fi
        wait "$prog"
        rc=$?
        same=differs
        cmp -s "$WORK/native.out" "$WORK/pilot.out" && same=identical
        echo "$tag run $run: rc $rc in $((SECONDS - start)) s, $same"
        [ "$same" = identical ] || tail -n 5 "$WORK/pilot.err"
        [ "$rc" = 124 ] && break
    done
    pilotd_stop
    grep -a "preemptible launches" "$OUT/pilotd-$tag.log" | tail -n 3
done
