#!/usr/bin/env bash
# PILOT Fig. 4/5 on the GPU machine, from the repository root (carry .whl and .realprogs):
#
#   bash bench/policies_gpu.sh [bench/policy_runner.py arguments...]
#
# Installs pilot into /tmp/site (the cp312 wheels in .whl, then this tree), prints the GPU's
# state, runs bench/policy_runner.py --realprogs .realprogs with the arguments given, and copies
# what the device tool can bring back into $OUT: policies.md, policies.json, the plots, the
# runner's output, and the pilotd logs as one tarball.
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" policies
WORK=${WORK:-/tmp/policies}
mkdir -p "$OUT" "$WORK"
install_site_wheels || exit 1
install_site_pilot >"$WORK/install.log" 2>&1 || { tail -30 "$WORK/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
date -u
python3 bench/policy_runner.py --realprogs .realprogs --out "$WORK" "$@" 2>&1 | tee "$WORK/runner.log"
rc=${PIPESTATUS[0]}
cp "$WORK"/policies.md "$WORK"/policies.json "$WORK"/runner.log "$OUT"/ 2>/dev/null
cp "$WORK"/*.png "$OUT"/ 2>/dev/null
tar -czf "$OUT/logs.tar.gz" -C "$WORK" --exclude='*.png' --exclude='policies.*' . 2>/dev/null
exit "$rc"
