#!/usr/bin/env bash
# How far PyTorch gets under pilot on the GPU machine (issue 13): every step of
# tests/gpu/torch/probe.py natively, then under `pilot run` (python3 has no CUDA in its ELF, so
# it gets the CUDA 13 shim and the driver library), one process each. Then a program with the
# static runtime (vector_add.cu, nvcc's default) under the preloaded shim: refused, status 3.
#
#   bash tests/gpu/torch_probe.sh [--no-install] [STEP...]
#
# Prints a table (step, native, pilot); $OUT/torch/STEP.{native,pilot}.log hold each output,
# $OUT/torch/pilotd.log the daemon's log. Environment: OUT (/tmp/pilot-gpu-out), PILOT_SITE
# (/tmp/site), PYTHON (python3), STEP_TIMEOUT (seconds, 120), PILOT_EXPORT_TRACE (passed on),
# PILOTD_ARGS (more pilotd arguments, e.g. "--log-level debug --config FILE"), REPEAT (runs of
# each step under pilot, 1).
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" torch
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
SOCK=/tmp/pilot-gpu-torch/pilot.sock

if [ "${1:-}" = --no-install ]; then
    shift
else
    install_site_pilot || exit 2
fi
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(init alloc ops copy matmul linear bmm conv triton mlp transformer)
mkdir -p "$OUT/torch" "$(dirname "$SOCK")"
trap pilotd_stop EXIT
# shellcheck disable=SC2086  # PILOTD_ARGS is a list of words
pilotd_start "$OUT/torch/pilotd.log" --backend cuda --socket "$SOCK" ${PILOTD_ARGS:-} || exit 2
REPEAT=${REPEAT:-1}

PROBE=$REPO/tests/gpu/torch/probe.py
verdict() {  # LOG RC: ok / FAILED (rc) and the last error line
    if [ "$2" = 0 ]; then echo ok; else
        echo "FAILED rc=$2: $(grep -v '^\s*$' "$1" | grep -iE 'error|exception|not supported|pilot' | tail -1 | cut -c1-160)"
    fi
}
# Where the result lines differ: the loss curves (`losses=`) within 1e-3 relative at every step
# (issue 13 (b)), with the largest relative difference, or NO.
loss_curves() {
    "$PYTHON" - "$1" "$2" "$3" <<'PY'
import re, sys
def losses(path):
    for line in open(path):
        if line.startswith(sys.argv[3] + " ok") and "losses=" in line:
            return [float(v) for v in re.search(r"losses=(\S+)", line).group(1).split(",")]
    return None
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if not a or not b or len(a) != len(b):
    print("NO")
else:
    worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))
    print(f"{'within 1e-3' if worst <= 1e-3 else 'NO'} (max rel {worst:.1e})")
PY
}
# same: the step's result line (`STEP ok ...`, e.g. every loss of mlp) natively and under pilot
printf '| step | native | pilot | same result |\n| --- | --- | --- | --- |\n' >"$OUT/torch/table.md"
# training step times (median ms, `STEP step_ms=`), native and under pilot
printf '| training step | native ms | pilot ms | pilot / native |\n| --- | --- | --- | --- |\n' \
    >"$OUT/torch/steps.md"
for step in "${STEPS[@]}"; do
    nlog=$OUT/torch/$step.native.log plog=$OUT/torch/$step.pilot.log
    env -u LD_PRELOAD timeout "$STEP_TIMEOUT" "$PYTHON" "$PROBE" "$step" >"$nlog" 2>&1
    nrc=$?
    : >"$plog"
    prc=0
    for _ in $(seq "$REPEAT"); do
        env PILOT_SOCKET="$SOCK" timeout "$STEP_TIMEOUT" "$PYTHON" -m pilot.cli.pilot run -- \
            "$PYTHON" "$PROBE" "$step" >>"$plog" 2>&1 || prc=$?
    done
    same=-
    if [ $nrc = 0 ] && [ $prc = 0 ]; then
        if [ "$(grep -m1 "^$step ok" "$nlog")" = "$(grep -m1 "^$step ok" "$plog")" ]; then same=yes
        else same=$(loss_curves "$nlog" "$plog" "$step"); fi
    fi
    printf '| %s | %s | %s | %s |\n' "$step" "$(verdict "$nlog" $nrc)" "$(verdict "$plog" $prc)" "$same" \
        >>"$OUT/torch/table.md"
    nms=$(sed -n "s/^$step step_ms=//p" "$nlog" | head -1) pms=$(sed -n "s/^$step step_ms=//p" "$plog" | head -1)
    if [ -n "$nms" ] && [ -n "$pms" ]; then
        printf '| %s | %s | %s | %s |\n' "$step" "$nms" "$pms" \
            "$(awk -v n="$nms" -v p="$pms" 'BEGIN { printf "%.2fx", p / n }')" >>"$OUT/torch/steps.md"
    fi
    say "$step: native rc $nrc, pilot rc $prc"
done

STATIC=$OUT/torch/vector_add_static
if nvcc -arch=sm_90 -o "$STATIC" "$REPO/tests/apps/vector_add.cu" >"$OUT/torch/static.log" 2>&1; then
    env PILOT_SOCKET="$SOCK" LD_PRELOAD="$("$PYTHON" -m pilot.cli.pilot shim-path)" "$STATIC" \
        >>"$OUT/torch/static.log" 2>&1
    src=$?
    printf '| static runtime under the shim | - | %s | - |\n' \
        "$([ $src = 3 ] && echo "refused, status 3" || echo "NOT refused: rc $src")" >>"$OUT/torch/table.md"
else
    echo "| static runtime under the shim | - | build failed | - |" >>"$OUT/torch/table.md"
fi
cat "$OUT/torch/table.md"
echo
cat "$OUT/torch/steps.md"
tail -3 "$OUT/torch/static.log"
for step in "${STEPS[@]}"; do
    echo "### $step under pilot (last 25 lines)"
    tail -25 "$OUT/torch/$step.pilot.log"
done
