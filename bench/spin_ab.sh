#!/usr/bin/env bash
# The spin budget (daemon/native/spin_budget.h; `[daemon] spinners`) A/B on the GPU, in one go:
# the many-tenants rows where pilotd's spinning threads competed with the tenants for cores
# (issue 25: graph inference at N=16 was 0.60x MPS), under MPS and under pilot with each
# budget, then the single-tenant round trips with the default budget beside native.
#
#   OUT=/tmp/rs bash tests/gpu/run_all.sh smoke && OUT=/tmp/out bash bench/spin_ab.sh  # (installs first)
#
# Environment: SPINNERS (the pilot variants, default "0 auto": no limit and a quarter of the
# cores; a variant SPINNERS,US also sets the tenants' PILOT_SPIN_US, how long the shim polls for
# a reply before it sleeps, e.g. "auto,1000"; SPINNERS:VAR=VALUE[:VAR=VALUE] sets those in the
# tenants' environment instead, e.g. "0:PILOT_WORD_US=0"; a trailing /always or /auto sets
# `[daemon] endpoint_spin`, auto otherwise: SPINNERS="0/always 0/auto" is that A/B), NS (8,16), WORKLOADS (graph,transformer), ROUNDS
# (2), WARM (seconds of steps before each window, 0.5), MPS (1: run MPS too). Writes $OUT/spin_ab.md (one
# table: MPS and every variant, each variant's ratios to MPS), $OUT/spin-*/ (tenants.py's
# outputs) and $OUT/spin_bench.md (bench.py launch and roundtrip; SPIN_BENCH=0 leaves it out).
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" spin_ab
cd "$REPO" || exit 1
SPINNERS=${SPINNERS:-0 auto}
NS=${NS:-8,16}
WORKLOADS=${WORKLOADS:-graph,transformer}
ROUNDS=${ROUNDS:-2}
WARM=${WARM:-0.5}
mkdir -p "$OUT"
common=(--ns "$NS" --workloads "$WORKLOADS" --rounds "$ROUNDS" --warm "$WARM" --measure 1.2 --python "$PYTHON")
if [ "${MPS:-1}" = 1 ]; then
    say "mps"
    timeout -k 10 160 "$PYTHON" bench/tenants.py --modes mps --out "$OUT/spin-mps" "${common[@]}" 2>&1 |
        grep -E '^\[tenants\] (mps|pilot)|failed|Error' | tail -20
fi
names=()
for s in $SPINNERS; do
    endpoint=auto suffix=
    case "$s" in */*) endpoint=${s##*/} suffix=-${s##*/} s=${s%/*} ;; esac
    spinners=${s%%[,:]*}
    client=()
    case "$s" in
        *:*) IFS=: read -ra assigns <<<"${s#*:}"; client=(env "${assigns[@]}") ;;
        *,*) client=(env "PILOT_SPIN_US=${s#*,}") ;;
    esac
    name=${s//[,:=]/-}$suffix
    names+=("$name")
    say "pilot, spinners $spinners, endpoint_spin $endpoint, tenants' environment: ${client[*]:1}"
    timeout -k 10 160 "${client[@]}" "$PYTHON" bench/tenants.py --modes pilot --pilotd-arg="--spinners=$spinners" \
        --pilotd-arg="--endpoint-spin=$endpoint" --out "$OUT/spin-$name" "${common[@]}" 2>&1 | grep -E '^\[tenants\] (mps|pilot)|failed|Error' | tail -20
done
"$PYTHON" - "$OUT" "${names[@]}" <<'PY' | tee "$OUT/spin_ab.md"
import json, statistics, sys
from pathlib import Path
out, variants = Path(sys.argv[1]), sys.argv[2:]
def cells(name):
    path = out / f"spin-{name}" / "tenants.json"
    if not path.exists():
        return {}
    by = {}
    for r in json.loads(path.read_text()):
        by.setdefault((r["workload"], r["n"]), []).append(r)
    return {k: (statistics.median(r["aggregate_steps_s"] for r in rs),
                statistics.median(r["median_ms"] for r in rs),
                [round(r["aggregate_steps_s"], 1) for r in rs]) for k, rs in by.items()}
mps = cells("mps")
pil = {v: cells(v) for v in variants}
head = ["workload", "N", "MPS agg/s", "MPS med ms"]
for v in variants:
    head += [f"{v} agg/s", "med ms", "agg/MPS", "med/MPS", "rounds agg/s"]
print("| " + " | ".join(head) + " |")
print("|" + " --- |" * len(head))
for key in sorted(set(mps) | {k for c in pil.values() for k in c}):
    m = mps.get(key)
    row = [key[0], str(key[1]), f"{m[0]:.1f}" if m else "-", f"{m[1]:.2f}" if m else "-"]
    for v in variants:
        p = pil[v].get(key)
        if not p:
            row += ["-"] * 5
            continue
        row += [f"{p[0]:.1f}", f"{p[1]:.2f}", f"{p[0] / m[0]:.2f}" if m else "-",
                f"{p[1] / m[1]:.2f}" if m else "-", str(p[2])]
    print("| " + " | ".join(row) + " |")
PY
[ "${SPIN_BENCH:-1}" = 1 ] || exit 0
say "bench.py launch, roundtrip (default budget)"
timeout -k 10 150 "$PYTHON" bench/bench.py --start-daemon --only launch --only roundtrip \
    --out "$OUT/spin_bench.md" --daemon-log "$OUT/pilotd-spin-bench.log" 2>&1 | tail -25
