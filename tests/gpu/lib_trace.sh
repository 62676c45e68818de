#!/usr/bin/env bash
# Which functions of the CUDA math libraries PyTorch calls (issue 13, route B's surface;
# docs/design/frameworks.md section 6a): the torch probe's matmul, conv and train steps run
# natively (no pilot) under tests/gpu/lib_trace/audit.c as LD_AUDIT, which counts every call
# into cuBLAS, cuBLASLt, cuDNN, ... and who made it. Also lists what libtorch_cuda.so imports
# from those libraries (its ELF, the upper bound).
#
#   OUT=/tmp/pilot-gpu-out bash tests/gpu/lib_trace.sh
#
# Results in $OUT/lib_trace/: STEP.tsv (library, symbol, calls, caller), imports.txt,
# summary.md (calls per library and function, all steps), logs.
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/pilot-gpu-out}/lib_trace
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
gcc -shared -fPIC -O2 -Wall -Wextra -o "$OUT/audit.so" "$REPO/tests/gpu/lib_trace/audit.c" || exit 1
for step in matmul conv train; do
    rm -f "$OUT/$step.tsv"
    LIB_TRACE_OUT="$OUT/$step.tsv" LD_AUDIT="$OUT/audit.so" timeout 300 \
        "$PYTHON" "$REPO/tests/gpu/torch/probe.py" "$step" >"$OUT/$step.log" 2>&1
    echo "$step: rc $? $(tail -2 "$OUT/$step.log" | head -1)"
done
TORCH_LIB=$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
nm -D --undefined-only "$TORCH_LIB/libtorch_cuda.so" 2>/dev/null |
    awk '{print $NF}' | grep -E '^(cublas|cublasLt|cudnn|cufft|curand|cusparse|cusolver|nccl)' |
    sort >"$OUT/imports.txt"
echo "libtorch_cuda.so imports $(wc -l <"$OUT/imports.txt") math-library functions"
"$PYTHON" - "$OUT" <<'PY'
import collections, pathlib, sys
out = pathlib.Path(sys.argv[1])
calls = collections.Counter()
steps = collections.defaultdict(set)
callers = {}
for f in sorted(out.glob("*.tsv")):
    for line in f.read_text().splitlines():
        lib, sym, n, caller = line.split("\t")
        key = (lib.split(".so")[0], sym)
        calls[key] += int(n)
        if int(n):
            steps[key].add(f.stem)
        callers.setdefault(key, caller)
by_lib = collections.defaultdict(list)
for (lib, sym), n in calls.items():
    by_lib[lib].append((sym, n))
lines = ["| library | functions bound | called | calls |", "| --- | ---: | ---: | ---: |"]
for lib, rows in sorted(by_lib.items()):
    lines.append(f"| {lib} | {len(rows)} | {sum(1 for _, n in rows if n)} | {sum(n for _, n in rows)} |")
lines += ["", "| library | function | calls | steps calling it | first caller |",
          "| --- | --- | ---: | --- | --- |"]
for (lib, sym), n in sorted(calls.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1])):
    lines.append(f"| {lib} | {sym} | {n} | {','.join(sorted(steps[(lib, sym)]))} | {callers[(lib, sym)]} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines[:40]))
PY
