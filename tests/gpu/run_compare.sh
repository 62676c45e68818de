#!/usr/bin/env bash
# Runs every CUDA test program natively and under pilot on a real GPU and compares their stdout
# byte for byte. Usage (from anywhere; the repository is this script's ../..):
#
#   tests/gpu/run_compare.sh                 install pilot, then compare
#   tests/gpu/run_compare.sh --install-only  only install pilot (run_all.sh's first stage)
#   tests/gpu/run_compare.sh --no-install    pilot is already installed in $PILOT_SITE
#
# Environment:
#   OUT            where results go (default /tmp/pilot-gpu-out): compare.md (the table),
#                  compare.log (every output in full, diffs), pilotd-compare.log (daemon's log)
#   PILOT_SITE     install target, put first on PYTHONPATH (default /tmp/site, where the wheels
#                  of .whl/ go too)
#   PYTHON         interpreter (default python3)
#   COMPARE_PREEMPT=1  (as root) pilotd runs with `[priority] preempt = true` and a high tenant
#                  (`nobody`) that launches a short kernel every 0.5 ms all along (started again
#                  after pilotd restarts for the `fault` program): every program runs gated, its
#                  kernels as preemptible variants (scheduling/preempt.py) that retreat at the
#                  high tenant's launches; the retreat words' raises of the last pilotd process
#                  are reported. device_printf differs there: with two sessions attached pilotd
#                  cannot tell whose printf output the driver printed, and drops it
#   COMPARE_CHAOS=DURATION  (e.g. 1ms) pilotd runs with `[priority] preempt_chaos = DURATION`:
#                  every program runs gated with its kernels as preemptible variants, and pilotd
#                  raises the retreat words at random moments (exponential gaps of that mean),
#                  so launches are cut at random points and resumed; COMPARE_REPEAT=N runs each
#                  program up to N times under pilot (each output compared; CHAOS_NEED=M stops
#                  once pilotd's log counts M preemptions for the program). The GPU's tallies,
#                  per program (pilotd's log at each session's end), go to compare-chaos.md
#   COMPARE_DUMP_AFTER=S  a pilot run still going after S seconds gets py-spy's dump of pilotd's
#                  threads in $OUT/hang-PROGRAM-N.txt (py-spy carried in .whl)
#   COMPARE_SM_SHARE  a compute share (percent) set for this user's tenant before the programs
#                  run, so that they all run in an SM partition (green context)
#   NVCC_ARCH      default sm_90
#   PILOT_BACKEND  daemon backend (default cuda). With sim, set PILOT_SIM_KERNELS to a
#                  space-separated list of emulation files; COMPARE_DRY_RUN=1 then also runs the
#                  "native" side under pilot (for machines without a GPU: checks this script)
#   NATIVE_RERUN   1 (default): run each program natively twice and check that its output is
#                  the same both times (a program whose output varies cannot be compared)
#
# Programs: tests/apps/*.cu and tests/gpu/{matmul_tiled,multistream}.cu, built with
# `nvcc -cudart shared -O2 -arch=$NVCC_ARCH`, and ptds.cu a second time with
# `-default-stream per-thread` (ptds_per_thread). errors.cu runs once per scenario below;
# copies.cu with no argument runs its full default size list; multidev.cu uses two GPUs when the
# machine has them (natively and under pilot alike), else checks one. No program's stdout may vary between runs:
# all of them print only exact results, error names and booleans (timings go to stderr), so any
# difference is a pilot bug. Some scenarios only make sense under pilot and are checked on their
# own: errors daemon_absent with a PILOT_SOCKET nobody listens on (a non-success error name and a
# clean, quick exit), errors killed_mid_copy and callbacks hang (SIGKILL once it prints `copying`
# or `hanging`, the latter while a host callback holds its stream; its session must be gone from
# `pilot sessions --json` within 1 s), and launch_ex unsupported (pilot refuses a launch
# attribute it does not carry, which CUDA itself supports).
#
# Exit status: 0 when every comparison and check passed, 1 otherwise, 2 when pilot could not be
# installed or the daemon not started.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" compare
PILOT_BACKEND=${PILOT_BACKEND:-cuda}
PILOT_SIM_KERNELS=${PILOT_SIM_KERNELS:-}
COMPARE_DRY_RUN=${COMPARE_DRY_RUN:-0}
NATIVE_RERUN=${NATIVE_RERUN:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
SOCK_DIR=/tmp/pilot-gpu
SOCK=$SOCK_DIR/pilot.sock
ERROR_SCENARIOS=(launch_config launch_bounds use_after_free copy_oob bad_free device_props)

export PYTHONUNBUFFERED=1

mode=compare
case "${1:-}" in
    --install-only) mode=install ;;
    --no-install) mode=noinstall ;;
    "") ;;
    *) echo "usage: $0 [--install-only|--no-install]" >&2; exit 2 ;;
