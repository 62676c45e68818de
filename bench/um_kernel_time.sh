#!/usr/bin/env bash
# Where the unified-memory rows of issue 14 lose time: bench/um_stream.cu and bench/um_touch.cu
# under pilotd with `[metrics] kernel_time = true` (events around every launch), whose
# pilot_tenant_kernel_seconds_total is the kernels' GPU time alone; the programs' own numbers are
# wall time (STREAM) or event time around the launch (touch). Kernel time close to native's
# means the rest is host-side (launch path, flushes, synchronizations), not a slower GPU.
#
#   OUT=/tmp/pilot-gpu-out bash bench/um_kernel_time.sh      (pilot installed in $PILOT_SITE)
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" um_kernel_time
OUT=$OUT/um_kernel_time
mkdir -p "$OUT"
trap pilotd_stop EXIT
for prog in um_stream um_touch; do
    nvcc -cudart shared -O2 -arch=sm_90 -I "$REPO/bench" -o "$OUT/$prog" "$REPO/bench/$prog.cu" || exit 1
done
SHIM=$("$PYTHON" -c 'from pilot.shim import shim_path; print(shim_path(13))')
printf '[metrics]\nkernel_time = true\n' >"$OUT/pilotd.toml"
for prog in "um_stream 67108864 10" "um_touch 512 20"; do
    set -- $prog
    echo "== $1 native: $("$OUT/$1" "$2" "$3" | tr '\n' ' ')"
    pilotd_start "$OUT/pilotd-$1.log" --backend cuda --socket "$OUT/pilot.sock" \
        --metrics-address 127.0.0.1:19433 --config "$OUT/pilotd.toml" || exit 2
    echo "== $1 pilot: $(PILOT_SOCKET=$OUT/pilot.sock LD_PRELOAD=$SHIM "$OUT/$1" "$2" "$3" | tr '\n' ' ')"
    "$PYTHON" - <<'PY'
import urllib.request
text = urllib.request.urlopen("http://127.0.0.1:19433/metrics", timeout=10).read().decode()
for line in text.splitlines():
    if line.startswith(("pilot_tenant_kernel_seconds_total", "pilot_calls_total",
                        "pilot_call_latency_seconds_sum")):
        print("   ", line)
PY
    pilotd_stop
done
