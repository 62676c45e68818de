# shellcheck shell=bash
# pilotd for the GPU scripts (run_compare.sh, real_programs.sh, daemon_variants.sh), sourced:
#
#   pilotd_start LOG ARGS...  starts `$PYTHON -m pilot.daemon ARGS...` in the background, stdout
#                             and stderr into LOG, without the caller's LD_PRELOAD/PILOT_SOCKET;
#                             sets DAEMON_PID; waits up to 60 s for "pilotd ready". Returns 1,
#                             with LOG on stderr, if it does not come up.
#   pilotd_stop               SIGTERM, SIGKILL after 10 s; waits for it; sets DAEMON_STATUS to
#                             its exit status and clears DAEMON_PID. Nothing to do: returns 0.
# Messages go through the caller's `say`.

DAEMON_PID=
export DAEMON_STATUS=  # read by the sourcing script

pilotd_start() {
    local log=$1
    shift
    env -u LD_PRELOAD -u PILOT_SOCKET "${PYTHON:-python3}" -m pilot.daemon "$@" </dev/null >"$log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 600); do  # 60 s
        grep -q "pilotd ready" "$log" && return 0
        kill -0 "$DAEMON_PID" 2>/dev/null || break
        sleep 0.1
    done
    say "pilotd ($*) did not become ready; its log:"
    cat "$log" >&2
    return 1
}

pilotd_stop() {
    [ -n "$DAEMON_PID" ] || return 0
    if kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null
        for _ in $(seq 100); do
            kill -0 "$DAEMON_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$DAEMON_PID" 2>/dev/null; then
            say "pilotd ignored SIGTERM for 10 s: SIGKILL"
            kill -KILL "$DAEMON_PID" 2>/dev/null
        fi
    fi
    wait "$DAEMON_PID" 2>/dev/null
    DAEMON_STATUS=$?
    DAEMON_PID=
}
