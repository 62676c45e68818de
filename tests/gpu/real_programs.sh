#!/usr/bin/env bash
# Runs real public CUDA programs (NVIDIA cuda-samples, Rodinia) natively and under pilot on a GPU
# machine and compares what they print. From the repository root, with .realprogs carried (built
# by hack/fetch_real_programs.sh + hack/build_real_programs.sh, which also document the manifest):
#
#   bash tests/gpu/real_programs.sh                 install pilot into $PILOT_SITE, then run all
#   bash tests/gpu/real_programs.sh --no-install    pilot is already importable from $PILOT_SITE
#   bash tests/gpu/real_programs.sh --only a,b      only these programs
#   bash tests/gpu/real_programs.sh --part 1/2      every 2nd program starting with the 1st
#                                                   (to split the run over two commands)
#   bash tests/gpu/real_programs.sh --list          print the manifest and exit
#
# For each program of .realprogs/manifest.tsv: run it natively (real libcudart, as the other GPU
# scripts do: no LD_PRELOAD), then under pilot (`pilot run --`, which preloads libpilot.so and the
# stand-ins the program needs, against a pilotd --backend cuda this script starts, as
# tests/gpu/run_compare.sh does), each in a fresh working directory
# holding a copy of its data files, stdin from /dev/null, with a per-program timeout (a timed-out
# program is killed with its whole process group). Then compare, after the manifest's filter,
# stdout, the exit status, and the files the program wrote into its working directory. When they
# differ, the program is run natively once more to tell pilot bugs from programs whose filtered
# output varies by itself. After a pilot run that may have broken the daemon's shared CUDA context
# (a device assert or a fault leaves it unusable for every tenant), pilotd is restarted so the
# next program does not pay for it (see RESTART_AFTER_FAILURE); a daemon that died is restarted
# too, and the row says so.
#
# Results, in $OUT (default /tmp/pilot-gpu-out), two files:
#   real_programs.md   the table: program, native result, pilot result, match?, note; then the
#                      programs not run and why; a summary line
#   real_programs.log  one section per program that did not match (or every program with
#                      REAL_LOG_ALL=1): commands, exit codes, times, the diff of filtered stdout,
#                      both stdouts/stderrs (capped), pilotd's log lines from that run; then the
#                      tail of every pilotd log
# The table is also printed on stdout. Exit status: 0 when every program expected to match
# (expect=ok) did, 1 otherwise, 2 when pilot could not be installed or pilotd not started.
#
# Environment:
#   OUT, PILOT_SITE (default /tmp/site), PYTHON (default python3): as in run_all.sh
#   REALPROGS       the built programs (default $REPO/.realprogs); REAL_MANIFEST overrides the
#                   manifest (exe paths are relative to REALPROGS unless absolute)
#   PROG_TIMEOUT    seconds per run (default 60)
#   DEADLINE        seconds after the script's start (installation included) by which every run
#                   must be over (default 540, for the device's 10-minute command limit): each
#                   side of a program gets PROG_TIMEOUT or half of the time left, whichever is
#                   less; a program is started only if that is at least 10 s (the rest are listed
#                   as not run); the native re-run is skipped when time is short
#   REAL_MODE       real (default); dry: the "native" side also runs under pilot, against
#                   PILOT_BACKEND (default sim in dry mode; PILOT_SIM_KERNELS as in
#                   run_compare.sh): checks this script without a GPU; fake: both sides run
#                   natively and no daemon is started (checks filters, timeouts, the table)
#   RESTART_AFTER_FAILURE  when to restart pilotd after a program: auto (default: after a pilot
#                   run that timed out or died of a signal, or during which pilotd logged an error,
#                   an exception or a context-fatal error), always (after any pilot run that failed
#                   or differed), never
#   REAL_LOG_ALL    1: log every program, not only the ones that did not match
#   PILOT_LOG       the shim's log level for the pilot runs (default warn: unsupported calls
#                   are named on stderr, which the note column reports)
#   REAL_CHAOS      a duration (e.g. 1ms): pilotd runs with `[priority] preempt_chaos` set to it
#                   (every program gated, its kernels preemptible and preempted at random); the
#                   GPU's tallies per program go to $OUT/real_chaos.md (tests/gpu/chaos_tallies.py)
#   REAL_REPEAT     with REAL_CHAOS: run a program that matched under pilot again, up to this many
#                   runs in all (default 1), each compared; CHAOS_NEED=N stops once pilotd's logs
#                   count N preemptions for it (issue 29 asks for 100 per program across runs)
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" real
REALPROGS=${REALPROGS:-$REPO/.realprogs}
MANIFEST=${REAL_MANIFEST:-$REALPROGS/manifest.tsv}
PROG_TIMEOUT=${PROG_TIMEOUT:-60}
DEADLINE=${DEADLINE:-540}
REAL_MODE=${REAL_MODE:-real}
if [ "$REAL_MODE" = dry ]; then PILOT_BACKEND=${PILOT_BACKEND:-sim}; else PILOT_BACKEND=${PILOT_BACKEND:-cuda}; fi
PILOT_SIM_KERNELS=${PILOT_SIM_KERNELS:-}
RESTART_AFTER_FAILURE=${RESTART_AFTER_FAILURE:-auto}
REAL_LOG_ALL=${REAL_LOG_ALL:-0}
export PILOT_LOG=${PILOT_LOG:-warn}
SOCK_DIR=/tmp/pilot-real
SOCK=$SOCK_DIR/pilot.sock
export PYTHONUNBUFFERED=1

