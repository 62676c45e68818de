#!/usr/bin/env bash
# bench.py's core rows for two trees on one machine, one after the other: the tree at OLD (a
# checkout carried as an ignored folder, e.g. build/oldtree from `git archive`) and this one.
# For changes that must not move performance (issue 26's file moves). From the repository root
# on the GPU machine, with .whl and OLD carried:
#   OLD=build/oldtree OUT=/tmp/out bash bench/ab_bench.sh [bench.py --only ROW ...]
set -u -o pipefail
REPO=$(pwd)
OLD=${OLD:?the other tree}
OUT=${OUT:-/tmp/pilot-ab}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
rows=("$@")
[ ${#rows[@]} -eq 0 ] && rows=(--only launch --only roundtrip --only alloc --only bandwidth --only launch_many)
for side in old new; do
    tree=$REPO; [ "$side" = old ] && tree=$REPO/$OLD
    site=/tmp/site-ab-$side
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$REPO"/.whl/*.whl >/dev/null 2>&1
    (cd "$tree" && PILOT_SITE=$site PYTHONPATH=$site bash tests/gpu/run_compare.sh --install-only >"$OUT/install-$side.log" 2>&1) \
        || { echo "install of the $side tree failed (see $OUT/install-$side.log)"; exit 1; }
    (cd "$tree" && PYTHONPATH=$site "$PYTHON" bench/bench.py --start-daemon "${rows[@]}" --out "$OUT/bench-$side.md" \
        >"$OUT/bench-$side.log" 2>&1) || echo "bench.py of the $side tree failed"
done
for side in old new; do echo "== $side"; grep "^| " "$OUT/bench-$side.md" | cut -d'|' -f2-5; done