esac

# ---- installing pilot ----

# pip --target from the source tree, without build isolation or an index (the GPU machine has
# no network): setuptools and wheel come from the interpreter, cffi and pycparser from the
# wheels in $PILOT_SITE. If that fails, `setup.py build` into a scratch dir and copy the package.
install_pilot() {
    local scratch
    say "installing pilot from $REPO into $PILOT_SITE"
    mkdir -p "$PILOT_SITE"
    if (cd "$REPO" && "$PYTHON" -m pip install -q --no-build-isolation --no-deps --no-index \
            --no-cache-dir --upgrade --target "$PILOT_SITE" .); then
        say "pip install --target worked"
    else
        say "pip install --target failed; falling back to setup.py build"
        scratch=$(mktemp -d /tmp/pilotbuild.XXXXXX)
        if ! (cd "$REPO" && "$PYTHON" setup.py -q build --build-base "$scratch/build" \
                --build-lib "$scratch/lib"); then
            say "setup.py build failed too"
            return 1
        fi
        rm -rf "$PILOT_SITE/pilot"
        cp -r "$scratch/lib/pilot" "$PILOT_SITE/" || return 1
        rm -rf "$scratch"
    fi
    check_install
}

check_install() {
    "$PYTHON" -c 'import zmq, cffi; import pilot.daemon.protocol, pilot.cli.client
from pilot.shim import shim_path; print("pilot", pilot.__file__, "shim", shim_path(), "zmq", zmq.__version__)' \
        || { say "pilot is not importable from PYTHONPATH=$PYTHONPATH"; return 1; }
}

if [ "$mode" != noinstall ]; then
    install_pilot || exit 2
    [ "$mode" = install ] && exit 0
else
    check_install || exit 2
fi

mkdir -p "$OUT"
LOG=$OUT/compare.log
MD=$OUT/compare.md
DAEMON_LOG=$OUT/pilotd-compare.log
: >"$LOG"
WORK=$(mktemp -d /tmp/pilot-compare.XXXXXX)
BIN=$WORK/bin
mkdir -p "$BIN"
log() { printf '%s\n' "$*" >>"$LOG"; }

stop_daemon() {
    [ -n "$DAEMON_PID" ] || return 0
    pilotd_stop
    say "pilotd exited with $DAEMON_STATUS; its log is $DAEMON_LOG"
}

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    stop_daemon
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

SHIM=$("$PYTHON" -m pilot.cli.pilot shim-path) || { say "pilot shim-path failed"; exit 2; }
say "shim: $SHIM"

# ---- building ----

