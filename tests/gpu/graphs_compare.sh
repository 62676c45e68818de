#!/usr/bin/env bash
# CUDA graphs on a real GPU: builds tests/apps/graphs.cu, graph_mem.cu (graph memory nodes),
# graph_launch.cu and graph_params.cu (node parameters read back and set),
# runs each natively and under pilot and diffs stdout byte for byte, then runs `graphs garbage`
# under pilot (destroyed and made-up handles: every line but the last must be
# cudaErrorInvalidValue). About 40 s with the builds. `graph_mem moved` is compared as well.
#
#   bash tests/gpu/run_compare.sh --install-only   # once: pilot into $PILOT_SITE
#   bash tests/gpu/graphs_compare.sh
#
# Environment: PILOT_SITE (default /tmp/site), PYTHON (python3), NVCC_ARCH (sm_90), OUT
# (/tmp/pilot-gpu-out: PROGRAM.native.out, PROGRAM.pilot.out, PROGRAM.diff, pilotd-graphs.log);
# PILOT_BACKEND=sim with PILOT_SIM_KERNELS (space-separated files) and COMPARE_DRY_RUN=1 (the
# "native" run under pilot too) check this script on a machine without a GPU.
# Exit status: 0 when both checks pass, 1 otherwise, 2 when the build or the daemon failed.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" graphs
SOCK_DIR=/tmp/pilot-gpu-graphs
SOCK=$SOCK_DIR/pilot.sock
PILOT_BACKEND=${PILOT_BACKEND:-cuda}
PILOT_SIM_KERNELS=${PILOT_SIM_KERNELS:-}
COMPARE_DRY_RUN=${COMPARE_DRY_RUN:-0}
export PYTHONUNBUFFERED=1

mkdir -p "$OUT" "$SOCK_DIR"
WORK=$(mktemp -d /tmp/pilot-graphs.XXXXXX)
trap 'pilotd_stop; rm -rf "$WORK"' EXIT

PROGRAMS=(graphs graph_mem graph_launch graph_params)
for prog in "${PROGRAMS[@]}"; do
    say "building $prog.cu with $NVCC -arch=$NVCC_ARCH"
    "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -o "$WORK/$prog" "$REPO/tests/apps/$prog.cu" \
        || exit 2
done
SHIM=$("$PYTHON" -m pilot.cli.pilot shim-path) || { say "pilot shim-path failed"; exit 2; }
rm -f "$SOCK"
daemon_args=(--backend "$PILOT_BACKEND" --socket "$SOCK")
for f in $PILOT_SIM_KERNELS; do daemon_args+=(--sim-kernels "$f"); done
pilotd_start "$OUT/pilotd-graphs.log" "${daemon_args[@]}" || exit 2
native_env=(env -u LD_PRELOAD -u PILOT_SOCKET)
[ "$COMPARE_DRY_RUN" = 1 ] && native_env=(env LD_PRELOAD="$SHIM" PILOT_SOCKET="$SOCK")

bad=0
# each run: the program and its argument, if any (graph_mem moved: memory nodes in a moved child)
for run in graphs graph_mem "graph_mem moved" graph_launch graph_params; do
    read -r prog arg <<<"$run"
    tag=${run// /_}
    # shellcheck disable=SC2086  # $arg: no word at all when there is no argument
    timeout -k 5 120 "${native_env[@]}" "$WORK/$prog" $arg >"$OUT/$tag.native.out" 2>"$WORK/native.err"
    nrc=$?
    # shellcheck disable=SC2086
    timeout -k 5 120 env LD_PRELOAD="$SHIM" PILOT_SOCKET="$SOCK" "$WORK/$prog" $arg \
        >"$OUT/$tag.pilot.out" 2>"$WORK/pilot.err"
    prc=$?
    if diff -u "$OUT/$tag.native.out" "$OUT/$tag.pilot.out" >"$OUT/$tag.diff" && [ "$nrc" = 0 ] \
            && [ "$prc" = 0 ]; then
        say "$run: identical natively and under pilot ($(wc -l <"$OUT/$tag.pilot.out") lines)"
    else
        say "$run: DIFFERENT (native rc $nrc, pilot rc $prc); diff native pilot:"
        cat "$OUT/$tag.diff" >&2
        say "native stderr:"; cat "$WORK/native.err" >&2
        say "pilot stderr:"; cat "$WORK/pilot.err" >&2
        bad=1
    fi
done

timeout -k 5 60 env LD_PRELOAD="$SHIM" PILOT_SOCKET="$SOCK" "$WORK/graphs" garbage \
    >"$WORK/garbage.out" 2>"$WORK/garbage.err"
grc=$?
if [ "$grc" = 0 ] && [ "$(tail -n 1 "$WORK/garbage.out")" = "garbage done" ] \
        && [ "$(grep -vc ' cudaErrorInvalidValue$' "$WORK/garbage.out")" = 1 ]; then
    say "graphs garbage (pilot only): every bad handle refused"
else
    say "graphs garbage: FAILED (rc $grc):"
    cat "$WORK/garbage.out" "$WORK/garbage.err" >&2
    bad=1
fi
exit $bad
