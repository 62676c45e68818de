# shellcheck shell=bash
# The set-up the GPU scripts (tests/gpu/*.sh, bench/*.sh) share, sourced with REPO (the
# repository root) set and the tag of the script's messages:
#
#   REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
#   . "$REPO/tests/gpu/env.sh" graphs
#
# Sets, where the environment does not: OUT (/tmp/pilot-gpu-out), PILOT_SITE (/tmp/site, where
# pilot and the wheels are installed), PILOT_TOOLS (/tmp/site-tools, where the carried tools'
# wheels go: py-spy), PYTHON (python3), NVCC_ARCH (sm_90). Exports PYTHONPATH with PILOT_SITE
# first and PATH with PILOT_TOOLS/bin first. Sets NVCC (nvcc on the PATH, else /usr/local/cuda/bin/nvcc) and
# TOOLKIT_LIB (its toolkit's lib64). Defines say ("[TAG] ..." on stderr; a script may define its
# own after sourcing this), sources pilotd.sh (pilotd_start, pilotd_stop) and defines:
#
#   install_site_wheels   pip-installs the wheels carried in $REPO/.whl (pyzmq, cffi, pycparser,
#                         ... for the GPU machine's Python) into PILOT_SITE, and the tools'
#                         (py_spy*) into PILOT_TOOLS: installing pilot with pip --target
#                         --upgrade afterwards replaces PILOT_SITE/bin; none: nothing to do
#   install_site_pilot    installs pilot from this tree into PILOT_SITE
#                         (tests/gpu/run_compare.sh --install-only)
#   chaos_preemptions KEY LOG...  the preemptions pilotd's logs count for a program so far
#                         (tests/gpu/chaos_tallies.py --count; 0 without a log)
#
# Nothing else: exporting OUT, PYTHON or PYTHONUNBUFFERED, making directories and traps stay with
# each script.

OUT=${OUT:-/tmp/pilot-gpu-out}
PILOT_SITE=${PILOT_SITE:-/tmp/site}
PILOT_TOOLS=${PILOT_TOOLS:-/tmp/site-tools}
export PATH="$PILOT_TOOLS/bin:$PATH"
PYTHON=${PYTHON:-python3}
NVCC_ARCH=${NVCC_ARCH:-sm_90}
export PYTHONPATH="$PILOT_SITE${PYTHONPATH:+:$PYTHONPATH}"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
TOOLKIT_LIB=$(dirname "$(dirname "$(readlink -f "$NVCC")")")/lib64
GPU_SCRIPT_TAG=$1  # always given: a bare `.` would pass on the script's own $1

say() { printf '[%s] %s\n' "$GPU_SCRIPT_TAG" "$*" >&2; }

# shellcheck disable=SC2317  # called by the sourcing scripts
install_site_wheels() {
    local wheels=() tools=() w
    for w in "$REPO"/.whl/*.whl; do
        [ -e "$w" ] || continue
        case ${w##*/} in py_spy*) tools+=("$w") ;; *) wheels+=("$w") ;; esac
    done
    if [ ${#wheels[@]} -gt 0 ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$PILOT_SITE" "${wheels[@]}" || return 1
    fi
    if [ ${#tools[@]} -gt 0 ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$PILOT_TOOLS" "${tools[@]}" || return 1
    fi
}

# shellcheck disable=SC2317  # called by the sourcing scripts
install_site_pilot() {
    bash "$REPO/tests/gpu/run_compare.sh" --install-only
}

# shellcheck disable=SC2317  # called by the sourcing scripts
chaos_preemptions() {  # KEY LOG...: the preemptions pilotd's logs so far counted for a program
    local key=$1       # (KEY: its executable's base name and arguments, as chaos_tallies.py names it)
    shift
    [ $# -gt 0 ] || { echo 0; return; }
    sleep 0.2  # the session's end is logged once pilotd has seen the program go
    "$PYTHON" "$REPO/tests/gpu/chaos_tallies.py" --count "$key" "$@" 2>/dev/null || echo 0
}

# shellcheck source=tests/gpu/pilotd.sh
. "$REPO/tests/gpu/pilotd.sh"