SOURCES=()
for src in "$REPO"/tests/apps/*.cu "$REPO/tests/gpu/matmul_tiled.cu" "$REPO/tests/gpu/multistream.cu"; do
    # cuda12.cu is a CUDA 12 program: it builds against the 12.x runtime headers
    # (tests/apps/test_cuda12.py), not with this machine's nvcc 13.
    # driver_api.cu (with driver_kernels.cu, its module) links -lcuda and loads a cubin, and
    # linker.cu and driver_host.cu link -lcuda: tests/gpu/driver_compare.sh builds and compares them. cublas_*.cu link cuBLAS:
    # tests/gpu/cublas_compare.sh; cudnn_*.cu link cuDNN: tests/gpu/cudnn_compare.sh.
    case "$(basename "$src")" in
        cuda12.cu | driver_api.cu | driver_kernels.cu | linker.cu | driver_host.cu | cublas_*.cu | cudnn_*.cu) ;;
        *) SOURCES+=("$src") ;;
    esac
done
build_failed=0
say "building ${#SOURCES[@]} programs with $NVCC -arch=$NVCC_ARCH"
declare -A build_pid=()
for src in "${SOURCES[@]}"; do
    name=$(basename "$src" .cu)
    "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -o "$BIN/$name" "$src" >"$WORK/$name.build" 2>&1 &
    build_pid[$name]=$!
done
"$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -default-stream per-thread -o "$BIN/ptds_per_thread" \
    "$REPO/tests/apps/ptds.cu" >"$WORK/ptds_per_thread.build" 2>&1 &
build_pid[ptds_per_thread]=$!
for name in "${!build_pid[@]}"; do
    if ! wait "${build_pid[$name]}"; then
        say "nvcc failed for $name"
        build_failed=1
    fi
    if [ -s "$WORK/$name.build" ]; then
        log "### nvcc output for $name"
        cat "$WORK/$name.build" >>"$LOG"
    fi
done

# ---- the daemon ----

mkdir -p "$SOCK_DIR"
rm -f "$SOCK"
daemon_args=(--backend "$PILOT_BACKEND" --socket "$SOCK")
for f in $PILOT_SIM_KERNELS; do daemon_args+=(--sim-kernels "$f"); done
HIGH_PID=
COMPARE_CHAOS=${COMPARE_CHAOS:-}
COMPARE_REPEAT=${COMPARE_REPEAT:-1}
if [ "${COMPARE_PREEMPT:-0}" = 1 ] || [ -n "$COMPARE_CHAOS" ]; then
    {
        [ "${COMPARE_PREEMPT:-0}" = 1 ] && printf '[tenants.hp]\nusers = ["nobody"]\npriority = "high"\n'
        printf '[daemon]\nlog_level = "info"\n[priority]\npreempt = true\n'
        [ -n "$COMPARE_CHAOS" ] && printf 'preempt_chaos = "%s"\n' "$COMPARE_CHAOS"
    } >"$WORK/preempt.toml"
    daemon_args+=(--config "$WORK/preempt.toml")
fi
if [ "${COMPARE_PREEMPT:-0}" = 1 ]; then
    cat >"$WORK/high.cu" <<'CU'
#include <cuda_runtime.h>
#include <unistd.h>
__global__ void spin(long long cycles) {
    long long t = clock64();
    while (clock64() - t < cycles) {}
}
int main(void) {  /* a high tenant's short kernel every 0.5 ms, until killed */
    for (;;) {
        spin<<<132, 128>>>(100000);
        if (cudaDeviceSynchronize() != cudaSuccess) return 1;
        usleep(500);
    }
}
CU
    "$NVCC" -cudart shared -O2 "-arch=$NVCC_ARCH" -o "$BIN/high" "$WORK/high.cu" >>"$LOG" 2>&1 || exit 2
    chmod 755 "$WORK" "$BIN" "$BIN/high"
fi
say "starting pilotd ${daemon_args[*]}"
pilotd_start "$DAEMON_LOG" "${daemon_args[@]}" || exit 2
say "pilotd ready (pid $DAEMON_PID)"
if [ "${COMPARE_PREEMPT:-0}" = 1 ]; then
    # started again whenever it ends: the `fault` program's GPU fault restarts pilotd, and every
    # session of the old process with it
    (while :; do
        setpriv --reuid=65534 --regid=65534 --clear-groups env PILOT_SOCKET="$SOCK" \
            LD_PRELOAD="$SHIM" "$BIN/high" >>"$LOG" 2>&1
        sleep 0.5
    done) &
    HIGH_PID=$!
    sleep 1
    say "the high tenant runs (loop pid $HIGH_PID): the programs run gated, as preemptible variants"
