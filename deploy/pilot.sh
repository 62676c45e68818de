# pilot: run CUDA programs through the shared pilotd. Install as /etc/profile.d/pilot.sh.
#
# Sourced by every login shell (sh, dash, bash, ...), so it is plain POSIX sh, defines nothing
# with a '-' in a function name (dash rejects those), never fails, and by default preloads
# nothing: LD_PRELOAD in a login shell reaches every program started from it (editors, git,
# setuid tools, other CUDA runtimes), which is not ours to decide for the user.
#
# What it gives:
#   pilot-run ./app args...     (interactive shells) same as: pilot run -- ./app args...
#   PILOT_AUTO_PRELOAD=1        opt-in: export LD_PRELOAD=$(pilot shim-path), so every program
#                               of this shell and its children goes through pilot. Set it before
#                               this file is read (ssh SendEnv/SetEnv, a batch system), or in
#                               ~/.profile followed by a second `. /etc/profile.d/pilot.sh`.
#   PILOT_BIN=/path/to/pilot    where the pilot CLI is, if not on PATH (default: pilot, else
#                               /opt/pilot/bin/pilot).

if [ -z "${PILOT_BIN:-}" ]; then
    if command -v pilot >/dev/null 2>&1; then
        PILOT_BIN=pilot
    elif [ -x /opt/pilot/bin/pilot ]; then
        PILOT_BIN=/opt/pilot/bin/pilot
    fi
fi

if [ -n "${PILOT_BIN:-}" ]; then
    # Aliases expand only in interactive shells: scripts keep calling `pilot run --` explicitly.
    alias pilot-run="$PILOT_BIN run --"

    if [ "${PILOT_AUTO_PRELOAD:-0}" = 1 ]; then
        # Asked for: find the shim once (this runs Python, so only when opted in).
        _pilot_shim=$("$PILOT_BIN" shim-path 2>/dev/null) || _pilot_shim=
        if [ -n "$_pilot_shim" ] && [ -f "$_pilot_shim" ]; then
            case " ${LD_PRELOAD:-} " in
                *" $_pilot_shim "*) ;;  # a nested shell: already there
                *) LD_PRELOAD="$_pilot_shim${LD_PRELOAD:+ $LD_PRELOAD}"; export LD_PRELOAD ;;
            esac
        fi
        unset _pilot_shim
    fi
fi