install=1
only=
part=
list=0
while [ $# -gt 0 ]; do
    case $1 in
        --no-install) install=0; shift ;;
        --only) only=,$2,; shift 2 ;;
        --part) part=$2; shift 2 ;;
        --list) list=1; shift ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
case $REAL_MODE in real|dry|fake) ;; *) echo "REAL_MODE must be real, dry or fake" >&2; exit 2 ;; esac
part_k=1 part_n=1
if [ -n "$part" ]; then
    part_k=${part%/*} part_n=${part#*/}
    if ! [[ $part_k =~ ^[0-9]+$ && $part_n =~ ^[0-9]+$ ]] || [ "$part_k" -lt 1 ] || [ "$part_k" -gt "$part_n" ]; then
        echo "--part wants K/N with 1 <= K <= N" >&2
        exit 2
    fi
fi

[ -f "$MANIFEST" ] || { say "no manifest at $MANIFEST: build with hack/build_real_programs.sh and carry .realprogs"; exit 2; }
if [ "$list" = 1 ]; then
    column -t -s $'\t' "$MANIFEST" 2>/dev/null || cat "$MANIFEST"
    exit 0
fi

mkdir -p "$OUT"
MD=$OUT/real_programs.md
LOG=$OUT/real_programs.log
: >"$LOG"
WORK=$(mktemp -d /tmp/pilot-real.XXXXXX)
DAEMON_LOG=
DAEMON_N=0
SHIM=

log() { printf '%s\n' "$*" >>"$LOG"; }

# ---- pilot: install, shim, daemon ----

install_pilot() {
    install_site_wheels || return 1
    install_site_pilot
}

stop_daemon() { pilotd_stop; }

start_daemon() {
    local args=(--backend "$PILOT_BACKEND" --socket "$SOCK") f
    stop_daemon
    DAEMON_N=$((DAEMON_N + 1))
    DAEMON_LOG=$WORK/pilotd.$DAEMON_N.log
    for f in $PILOT_SIM_KERNELS; do args+=(--sim-kernels "$f"); done
    if [ -n "${REAL_CHAOS:-}" ]; then
        printf '[daemon]\nlog_level = "info"\n[priority]\npreempt_chaos = "%s"\n' "$REAL_CHAOS" \
            >"$WORK/chaos.toml"
        args+=(--config "$WORK/chaos.toml")
    fi
    mkdir -p "$SOCK_DIR"
    rm -f "$SOCK"
    pilotd_start "$DAEMON_LOG" "${args[@]}"
}