fi
if [ -n "${COMPARE_SM_SHARE:-}" ]; then
    # every program under pilot runs in an SM partition of this user's tenant (compute shares)
    "$PYTHON" -m pilot.cli.pilotctl --control-socket "$(dirname "$SOCK")/control.sock" \
        share set "user:$(id -un)" "$COMPARE_SM_SHARE" || exit 2
fi

# ---- comparing ----

ROWS=()
bad=0

# run_prog OUTFILE ERRFILE under_pilot(0|1) EXE ARGS... ; prints the exit code
run_prog() {
    local out=$1 err=$2 pilot=$3
    shift 3
    if [ "$pilot" = 1 ] && [ -n "${COMPARE_DUMP_AFTER:-}" ]; then
        # a run still going after COMPARE_DUMP_AFTER s: py-spy's dump of pilotd's threads (native
        # frames too) into $OUT/hang-N.txt, once per run, to see what it waits for
        timeout -k 5 "$RUN_TIMEOUT" env LD_PRELOAD="$SHIM" PILOT_SOCKET="$SOCK" "$@" >"$out" 2>"$err" &
        local prog=$! waited=0
        while kill -0 "$prog" 2>/dev/null && [ "$waited" -lt "$COMPARE_DUMP_AFTER" ]; do
            sleep 1
            waited=$((waited + 1))
        done
        if kill -0 "$prog" 2>/dev/null && [ -n "${DAEMON_PID:-}" ]; then
            { echo "$* still running after $waited s"; py-spy dump --native --pid "$DAEMON_PID"; } \
                >"$OUT/hang-${1##*/}-$BASHPID.txt" 2>&1
        fi
        wait "$prog"
        echo $?
        return
    fi
    if [ "$pilot" = 1 ]; then
        timeout -k 5 "$RUN_TIMEOUT" env LD_PRELOAD="$SHIM" PILOT_SOCKET="$SOCK" "$@" >"$out" 2>"$err"
    else
        timeout -k 5 "$RUN_TIMEOUT" env -u LD_PRELOAD -u PILOT_SOCKET "$@" >"$out" 2>"$err"
    fi
    echo $?
}

dump() {  # dump TITLE FILE
    log "--- $1"
    cat "$2" >>"$LOG"
}

compare() {  # compare PROGRAM [ARGS...]
    local prog=$1
    shift
    local args="$*" exe=$BIN/$prog tag=$WORK/run
    local native_pilot=0 nrc prc rrc same verdict
    [ "$COMPARE_DRY_RUN" = 1 ] && native_pilot=1
    if [ ! -x "$exe" ]; then
        ROWS+=("| $prog | ${args:--} | - | - | **NO** (not built) |")
        bad=1
        return
    fi
    say "$prog${args:+ $args}"
    local t0=$SECONDS
    nrc=$(run_prog "$tag.n.out" "$tag.n.err" "$native_pilot" "$exe" "$@")
    local t1=$SECONDS
    prc=$(run_prog "$tag.p.out" "$tag.p.err" 1 "$exe" "$@")
    local repeat=1 again key="$prog${args:+ $args}" repeats=$COMPARE_REPEAT
    # the fault program's GPU fault once only: a second within the hour puts its tenant under
    # [isolation] fault_backoff, which refuses the programs after it for a while
    [ "$prog" = fault ] && repeats=1
    while [ "$repeat" -lt "$repeats" ] && [ "$prc" = 0 ] && cmp -s "$tag.n.out" "$tag.p.out" \
            && { [ -z "$COMPARE_CHAOS" ] || [ "$(chaos_preemptions "$key" "$DAEMON_LOG")" -lt "${CHAOS_NEED:-1000000000}" ]; }; do
        repeat=$((repeat + 1))  # again under pilot (COMPARE_REPEAT): the first difference stays
        again=$(run_prog "$tag.p.out" "$tag.p.err" 1 "$exe" "$@")
        [ "$again" = 0 ] || prc=$again
    done
    local t2=$SECONDS
    log ""
    log "======== $prog${args:+ $args} (native rc $nrc in $((t1 - t0)) s, pilot rc $prc in $((t2 - t1)) s)"
    dump "native stdout" "$tag.n.out"
    dump "native stderr" "$tag.n.err"
    dump "pilot stdout" "$tag.p.out"
    dump "pilot stderr" "$tag.p.err"
    if cmp -s "$tag.n.out" "$tag.p.out"; then
        same=yes
    else
        same="**NO**"
        log "--- diff native pilot"
        diff -u "$tag.n.out" "$tag.p.out" >>"$LOG"
    fi
    verdict=$same
    if [ "$NATIVE_RERUN" = 1 ]; then
        rrc=$(run_prog "$tag.r.out" "$tag.r.err" "$native_pilot" "$exe" "$@")
        if ! cmp -s "$tag.n.out" "$tag.r.out" || [ "$rrc" != "$nrc" ]; then
            verdict="$verdict; **native output varies between runs** (rc $nrc, then $rrc)"
            log "--- diff native native-again (rc $rrc)"
            diff -u "$tag.n.out" "$tag.r.out" >>"$LOG"
            bad=1
        fi
    fi
    [ "$same" = yes ] || bad=1
    if [ "$nrc" != 0 ] || [ "$prc" != 0 ]; then
        bad=1
        verdict="$verdict; **nonzero exit**"
    fi
    ROWS+=("| $prog | ${args:--} | $nrc | $prc | $verdict |")
}

