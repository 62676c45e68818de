#!/usr/bin/env bash
# Salus (issue 30) on the GPU in one go, unattended: run_all.sh's `salus` stage.
#
#   OUT=$OUT bash tests/gpu/run_all.sh salus     # wheels and install first (carry .whl)
#   bash tests/gpu/salus_gpu.sh                  # pilot already on PYTHONPATH
#
# Steps (each a fresh pilotd per run; each prints PASS/FAIL lines):
#   trace  bench/salus_trace.py --timeline: the seeded 30-job trace under FIFO, SRTF, PACK and
#          FAIR (Table 2), with each FIFO/SRTF job's timeline (bench/salus_timeline.py)
#          about 3.5 min, limit SALUS_TRACE_TIMEOUT (290 s)
#   fair   bench/salus_experiments.py fair: Fig. 11 (three jobs 15 s apart under FAIR, shares
#          of 1/k +-10%, first iterations within 1 s); about 60 s, limit 100 s
#   torch  bench/salus_experiments.py torch: a PyTorch job declaring nothing, caching allocator
#          vs backend:cudaMallocAsync (what pilot recognizes), and cudaMallocAsync again with
#          the fast path off (what watching sessions one by one gains); about 60 s, limit 120 s
#   steps  bench/salus_experiments.py steps: boundaries per step and step time of PyTorch jobs
#          (small, medium; backend:cudaMallocAsync) under salus and `none`, and of
#          bench/salus_torch_like.cu under salus (PASS: 0.8-1.25 boundaries a step); about 90 s,
#          limit 180 s
# Written to $OUT: salus.md (every PASS/FAIL line by step, the trace's table and timelines,
# each step's exit status) and salus.tgz (everything: JSON, plots, pilotd logs, job outputs).
# Exit status: non-zero if a step failed or printed a FAIL line.
# Environment: OUT, PYTHON (python3), SALUS_WORK (/tmp/salus-gpu), SALUS_STEPS (which steps, in
# order; default "trace fair torch steps"), SALUS_TRACE_ARGS (extra
# salus_trace.py arguments, e.g. "--scale 1.0"), SALUS_TRACE_TIMEOUT, SALUS_BACKEND (cuda; sim
# checks this script without a GPU: shorter runs, the trace's PyTorch jobs as
# bench/salus_torch_like.cu, the torch step only where PyTorch is installed).
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/pilot-gpu-out}
PYTHON=${PYTHON:-python3}
WORK=${SALUS_WORK:-/tmp/salus-gpu}
TRACE_ARGS=${SALUS_TRACE_ARGS:-}
TRACE_TIMEOUT=${SALUS_TRACE_TIMEOUT:-290}
export PYTHONUNBUFFERED=1
cd "$REPO" || exit 1
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"
STATUS=()
RC=0

# step NAME LIMIT COMMAND...: runs it with its output in $WORK/NAME.log and on stdout
step() {
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    printf -- '---- salus %s: %s\n' "$name" "$*"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$WORK/$name.log"
    rc=${PIPESTATUS[0]}
    STATUS+=("$name: rc $rc$([ "$rc" = 124 ] && echo ' (timed out)') in $((SECONDS - t0)) s")
    [ "$rc" = 0 ] || RC=1
    printf -- '---- salus %s: rc %s in %s s\n' "$name" "$rc" "$((SECONDS - t0))"
}

SIM_TRACE=() SIM_FAIR=() SIM_TORCH=()
if [ "${SALUS_BACKEND:-cuda}" = sim ]; then
    SIM_TRACE=(--backend sim --torch-like --scale 0.3) SIM_FAIR=(--backend sim --scale 0.2) SIM_TORCH=(--backend sim)
fi
STEPS=${SALUS_STEPS:-trace fair torch steps}
wants() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# shellcheck disable=SC2086  # TRACE_ARGS is a list of words
wants trace && step trace "$TRACE_TIMEOUT" "$PYTHON" bench/salus_trace.py --timeline --out "$WORK/trace" "${SIM_TRACE[@]}" $TRACE_ARGS
wants fair && step fair 100 "$PYTHON" bench/salus_experiments.py fair --out "$WORK/fair" "${SIM_FAIR[@]}"
if wants torch; then
    if [ "${SALUS_BACKEND:-cuda}" = sim ] && ! "$PYTHON" -c 'import torch' 2>/dev/null; then
        echo "SKIP: torch: no PyTorch here (sim dry run)" | tee "$WORK/torch.log"
    else
        step torch 120 "$PYTHON" bench/salus_experiments.py torch --out "$WORK/torch" "${SIM_TORCH[@]}"
    fi
fi
wants steps && step steps 180 "$PYTHON" bench/salus_experiments.py steps --out "$WORK/steps" "${SIM_TORCH[@]}"

{
    echo "# salus on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1), $(date -u +%FT%TZ)"
    for name in $STEPS; do
        echo
        echo "## $name"
        grep -E '^(PASS|FAIL|SKIP|INFO)' "$WORK/$name.log" || echo "(no PASS/FAIL line)"
    done
    if wants steps; then
        echo
        echo "## boundaries per step: each run"
        grep -E ' under (salus|none): ' "$WORK/steps.log"
    fi
    if wants trace; then
        echo
        echo "## the trace"
        grep -vE '^(PASS|FAIL)' "$WORK/trace.log"
    fi
    echo
    echo "## steps"
    printf '%s\n' "${STATUS[@]}"
} >"$OUT/salus.md"
grep -q '^FAIL' "$WORK"/*.log && RC=1
tar czf "$OUT/salus.tgz" --exclude=salus_job --exclude=salus_torch_like --exclude=state -C "$WORK" . 2>/dev/null
cat "$OUT/salus.md"
exit "$RC"