# needs_restart PILOT_RC NDIFFS: restart pilotd before the next program? (see RESTART_AFTER_FAILURE)
needs_restart() {
    case $RESTART_AFTER_FAILURE in
        never) return 1 ;;
        always) [ "$1" != 0 ] || [ "$2" != 0 ] ;;
        *) [ "$1" = 124 ] || [ "$1" -gt 128 ] \
               || grep -Eqi 'level=(error|critical)|context-fatal|traceback' "$WORK/p.dlog" ;;
    esac
}

daemon_alive() { [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; }

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    stop_daemon
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need_daemon=1
[ "$REAL_MODE" = fake ] && need_daemon=0
if [ "$need_daemon" = 1 ]; then
    if [ "$install" = 1 ]; then
        install_pilot || { say "installing pilot failed"; exit 2; }
    fi
    SHIM=$("$PYTHON" -m pilot.cli.pilot shim-path) || { say "pilot is not importable (PYTHONPATH=$PYTHONPATH)"; exit 2; }
    say "shim $SHIM"
    start_daemon || exit 2
    say "pilotd ready (pid $DAEMON_PID, $PILOT_BACKEND backend)"
fi

# Native runs need the real libcudart.so.13: normally found through ld.so.conf; otherwise look in
# the usual toolkit directories.
NATIVE_LDPATH=
first_exe=$(awk -F'\t' 'NR > 1 && $2 != "-" { print $2; exit }' "$MANIFEST")
if [ -n "$first_exe" ]; then
    [[ $first_exe == /* ]] || first_exe=$REALPROGS/$first_exe
    if ldd "$first_exe" 2>/dev/null | grep -q 'libcudart.so.13 => not found'; then
        for d in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
            if [ -e "$d/libcudart.so.13" ]; then NATIVE_LDPATH=$d; break; fi
        done
        say "libcudart.so.13 not found by the loader; native runs use LD_LIBRARY_PATH=${NATIVE_LDPATH:-(none found)}"
    fi
fi

# Functions libpilot.so does not implement yet (they log their name and return
# cudaErrorNotSupported): for the note column, which a binary imports.
STUBS=$WORK/stubs.txt
awk -F'\t' 'NR > 1 && $4 == "stub" { print $1 }' "$REPO/shim/tables/cudart_exports.tsv" 2>/dev/null | sort -u >"$STUBS"

# ---- filters ----

# Lines reporting times, rates and throughputs (case-insensitive); see build_real_programs.sh.
GENERIC_DROP='\b(time|timing|elapsed|throughput|bandwidth|gflops|tflops|flops|tops)\b|[0-9][[:space:]]*(ms|msec|msecs|millisec|milliseconds|s|sec|secs|seconds|us|usec|usecs|ns)\b|[0-9][[:space:]]*\((ms|msec|s|sec|us|usec|ns)\)|/sec\b|per second|[a-z]/s\b|^exec:'

# apply_filter SPEC IN OUT
apply_filter() {
    local spec=$1 in=$2 out=$3 base mod
    base=${spec%%;*}
    sed -e 's/\r$//' -e 's/[[:space:]]*$//' "$in" >"$out.tmp"
    case $base in
        verbatim) ;;
        generic) grep -Eiv -- "$GENERIC_DROP" "$out.tmp" >"$out.tmp2"; mv "$out.tmp2" "$out.tmp" ;;
        rc) : >"$out.tmp" ;;
        *) say "unknown filter $base"; ;;
    esac
    if [[ $spec == *";"* ]]; then
        local IFS=';'
        for mod in ${spec#*;}; do
            case $mod in
                drop=*) grep -Ev -- "${mod#drop=}" "$out.tmp" >"$out.tmp2"; mv "$out.tmp2" "$out.tmp" ;;
                keep=*) grep -E -- "${mod#keep=}" "$out.tmp" >"$out.tmp2"; mv "$out.tmp2" "$out.tmp" ;;
                sort) LC_ALL=C sort "$out.tmp" >"$out.tmp2"; mv "$out.tmp2" "$out.tmp" ;;
                "") ;;
                *) say "unknown filter modifier $mod" ;;
            esac
        done
    fi
    mv "$out.tmp" "$out"
}

# ---- running one side ----

# program_preemptions KEY: chaos_preemptions (env.sh) over every pilotd log of this run
program_preemptions() {
    local logs=()
    for f in "$WORK"/pilotd.*.log; do [ -f "$f" ] && logs+=("$f"); done
    chaos_preemptions "$1" "${logs[@]}"
}

# run_side TAG MODE(native|pilot) EXE DATA ARGS...: runs in $WORK/TAG.cwd for at most $RUN_T
# seconds; leaves TAG.out,
# TAG.err, TAG.rc, TAG.secs, TAG.files (files written: "sha256  path"), TAG.dlog (pilotd lines).
run_side() {
    local tag=$WORK/$1 mode=$2 exe=$3 data=$4
    shift 4
    local cwd=$tag.cwd t0 t1 rc off=0
    rm -rf "$cwd"
    mkdir -p "$cwd"
    if [ "$data" != - ] && [ -d "$REALPROGS/$data" ]; then
        cp -r "$REALPROGS/$data/." "$cwd/"
        find "$cwd" -type f -name '*.gz' -exec gunzip -f {} +  # large inputs are stored gzipped
    fi
    (cd "$cwd" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum) >"$tag.before"
    [ -n "$DAEMON_LOG" ] && [ -f "$DAEMON_LOG" ] && off=$(stat -c %s "$DAEMON_LOG")
    t0=$(date +%s.%N)
    if [ "$mode" = pilot ]; then
        # as a user runs it: `pilot run` preloads the shim and the stand-ins the program needs
        # (libpilot-cuda.so for the driver API samples)
        (cd "$cwd" && timeout -k 5 "$RUN_T" env -u LD_PRELOAD PILOT_SOCKET="$SOCK" \
            "$PYTHON" -m pilot.cli.pilot run -- "$exe" "$@" </dev/null >"$tag.out" 2>"$tag.err") \
            2>/dev/null
    elif [ -n "$NATIVE_LDPATH" ]; then
        (cd "$cwd" && timeout -k 5 "$RUN_T" env -u LD_PRELOAD -u PILOT_SOCKET \
            LD_LIBRARY_PATH="$NATIVE_LDPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            "$exe" "$@" </dev/null >"$tag.out" 2>"$tag.err") 2>/dev/null
    else
        (cd "$cwd" && timeout -k 5 "$RUN_T" env -u LD_PRELOAD -u PILOT_SOCKET \
            "$exe" "$@" </dev/null >"$tag.out" 2>"$tag.err") 2>/dev/null
    fi
    rc=$?
    t1=$(date +%s.%N)
    echo "$rc" >"$tag.rc"
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }' >"$tag.secs"
    # files the program wrote (new ones, or input files it changed)
    (cd "$cwd" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum) | grep -vxF -f "$tag.before" >"$tag.files"
    if [ -n "$DAEMON_LOG" ] && [ -f "$DAEMON_LOG" ]; then
        tail -c +"$((off + 1))" "$DAEMON_LOG" >"$tag.dlog"
    else
        : >"$tag.dlog"
    fi
}

# describe RC SECS -> "ok", "waived", "rc N", "TIMEOUT", "signal N", with the time
describe() {
    local rc=$1 secs=$2 what
    case $rc in
        0) what=ok ;;
        2) what="waived (rc 2)" ;;
        124|137) what="**TIMEOUT**" ;;
        *) if [ "$rc" -gt 128 ]; then what="**signal $((rc - 128))**"; else what="rc $rc"; fi ;;
    esac
    printf '%s, %s s' "$what" "$secs"
}

md_escape() {  # one table cell: no pipes, no newlines, no backticks, capped
    local s=${1//|/\\|}
    s=${s//$'\n'/ }
    s=${s//\`/\'}
    [ ${#s} -gt "${2:-100}" ] && s="${s:0:${2:-100}}..."
    printf '%s' "$s"
}

expect_text() {
    case $1 in
        printf) echo "device printf/assert output is printed in pilotd's process" ;;
        um) echo "managed / pageable memory from the GPU" ;;
        texture) echo "textures/surfaces/CUDA arrays not supported" ;;
        coop) echo "cooperative launch not supported" ;;
        graph) echo "CUDA graphs not supported" ;;
        callback) echo "host callbacks not supported" ;;
        mempool) echo "stream-ordered allocator not supported" ;;
        launchex) echo "cudaLaunchKernelExC not supported" ;;
        ipc) echo "CUDA IPC not supported" ;;
        *) echo "$1" ;;
    esac
}

dump_file() {  # dump_file TITLE FILE [MAXLINES]
    local n=${3:-80} total
    total=$(wc -l <"$2")
    log "--- $1 ($total lines$([ "$total" -gt "$n" ] && echo ", first $((n / 2)) and last $((n / 2))"))"
    if [ "$total" -gt "$n" ]; then
        head -n $((n / 2)) "$2" >>"$LOG"
        log "[...]"
        tail -n $((n / 2)) "$2" >>"$LOG"
    else
        cat "$2" >>"$LOG"
    fi
}

# ---- the programs ----

ROWS=()
SKIPPED=()
n_match=0 n_expected=0 n_unexpected=0 n_native_bad=0 n_notrun=0 n_surprise=0
bad=0
start=$SECONDS
idx=0
[ "$PROG_TIMEOUT" -ge 1 ] 2>/dev/null || { say "PROG_TIMEOUT must be a positive integer"; exit 2; }

while IFS=$'\t' read -r -u 3 name exe args data filter expect suite note; do
    [ "$name" = name ] && continue
    [ -n "$name" ] || continue
    if [ "$exe" = - ]; then
        [ -z "$only" ] && [ "$part_n" = 1 ] && SKIPPED+=("| $(md_escape "$name" 400) | $suite | $expect | $(md_escape "$note" 300) |")
        continue
    fi
    if [ -n "$only" ] && [[ $only != *",$name,"* ]]; then continue; fi
    idx=$((idx + 1))
    if [ "$part_n" != 1 ] && [ $(((idx - 1) % part_n + 1)) != "$part_k" ]; then continue; fi
    [ "$args" = - ] && args=
    [ "$note" = - ] && note=
    label="$name${args:+ \`$args\`}"
    [[ $exe == /* ]] || exe=$REALPROGS/$exe
    # each side gets PROG_TIMEOUT, or half of what is left before the deadline
    RUN_T=$(((DEADLINE - SECONDS - 10) / 2))
    [ "$RUN_T" -gt "$PROG_TIMEOUT" ] && RUN_T=$PROG_TIMEOUT
    if [ "$RUN_T" -lt 10 ] && [ "$RUN_T" -lt "$PROG_TIMEOUT" ]; then
        ROWS+=("| $label | - | - | not run | out of time (DEADLINE $DEADLINE s) |")
        n_notrun=$((n_notrun + 1))
        [ "$expect" = ok ] && bad=1
        continue
    fi
    if [ ! -x "$exe" ]; then
        ROWS+=("| $label | - | - | not run | **binary missing**: $exe |")
        n_notrun=$((n_notrun + 1))
        [ "$expect" = ok ] && bad=1
        continue
    fi
    say "$name $args"
    native_mode=native
    [ "$REAL_MODE" = dry ] && native_mode=pilot
    pilot_mode=pilot
    [ "$REAL_MODE" = fake ] && pilot_mode=native
    restarted=
    if [ "$need_daemon" = 1 ] && ! daemon_alive; then
        start_daemon && restarted="pilotd was down before this run (restarted)"
    fi
    # shellcheck disable=SC2086  # args is a list of words
    run_side n "$native_mode" "$exe" "$data" $args
    # shellcheck disable=SC2086
    run_side p "$pilot_mode" "$exe" "$data" $args
    nrc=$(cat "$WORK/n.rc") prc=$(cat "$WORK/p.rc")
    apply_filter "$filter" "$WORK/n.out" "$WORK/n.f"
    apply_filter "$filter" "$WORK/p.out" "$WORK/p.f"
    diffs=()
    cmp -s "$WORK/n.f" "$WORK/p.f" || diffs+=(stdout)
    [ "$nrc" = "$prc" ] || diffs+=("exit status")
    if [ "${filter%%;*}" != rc ] && ! cmp -s "$WORK/n.files" "$WORK/p.files"; then diffs+=("output files"); fi
    notes=()
    died=
    if [ "$need_daemon" = 1 ] && ! daemon_alive; then died=1; notes+=("**pilotd died during this run**"); fi
    [ -n "$restarted" ] && notes+=("$restarted")
    varies=
    if [ ${#diffs[@]} -gt 0 ] && [ "$nrc" != 124 ] && [ "$nrc" != 137 ] \
            && [ $((DEADLINE - SECONDS - 10)) -gt "$RUN_T" ]; then
        # shellcheck disable=SC2086
        run_side r "$native_mode" "$exe" "$data" $args
        apply_filter "$filter" "$WORK/r.out" "$WORK/r.f"
        if ! cmp -s "$WORK/n.f" "$WORK/r.f" || [ "$(cat "$WORK/r.rc")" != "$nrc" ] \
                || { [ "${filter%%;*}" != rc ] && ! cmp -s "$WORK/n.files" "$WORK/r.files"; }; then
            varies=1
            notes+=("native output varies between runs (rc $nrc then $(cat "$WORK/r.rc")): filter too weak")
        fi
    fi
    runs=1
    if [ -n "${REAL_CHAOS:-}" ] && [ ${#diffs[@]} = 0 ] && [ "$need_daemon" = 1 ]; then
        key="$(basename "$exe")${args:+ $args}"
        while [ "$runs" -lt "${REAL_REPEAT:-1}" ] && [ $((DEADLINE - SECONDS - 10)) -gt "$RUN_T" ] \
                && [ "$(program_preemptions "$key")" -lt "${CHAOS_NEED:-1000000000}" ]; do
            runs=$((runs + 1))  # again under pilot: every run compared, the first difference stays
            # shellcheck disable=SC2086
            run_side p "$pilot_mode" "$exe" "$data" $args
            prc=$(cat "$WORK/p.rc")
            apply_filter "$filter" "$WORK/p.out" "$WORK/p.f"
            cmp -s "$WORK/n.f" "$WORK/p.f" || diffs+=(stdout)
            [ "$nrc" = "$prc" ] || diffs+=("exit status")
            if [ "${filter%%;*}" != rc ] && ! cmp -s "$WORK/n.files" "$WORK/p.files"; then diffs+=("output files"); fi
            if [ ${#diffs[@]} -gt 0 ]; then notes+=("pilot run $runs differed"); break; fi
        done
        [ "$runs" -gt 1 ] && notes+=("$runs runs under pilot, $(program_preemptions "$key") preemptions")
    fi
    unsupported=$(grep -ho '[A-Za-z_0-9]* is not supported by pilot yet' "$WORK/p.err" 2>/dev/null \
        | awk '{ print $1 }' | sort -u | paste -sd, - | sed 's/,/, /g')
    [ -n "$unsupported" ] && notes+=("unsupported calls: $unsupported")
    if [ ${#diffs[@]} = 0 ]; then
        match=yes
        if [ "$nrc" != 0 ] && [ "$nrc" != 2 ]; then
            match="yes (both failed)"
            notes+=("native run failed (rc $nrc): not a pilot result")
            n_native_bad=$((n_native_bad + 1))
            [ "$expect" = ok ] && bad=1
        else
            n_match=$((n_match + 1))
            if [ "$expect" != ok ]; then
                notes+=("matched although expected to differ ($expect): $(expect_text "$expect")")
                n_surprise=$((n_surprise + 1))
            fi
        fi
    else
        difftext=$(printf '%s, ' "${diffs[@]}")
        difftext=${difftext%, }
        if [ "$nrc" != 0 ] && [ "$nrc" != 2 ]; then
            match="no ($difftext)"
            notes+=("native run failed (rc $nrc): not a pilot result")
            n_native_bad=$((n_native_bad + 1))
            [ "$expect" = ok ] && bad=1
        elif [ -n "$varies" ]; then
            match="no ($difftext)"
            n_native_bad=$((n_native_bad + 1))
            [ "$expect" = ok ] && bad=1
        elif [ "$expect" = ok ]; then
            match="**NO** ($difftext)"
            notes+=("**unexpected**")
            n_unexpected=$((n_unexpected + 1))
            bad=1
        else
            match="no ($difftext)"
            notes+=("expected: $(expect_text "$expect")")
            n_expected=$((n_expected + 1))
        fi
        if [ -z "$unsupported" ] && [ -s "$STUBS" ]; then
            imported=$(nm -D --undefined-only "$exe" 2>/dev/null | awk '{ print $NF }' | sed 's/@.*//' \
                | sort -u | comm -12 - "$STUBS" | paste -sd, - | sed 's/,/, /g')
            [ -n "$imported" ] && notes+=("imports unimplemented: $(md_escape "$imported" 120)")
        fi
        if [[ " ${diffs[*]} " == *" stdout "* ]]; then
            first=$(diff "$WORK/n.f" "$WORK/p.f" | grep -m1 '^[<>]')
            [ -n "$first" ] && notes+=("first difference: \`$(md_escape "$first" 90)\`")
        fi
        if [[ " ${diffs[*]} " == *" output files "* ]]; then
            fdiff=$(diff <(awk '{ print $2 }' "$WORK/n.files") <(awk '{ print $2 }' "$WORK/p.files") | grep '^[<>]' | head -n 3 | paste -sd' ' -)
            [ -z "$fdiff" ] && fdiff="contents of $(join -j 2 <(sort -k2 "$WORK/n.files") <(sort -k2 "$WORK/p.files") | awk '$2 != $3 { print $1 }' | head -n 3 | paste -sd' ' -)"
            notes+=("files: $(md_escape "$fdiff" 90)")
        fi
    fi
    if [ -n "$note" ] && { [ "$expect" != ok ] || [ ${#diffs[@]} -gt 0 ]; }; then notes+=("($note)"); fi
    note_cell=
    [ ${#notes[@]} -gt 0 ] && note_cell=$(printf '%s; ' "${notes[@]}")
    note_cell=${note_cell%; }
    ROWS+=("| $label | $(describe "$nrc" "$(cat "$WORK/n.secs")") | $(describe "$prc" "$(cat "$WORK/p.secs")") | $match | $(md_escape "$note_cell" 600) |")

    if [ ${#diffs[@]} -gt 0 ] || [ "$REAL_LOG_ALL" = 1 ] || { [ "$nrc" != 0 ] && [ "$nrc" != 2 ]; }; then
        log ""
        log "================ $name $args ($suite, expect $expect): native rc $nrc in $(cat "$WORK/n.secs") s, pilot rc $prc in $(cat "$WORK/p.secs") s; differs: ${diffs[*]:-nothing}"
        log "command: (cd <fresh dir with ${data}> && $exe $args)  filter: $filter"
        [ -n "$note_cell" ] && log "notes: $note_cell"
        if ! cmp -s "$WORK/n.f" "$WORK/p.f"; then
            log "--- diff of filtered stdout (native, pilot)"
            diff -u "$WORK/n.f" "$WORK/p.f" | head -n 60 >>"$LOG"
        fi
        if ! cmp -s "$WORK/n.files" "$WORK/p.files"; then
            log "--- files written (sha256): native"; cat "$WORK/n.files" >>"$LOG"
            log "--- files written (sha256): pilot"; cat "$WORK/p.files" >>"$LOG"
        fi
        dump_file "native stdout" "$WORK/n.out" 60
        dump_file "native stderr" "$WORK/n.err" 30
        dump_file "pilot stdout" "$WORK/p.out" 60
        dump_file "pilot stderr" "$WORK/p.err" 40
        [ -s "$WORK/p.dlog" ] && dump_file "pilotd log during the pilot run" "$WORK/p.dlog" 60
        [ -n "$varies" ] && { log "--- diff native, native again"; diff -u "$WORK/n.f" "$WORK/r.f" | head -n 30 >>"$LOG"; }
    fi
    if [ "$need_daemon" = 1 ]; then
        if [ -n "$died" ]; then
            start_daemon || { say "pilotd does not start again"; break; }
        elif needs_restart "$prc" "${#diffs[@]}"; then
            start_daemon || { say "pilotd does not start again"; break; }
        fi
    fi
done 3<"$MANIFEST"

elapsed=$((SECONDS - start))
stop_daemon
for i in $(seq "$DAEMON_N"); do
    f=$WORK/pilotd.$i.log
    [ -f "$f" ] || continue
    log ""
    log "================ pilotd log, daemon $i of $DAEMON_N"
    dump_file "pilotd log" "$f" "$([ "$DAEMON_N" -gt 10 ] && echo 40 || echo 120)"
done

if [ -n "${REAL_CHAOS:-}" ]; then  # what the GPU counted of the preemptions, per program
    logs=()
    for i in $(seq "$DAEMON_N"); do [ -f "$WORK/pilotd.$i.log" ] && logs+=("$WORK/pilotd.$i.log"); done
    [ ${#logs[@]} -gt 0 ] && "$PYTHON" "$REPO/tests/gpu/chaos_tallies.py" --chaos "$REAL_CHAOS" \
        --runs "up to ${REAL_REPEAT:-1}" --need "${CHAOS_NEED:-100}" "${logs[@]}" >"$OUT/real_chaos.md" \
        && cat "$OUT/real_chaos.md"
fi

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
{
    printf 'Real CUDA programs, native vs pilot, on %s (%s backend%s%s), %s\n\n' "${gpu:-no GPU found}" \
        "$PILOT_BACKEND" "$([ "$REAL_MODE" != real ] && echo ", $REAL_MODE run: not a GPU result")" \
        "$([ -n "$part" ] && echo ", part $part")" "$(date -u +%FT%TZ)"
    printf 'Sources: %s. Compared: stdout after the manifest filter, exit status, files written. Timeout %s s per run; pilotd started %s time(s).\n\n' \
        "$(awk -F'\t' 'NR > 1 { printf "%s%s @ %s", sep, $1, substr($2, 1, 12); sep = ", " }' "$REALPROGS/SOURCES.tsv" 2>/dev/null)" \
        "$PROG_TIMEOUT" "$DAEMON_N"
    echo "| program | native | pilot | match? | note |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
    echo
    printf 'summary: %d identical, %d differ as expected (unsupported features), %d differ unexpectedly, %d matched although expected to differ, %d native failures or varying output, %d not run; %d s\n' \
        "$n_match" "$n_expected" "$n_unexpected" "$n_surprise" "$n_native_bad" "$n_notrun" "$elapsed"
    if [ ${#SKIPPED[@]} -gt 0 ]; then
        echo
        echo "Not run (excluded when the programs were chosen, or not built):"
        echo
        echo "| programs | suite | status | why |"
        echo "| --- | --- | --- | --- |"
        printf '%s\n' "${SKIPPED[@]}"
    fi
    echo
    if [ "$bad" = 0 ]; then echo "result: every program expected to match did"; else echo "result: **SOME PROGRAM EXPECTED TO MATCH DID NOT** (details in real_programs.log)"; fi
} >"$MD"
cat "$MD"
exit "$bad"
