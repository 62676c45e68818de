#!/usr/bin/env bash
# Builds libumcounters.so (um_counters.c, a CUPTI injection library) into OUTDIR (default: this
# directory's build/):   bash bench/um_counters/build.sh [OUTDIR]
# Finds CUPTI's headers and library under $CUDA_HOME (default: nvcc's toolkit, else
# /usr/local/cuda): extras/CUPTI/{include,lib64} or the toolkit's own include/ and lib64/ (CUDA
# 13 puts them there), then /usr/local/cuda and /usr/local/cuda-*. Exits 3, saying so, when CUPTI is not found (the policy runner then runs
# without counters).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUTDIR=${1:-$HERE/build}
if [ -z "${CUDA_HOME:-}" ]; then
    if command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    else CUDA_HOME=/usr/local/cuda; fi
fi
INC="" LIB=""
for d in "$CUDA_HOME/extras/CUPTI" "$CUDA_HOME" "$CUDA_HOME/targets/x86_64-linux" /usr/local/cuda \
    /usr/local/cuda-[0-9]*; do
    [ -z "$INC" ] && [ -f "$d/include/cupti_activity.h" ] && INC=$d/include
    for l in lib64 lib; do
        [ -z "$LIB" ] && [ -e "$d/$l/libcupti.so" ] && LIB=$d/$l
    done
done
if [ -z "$INC" ] || [ -z "$LIB" ]; then
    echo "um_counters/build.sh: CUPTI not found under $CUDA_HOME (headers: ${INC:-none}, libcupti.so: ${LIB:-none})" >&2
    exit 3
fi
mkdir -p "$OUTDIR"
${CC:-gcc} -shared -fPIC -O2 -Wall -Wextra -I"$INC" -I"$CUDA_HOME/include" \
    -o "$OUTDIR/libumcounters.so" "$HERE/um_counters.c" \
    -L"$LIB" -lcupti -lpthread -Wl,-rpath,"$LIB"
echo "$OUTDIR/libumcounters.so"
