#!/usr/bin/env bash
# Where pilotd's threads wait while N PyTorch transformer tenants train at once (issue 25):
# bench/tenants.py (pilot only) with bench/thread_waits.py sampling pilotd's threads in the
# steady part of the run, once per pilotd variant. Run from the repository root on the GPU
# machine after the install (tests/gpu/run_all.sh's wheels + install, or run_compare.sh
# --install-only):
#   OUT=/tmp/out N=4 bash bench/tenants_waits.sh [VARIANT...]
# A VARIANT is a name=TOML pair, e.g. 'switch5ms=[daemon]\nswitch_interval = "5ms"'; without
# any, the default configuration only. Output: $OUT/waits-<name>.txt and tenants rows.
set -u -o pipefail
OUT=${OUT:-/tmp/pilot-waits}
N=${N:-4}
PYTHON=${PYTHON:-python3}
export PYTHONPATH=${PILOT_SITE:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=("default=")
for v in "${variants[@]}"; do
    name=${v%%=*}
    toml=${v#*=}
    args=()
    if [ -n "$toml" ]; then
        printf '%b\n' "$toml" > "$OUT/$name.toml"
        args=(--pilotd-arg=--config --pilotd-arg="$OUT/$name.toml")
    fi
    "$PYTHON" bench/tenants.py --out "$OUT/tenants-$name" --modes pilot --rounds 1 --ns "$N" \
        --workloads transformer --warm 4 --measure 8 "${args[@]}" > "$OUT/tenants-$name.log" 2>&1 &
    runner=$!
    # once pilotd is busy (the workers are training), the steady part
    "$PYTHON" bench/thread_waits.py --match "pilot.daemon" --wait-busy 1.3 --duration 4 --top 14 \
        > "$OUT/waits-$name.txt" 2>&1
    wait "$runner"
    echo "== $name"
    cat "$OUT/waits-$name.txt"
    grep "^| transformer" "$OUT/tenants-$name/tenants.md" 2>/dev/null || tail -5 "$OUT/tenants-$name.log"
done
