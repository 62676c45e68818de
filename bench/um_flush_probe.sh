#!/usr/bin/env bash
# Where a GPU first touch of host-written managed memory goes (bench/um_touch.cu, issue 14):
# the program natively, then under pilotd in several variants, each followed by pilotd's own
# counts of the calls involved (shadow flushes: how many, how many in C, their latency).
#   default            the fast path does flushes in C
#   python             `[daemon] fast_launch = false`: every flush in Python
#
#   OUT=/tmp/pilot-gpu-out bash bench/um_flush_probe.sh      (pilot installed in $PILOT_SITE)
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" um_flush_probe
OUT=$OUT/um_flush_probe
ARGS=${UM_TOUCH_ARGS:-512 20}
mkdir -p "$OUT"
trap pilotd_stop EXIT
nvcc -cudart shared -O2 -arch=sm_90 -I "$REPO/bench" -o "$OUT/um_touch" "$REPO/bench/um_touch.cu" || exit 1
SHIM=$("$PYTHON" -c 'from pilot.shim import shim_path; print(shim_path(13))')
printf '[daemon]\nfast_launch = false\n' >"$OUT/python.toml"
: >"$OUT/default.toml"
# shellcheck disable=SC2086
echo "== native: $("$OUT/um_touch" $ARGS | tr '\n' ' ')"
for variant in default python; do
    config=$OUT/$variant.toml
    pilotd_start "$OUT/pilotd-$variant.log" --backend cuda --socket "$OUT/pilot.sock" \
        --metrics-address 127.0.0.1:19434 --config "$config" || exit 2
    # shellcheck disable=SC2086
    echo "== $variant: $(PILOT_SOCKET="$OUT/pilot.sock" LD_PRELOAD="$SHIM" "$OUT/um_touch" $ARGS |
        tr '\n' ' ')"
    "$PYTHON" - <<'PY'
import urllib.request
text = urllib.request.urlopen("http://127.0.0.1:19434/metrics", timeout=10).read().decode()
values = {}
for line in text.splitlines():
    if line.startswith("pilot_"):
        key, value = line.rsplit(" ", 1)
        values[key] = float(value)
for name in ("shadow_flush", "shadow_fetch", "event_record", "launch", "malloc_managed",
             "shadow_attach", "free", "staging_open"):
    n = values.get(f'pilot_calls_total{{function="{name}"}}', 0)
    s = values.get(f'pilot_call_latency_seconds_sum{{function="{name}"}}', 0)
    if n:
        print(f"    {name:15} {n:8.0f} calls, mean {s / n * 1e6:8.1f} us")
for name in ("pilot_fast_flushes_total", "pilot_fast_launches_total"):
    print(f"    {name:28} {sum(v for k, v in values.items() if k.startswith(name + '{')):8.0f}")
PY
    pilotd_stop
done
