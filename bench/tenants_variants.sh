#!/usr/bin/env bash
# pilot's multi-tenant transformer rows under pilotd environment variants, one after another
# (issue 25: what serializes tenants on the GPU side). After run_all.sh's wheels and install:
#   OUT=/tmp/out bash bench/tenants_variants.sh [NS]
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" tenants_variants
NS=${1:-1,4,8}
for variant in default CUDA_DEVICE_MAX_CONNECTIONS=32; do
    args=(--modes pilot --rounds 1 --ns "$NS" --workloads transformer,graph --out "$OUT/variant-$variant")
    [ "$variant" != default ] && args+=(--pilotd-env "$variant")
    echo "== $variant"
    timeout -k 10 300 "$PYTHON" bench/tenants.py "${args[@]}" 2>&1 | grep -E '^\[tenants\] pilot|failed'
done
