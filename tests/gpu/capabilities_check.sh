#!/usr/bin/env bash
# Device attributes of capabilities pilot does not carry (daemon/ops/device.py NOT_CARRIED) read
# 0 under pilot, through the driver library (cuDeviceGetAttribute, cuda-python under `pilot
# run`), while the others read what they read natively. Prints both and PASS/FAIL.
#
#   OUT=/tmp/rs bash tests/gpu/run_all.sh smoke && bash tests/gpu/capabilities_check.sh
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" capabilities
SOCK=/tmp/pilot-gpu-caps/pilot.sock
mkdir -p "$OUT" "$(dirname "$SOCK")"
trap pilotd_stop EXIT
pilotd_start "$OUT/pilotd-caps.log" --backend cuda --socket "$SOCK" || exit 2
read -r -d '' PROBE <<'PY'
from cuda.bindings import driver as cu
cu.cuInit(0)
A = cu.CUdevice_attribute
names = ["CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", "CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED",
         "CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES", "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED",
         "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"]
print(" ".join(f"{n[20:].lower()}={cu.cuDeviceGetAttribute(getattr(A, n), 0)[1]}" for n in names))
PY
native=$("$PYTHON" -c "$PROBE")
pilot=$(env PILOT_SOCKET="$SOCK" "$PYTHON" -m pilot.cli.pilot run -- "$PYTHON" -c "$PROBE")
echo "native: $native"
echo "pilot:  $pilot"
want=$(sed -E 's/(virtual_memory_management_supported|ipc_event_supported|mempool_supported_handle_types)=[0-9]+/\1=0/g' <<<"$native")
if [ "$pilot" = "$want" ]; then echo "PASS capabilities"; else echo "FAIL capabilities (want: $want)"; exit 1; fi