# errors daemon_absent with a socket nobody listens on: a non-success error name, PASS, rc 0,
# within 10 s, and the shim saying why.
daemon_absent() {
    local tag=$WORK/absent rc first last verdict t0
    say "errors daemon_absent (bad PILOT_SOCKET)"
    t0=$(date +%s.%N)
    timeout -k 5 30 env LD_PRELOAD="$SHIM" PILOT_SOCKET="$SOCK_DIR/nobody-listens.sock" \
        "$BIN/errors" daemon_absent >"$tag.out" 2>"$tag.err"
    rc=$?
    local took
    took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    first=$(head -n 1 "$tag.out")
    last=$(tail -n 1 "$tag.out")
    log ""
    log "======== errors daemon_absent, PILOT_SOCKET=$SOCK_DIR/nobody-listens.sock (rc $rc in $took s)"
    dump "stdout" "$tag.out"
    dump "stderr" "$tag.err"
    verdict="n/a: \`$first\` in $took s"
    if [ "$rc" != 0 ] || [ "$last" != PASS ] || [[ "$first" != "cudaMalloc: cudaError"* ]] \
            || [ "$first" = "cudaMalloc: cudaSuccess" ]; then
        verdict="$verdict; **FAILED** (want a non-success error name, PASS, rc 0)"
        bad=1
    elif ! grep -q "cannot reach pilotd" "$tag.err"; then
        verdict="$verdict; (no 'cannot reach pilotd' message on stderr)"
    fi
    if awk -v t="$took" 'BEGIN { exit !(t > 10) }'; then
        verdict="$verdict; **too slow**"
        bad=1
    fi
    ROWS+=("| errors | daemon_absent (bad PILOT_SOCKET) | - | $rc | $verdict |")
}

# pid_listed PID: is a session of PID in `pilot sessions --json`? (exit 2: query failed)
pid_listed() {
    local json
    json=$(PILOT_SOCKET=$SOCK "$PYTHON" -m pilot.cli.pilot sessions --json 2>>"$LOG") || return 2
    grep -Eq "\"pid\": $1[,}]" <<<"$json"
}

