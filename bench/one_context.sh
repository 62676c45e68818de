#!/usr/bin/env bash
# Does one CUDA context serialize many submitters? (issue 25, graph inference at N=16.)
# bench/one_context.cu's step (a graph of 8 tiny kernels, a kernel, a stream synchronization)
# repeated by N submitters at once, as:
#   threads   N threads of one process (one context, like pilotd's vGPU threads),
#             CUDA_DEVICE_MAX_CONNECTIONS=32 as pilotd sets it
#   green     N threads of one process, each in a green context of its own over all SMs
#             (the memory the primary context's, as a tenant's is in pilotd)
#   ctxs      N threads of one process, each in a context of its own (cuCtxCreate)
#   procs     N processes (time-sliced contexts)
#   mps       N processes under a private MPS control daemon
#   mps1      N threads of one process under MPS
#   pilot     N processes under `pilot run` against a pilotd started here
#   confined  the same against a pilotd in the confined mode ([isolation] tenants = "all",
#             mps = true), each process a user of its own (uid 21000 + i, by setpriv: run as
#             root): N engines, each an MPS client, submit instead of one pilotd. A pass of 1 s
#             first starts the engines; the measured pass follows.
# From the repository root on the GPU machine, after `bash tests/gpu/run_all.sh smoke`:
#
#   OUT=DIR NS="1 4 8 16" SECONDS_EACH=3 bash bench/one_context.sh
#
# MODES picks modes (all by default); for pilot, CLIENT_ENV (NAME=VALUE words for the
# programs, e.g. PILOT_WORD_NAP_US=5) and PILOTD_ARGS (more pilotd arguments); LABEL names the
# rows (default: the mode).
#
# Prints a table (mode, N, steps/s summed, median and p99 step in us): $OUT/one_context.md;
# every process's own lines and errors: $OUT/one_context.log.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" one_context
NS=${NS:-"1 4 8 16"}
SECS=${SECONDS_EACH:-3}
MODES=${MODES:-"threads green ctxs procs mps mps1 pilot confined"}
WORK=$(mktemp -d /tmp/pilot-onectx.XXXXXX)
chmod 755 "$WORK"  # the confined mode's users run the program and reach the socket
SOCK=$WORK/pilot.sock
BIN=$WORK/one_context
mkdir -p "$OUT"
: >"$OUT/one_context.log"
STUBS=$TOOLKIT_LIB/stubs  # links -lcuda for the green and ctx places
nvcc -O2 -std=c++17 -cudart shared -arch="$NVCC_ARCH" -o "$BIN" "$REPO/bench/one_context.cu" \
    -L"$STUBS" -lcuda || exit 1

# procs N ENV...: N processes of one thread at once; one line per process. With AS_USERS=1,
# process i runs as uid 21000 + i.
procs() {
    local n=$1 pids=() i as=()
    shift
    for ((i = 0; i < n; i++)); do
        [ "${AS_USERS:-0}" = 1 ] && as=(setpriv --reuid=$((21000 + i)) --regid=$((21000 + i))
            --clear-groups env HOME=/tmp USER=u$((21000 + i)) LOGNAME=u$((21000 + i)))
        "${as[@]}" env "$@" "$BIN" 1 "${PASS_SECS:-$SECS}" >"$WORK/p$i.out" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    cat "$WORK"/p*.out
    rm -f "$WORK"/p*.out
}

# summed LINES: one row from per-process lines (steps/s summed; the worst median and p99)
summed() {
    awk '/^threads/ {s += $4; if ($6 > m) m = $6; if ($8 > p) p = $8; k++}
         END {if (k) printf "%.0f | %.1f | %.1f", s, m, p; else printf "failed | - | -"}'
}

row() { printf '| %s | %s | %s |\n' "$1" "$2" "$3" | tee -a "$OUT/one_context.md"; }

printf '| mode | N | steps/s | median us | p99 us |\n| --- | --- | --- | --- | --- |\n' |
    tee "$OUT/one_context.md"
for mode in $MODES; do
    case $mode in
    mps | mps1)
        export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps-pipe CUDA_MPS_LOG_DIRECTORY=$WORK/mps-log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        nvidia-cuda-mps-control -d || { row "$mode" - "MPS did not start"; continue; }
        ;;
    pilot | confined)
        config=()
        if [ "$mode" = confined ]; then
            printf '[isolation]\ntenants = "all"\nmps = true\n' >"$WORK/confined.toml"
            config=(--config "$WORK/confined.toml")
        fi
        # shellcheck disable=SC2086  # PILOTD_ARGS is a list of words
        pilotd_start "$WORK/pilotd.log" --backend cuda --socket "$SOCK" "${config[@]}" ${PILOTD_ARGS:-} ||
            { row "$mode" - "pilotd did not start"; continue; }
        ;;
    esac
    for n in $NS; do
        case $mode in
        threads) line=$(env CUDA_DEVICE_MAX_CONNECTIONS=32 "$BIN" "$n" "$SECS" 8 primary 2>&1 | tee -a "$OUT/one_context.log" | summed) ;;
        green) line=$(env CUDA_DEVICE_MAX_CONNECTIONS=32 "$BIN" "$n" "$SECS" 8 green 2>&1 | tee -a "$OUT/one_context.log" | summed) ;;
        ctxs) line=$(env CUDA_DEVICE_MAX_CONNECTIONS=32 "$BIN" "$n" "$SECS" 8 ctx 2>&1 | tee -a "$OUT/one_context.log" | summed) ;;
        mps1) line=$("$BIN" "$n" "$SECS" 2>&1 | tee -a "$OUT/one_context.log" | summed) ;;
        procs | mps) line=$(procs "$n" | tee -a "$OUT/one_context.log" | summed) ;;
        pilot) # shellcheck disable=SC2086  # CLIENT_ENV is a list of NAME=VALUE words
            line=$(procs "$n" PILOT_SOCKET="$SOCK" ${CLIENT_ENV:-} "$PYTHON" -m pilot.cli.pilot run -- |
                tee -a "$OUT/one_context.log" | summed) ;;
        confined)
            AS_USERS=1 PASS_SECS=1 procs "$n" PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- >/dev/null
            line=$(AS_USERS=1 procs "$n" PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- |
                tee -a "$OUT/one_context.log" | summed) ;;
        esac
        row "${LABEL:-$mode}" "$n" "$line"
    done
    case $mode in
    mps | mps1)
        echo quit | nvidia-cuda-mps-control
        sleep 1
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        ;;
    pilot | confined) pilotd_stop ;;
    esac
done
rm -rf "$WORK"
