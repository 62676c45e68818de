#!/usr/bin/env bash
# Compute shares on the GPU machine, in one command from the repository root (carry .whl):
#
#   bash tests/gpu/share_run.sh
#
# 1. wheels and pilot into $PILOT_SITE (as run_all.sh does: run_compare.sh --install-only);
# 2. tests/gpu/green_probe.py: which memory-touching kernels run in green contexts (with the
#    whole-GPU control cases), then the raw partition throughput;
# 3. tests/gpu/share_check.py: pilot itself, a tenant capped at 25%
#    beside an uncapped one. Outputs in $OUT (green_probe.txt, share_check.txt, pilotd-share.log).
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" share
export OUT PILOT_SITE PYTHON PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$OUT"
cd "$REPO"
install_site_wheels || exit 2
install_site_pilot >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 2; }
rc=0
timeout "${PROBE_TIMEOUT:-120}" "$PYTHON" tests/gpu/green_probe.py 2>&1 | tee "$OUT/green_probe.txt" || rc=1
timeout "${SHARE_TIMEOUT:-120}" "$PYTHON" tests/gpu/share_check.py 2>&1 \
    | tee "$OUT/share_check.txt" || rc=1
exit $rc
