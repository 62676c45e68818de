#!/usr/bin/env bash
# A/B of two pilot trees on one GPU machine: this tree and an older one (a `git archive` of it,
# carried to the machine), each installed into a site of its own, then bench.py for each,
# ROUNDS times, interleaved, so that both sides see the same machine.
#
#   git archive COMMIT | (mkdir -p .gl/old && tar -x -C .gl/old)      (here; carry .gl and .whl)
#   OUT=$OUT bash bench/ab_trees.sh .gl/old [bench.py arguments, default: launch and roundtrip]
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OLD=$(cd "${1:?usage: ab_trees.sh OLD_TREE [bench.py args]}" && pwd)
shift
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--only launch --only roundtrip --repeats 3)
OUT=${OUT:-/tmp/pilot-gpu-out}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
for side in new old; do
    site=/tmp/site-ab-$side
    tree=$ROOT
    [ $side = old ] && tree=$OLD
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$ROOT"/.whl/*.whl \
        >"$OUT/ab-install-$side.log" 2>&1
    (cd "$tree" && PILOT_SITE=$site PYTHONPATH=$site bash tests/gpu/run_compare.sh --install-only \
        >>"$OUT/ab-install-$side.log" 2>&1) || { echo "installing $tree failed"; exit 1; }
done
for round in $(seq "$ROUNDS"); do
    for side in new old; do
        tree=$ROOT
        [ $side = old ] && tree=$OLD
        (cd "$tree" && PYTHONPATH=/tmp/site-ab-$side timeout 300 python3 bench/bench.py \
            --start-daemon "${ARGS[@]}" --out "$OUT/ab-$side-$round.md" >"$OUT/ab-$side-$round.log" 2>&1)
        echo "== $side ($tree), round $round"
        grep '^| ' "$OUT/ab-$side-$round.md" | tail -n +3
    done
done