# killed PROG ARG MARKER: run PROG ARG under pilot, SIGKILL it once it prints MARKER; its
# session must be gone from `pilot sessions --json` within 1 s (a query started within 1 s of the
# kill shows it gone).
killed() {
    local prog=$1 arg=$2 marker=$3
    local tag=$WORK/killed pid verdict listed=no t_kill t_ask gone_after='' ans rc
    say "$prog $arg"
    LD_PRELOAD=$SHIM PILOT_SOCKET=$SOCK "$BIN/$prog" "$arg" >"$tag.out" 2>"$tag.err" &
    pid=$!
    for _ in $(seq 600); do  # 60 s
        grep -q "$marker" "$tag.out" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q "$marker" "$tag.out"; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        log ""
        log "======== $prog $arg: never printed '$marker'"
        dump "stdout" "$tag.out"
        dump "stderr" "$tag.err"
        ROWS+=("| $prog | $arg (SIGKILL) | - | - | **FAILED**: never printed \`$marker\` |")
        bad=1
        return
    fi
    pid_listed "$pid" && listed=yes
    t_kill=$(date +%s.%N)
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null
    rc=$?
    while :; do
        t_ask=$(date +%s.%N)
        if awk -v a="$t_kill" -v b="$t_ask" 'BEGIN { exit !(b - a > 1.0) }'; then
            break  # the deadline passed before this query would start
        fi
        pid_listed "$pid"
        ans=$?
        if [ "$ans" = 1 ]; then
            gone_after=$(awk -v a="$t_kill" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
            break
        fi
        sleep 0.02
    done
    log ""
    log "======== $prog $arg (rc $rc after SIGKILL; listed before the kill: $listed)"
    dump "stdout" "$tag.out"
    dump "stderr" "$tag.err"
    if [ -n "$gone_after" ] && [ "$listed" = yes ]; then
        verdict="n/a: session gone, answer $gone_after s after SIGKILL"
    elif [ -n "$gone_after" ]; then
        verdict="**FAILED**: its session was never listed (gone after $gone_after s)"
        bad=1
    else
        verdict="**FAILED**: session still listed 1 s after SIGKILL"
        bad=1
    fi
    log "$prog $arg: $verdict"
    ROWS+=("| $prog | $arg (SIGKILL) | - | $rc | $verdict |")
}

# pilot_only PROG ARG EXPECTED: under pilot only, stdout must be EXPECTED exactly.
pilot_only() {
    local prog=$1 arg=$2 expected=$3 tag=$WORK/only rc verdict
    say "$prog $arg (pilot only)"
    rc=$(run_prog "$tag.out" "$tag.err" 1 "$BIN/$prog" "$arg")
    log ""
    log "======== $prog $arg under pilot only (rc $rc)"
    dump "stdout" "$tag.out"
    dump "stderr" "$tag.err"
    if [ "$rc" = 0 ] && [ "$(cat "$tag.out")" = "$expected" ]; then
        verdict="n/a: as expected"
    else
        verdict="**FAILED** (want rc 0 and: $(tr '\n' ';' <<<"$expected"))"
        bad=1
    fi
    ROWS+=("| $prog | $arg (pilot only) | - | $rc | $verdict |")
}

for src in "${SOURCES[@]}"; do
    name=$(basename "$src" .cu)
    if [ "$name" = alloc ]; then
        # alloc.cu prints cudaMemGetInfo, machine state that differs by design (a native process
        # holds its own CUDA context; pilot reports capacity and quotas): tests/gpu/ops_check.py
        # checks it against the values pilot must report instead.
        continue
    elif [ "$name" = errors ]; then
        for scenario in "${ERROR_SCENARIOS[@]}"; do compare errors "$scenario"; done
    elif [ "$name" = fault ]; then
        # a kernel fault: under pilot it restarts pilotd (router/recovery.py), so the programs
        # compared after it also check that the restarted pilotd serves correctly
        compare fault work
        compare fault fault
        compare fault work
        # the fault isolated this user's tenant ([isolation] after_fault; the last run went to
        # its own pilotd): back to the shared pilotd for the programs after it
        "$PYTHON" -m pilot.cli.pilotctl --control-socket "$(dirname "$SOCK")/control.sock" \
            isolate clear "user:$(id -un)" >/dev/null || bad=1
    elif [ "$name" = scrub ]; then
        compare scrub fill # natively, then under pilot: the pilot read below follows a pilot fill
        compare scrub read
    elif [ "$name" = free_async ]; then
        compare free_async
        compare free_async fill # as scrub: cudaFreeAsync's block, zeroed behind the kernel
        compare free_async read
        pilot_only free_async refused "$(printf '%s\n' 'alloc: cudaSuccess' 'free: cudaSuccess' \
            'free again: cudaErrorInvalidValue' 'copy from it: cudaErrorInvalidValue' \
            'memset it: cudaErrorInvalidValue' 'free a host address: cudaErrorInvalidValue' \
            'alloc another: cudaSuccess' 'free inside it: cudaErrorInvalidValue' \
            'free it on a stream that does not exist: cudaErrorInvalidResourceHandle' \
            'still usable: cudaSuccess' 'free it: cudaSuccess' 'synchronize: cudaSuccess')"
    else
        compare "$name"
    fi
done
compare ptds_per_thread
[ -x "$BIN/errors" ] && daemon_absent
[ -x "$BIN/errors" ] && killed errors killed_mid_copy copying
[ -x "$BIN/callbacks" ] && killed callbacks hang hanging
# killed while its synchronization's completion word is still to be written (behind a 1.5 s host
# function): pilotd keeps the page registered until the GPU has written it (a write to memory no
# longer registered would fault every tenant's context); the programs after it show it did not
[ -x "$BIN/words" ] && killed words orphan waiting
[ -x "$BIN/launch_ex" ] && pilot_only launch_ex unsupported "launch completion event: cudaErrorNotSupported (last cudaErrorNotSupported)
hit ratio 2: cudaErrorInvalidValue (last cudaErrorInvalidValue)
next launch: yes
PASS"

if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    say "pilotd died during the comparison"
    bad=1
fi
if [ -n "$HIGH_PID" ]; then
    "$PYTHON" -m pilot.cli.pilotctl --control-socket "$(dirname "$SOCK")/control.sock" priority list \
        --json >"$OUT/compare-preemption.json" 2>>"$LOG" || true
    kill "$HIGH_PID" 2>/dev/null
    pkill -u 65534 -f "$BIN/high" 2>/dev/null
    wait "$HIGH_PID" 2>/dev/null
    "$PYTHON" - "$OUT/compare-preemption.json" <<'PY' | tee -a "$LOG"
import json, sys
pre = (json.load(open(sys.argv[1])).get("preemption") or {}) if open(sys.argv[1]).read(1) else {}
w = (pre.get("gpus") or {}).get("0", {})
print(f"preemption: {pre.get('preemptible_kernels')} kernels preemptible, "
      f"{len(pre.get('kernels_not_preemptible') or {})} refused; retreat words raised "
      f"{w.get('raises')} times, lowered {w.get('clears')} ({w.get('forced_clears')} forced)")
PY
fi
stop_daemon
[ "$build_failed" = 1 ] && bad=1
if [ -n "$COMPARE_CHAOS" ]; then
    # the GPU's tallies per program: pilotd logs each session's command line when it starts and
    # its preemptible launches, preemptions and deferred blocks when it ends
    "$PYTHON" "$REPO/tests/gpu/chaos_tallies.py" --chaos "$COMPARE_CHAOS" --runs "up to $COMPARE_REPEAT" \
        --need "${CHAOS_NEED:-100}" "$DAEMON_LOG" >"$OUT/compare-chaos.md"
    cat "$OUT/compare-chaos.md" | tee -a "$LOG"
fi

{
    printf 'pilot vs native on %s (%s backend%s): stdout compared byte for byte\n\n' \
        "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo '?')" \
        "$PILOT_BACKEND" "$([ "$COMPARE_DRY_RUN" = 1 ] && echo ', DRY RUN: native side under pilot too')"
    echo "| program | args | native rc | pilot rc | output identical |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
    echo
    if [ "$bad" = 0 ]; then echo "result: all identical, all checks passed"; else echo "result: **MISMATCH OR FAILURE** (details in compare.log)"; fi
} >"$MD"
cat "$MD"
exit "$bad"
