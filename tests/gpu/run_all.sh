#!/usr/bin/env bash
# The one command to run on the GPU machine, from the repository root:
#
#   bash tests/gpu/run_all.sh [STAGE...]
#
# With STAGE names (smoke compare driver cublas cudnn ops charge freeasync faults confine flood graphs real bench rings um_tune um_flush sched preempt loop_preempt policy_preempt priority tally fig1 tenants salus) only those run, after wheels and
# install.
# Stages, each run even when an earlier one failed (each failure is reported; the exit status is
# non-zero if any stage failed):
#   1. wheels   .whl/*.whl (pyzmq, cffi, pycparser) into $PILOT_SITE with pip --target
#   2. install  pilot from this tree into $PILOT_SITE (tests/gpu/run_compare.sh --install-only)
#   3. smoke    tests/gpu/backend_cuda_smoke.py: the CUDA backend against the driver
#   4. compare  tests/gpu/run_compare.sh --no-install: every test program natively and under
#               pilot, stdout compared byte for byte
#      driver   tests/gpu/driver_compare.sh --no-install: the driver API program the same way
#      cublas   tests/gpu/cublas_compare.sh --no-install: the cuBLAS/cuBLASLt programs the same way,
#               then tests/gpu/cublas_samples.sh --no-install (the cuBLAS CUDA samples: carry their
#               sources, .realprogs-src/cuda-samples/Common and the five sample directories) and
#               bench/blas.sh --no-install (what a cuBLAS call costs); each skipped when its
#               inputs are missing
#      cudnn    tests/gpu/cudnn_compare.sh --no-install (tests/apps/cudnn_conv.cu natively on
#               PyTorch's libcudnn.so.9 and under pilot, then its isolation case), then
#               tests/gpu/torch_probe.sh --no-install conv train resnet18 (issue 13 (a), (b), (e))
#   5. ops      tests/gpu/ops_check.py: NVML readings, capacity, a quota enforced, metrics served
#      charge   tests/gpu/image_charge_check.py: module images charged what the driver loaded
#      freeasync tests/gpu/free_async_check.py: cudaFreeAsync beside a 100 ms kernel natively and
#               under pilot, and a PyTorch step with backend:cudaMallocAsync vs caching (~1.5 min)
#      faults   tests/gpu/fault_check.py: a kernel fault beside a running program and before the
#               next one; detection and recovery times (router/recovery.py)
#      confine  tests/gpu/confine_check.py: a kernel reading another tenant's memory by address,
#               shared vs the confined mode (engines over pilotd's MPS), MPS fault containment,
#               PyTorch step overhead confined/shared; $OUT/confine/ (issue 27 item 10, ~2.5 min)
#      flood    tests/gpu/flood_latency.py: a tenant's 4-byte copies (bench/roundtrip.cu) alone and
#               while `nobody` floods every socket; p99 flooded/alone (issue 27's target <= 2x, ~1 min)
#      real     tests/gpu/real_programs.sh --no-install: the public CUDA samples and Rodinia programs
#               natively and under pilot (carry .realprogs, built by hack/build_real_programs.sh;
#               skipped without it; REAL_DEADLINE seconds, default 330)
#   6. bench    bench/bench.py --start-daemon: native vs pilot costs and bandwidths, and the
#               Unified Memory workloads (bench/um.cu, 1 GiB)
#      rings    bench/ring_ab.sh: launch and round-trip rows with the shared-memory rings and on
#               the socket (PILOT_RING=0), side by side with native
#   7. um_tune  bench/bench.py --only um at other shadow chunk sizes (PILOT_UM_CHUNK) and without
#               huge pages (PILOT_UM_HUGEPAGE=0), one run each: the measurements behind the defaults
#      um_flush bench/um_flush_probe.sh: GPU first touch of host-written managed memory natively
#               and under pilotd variants, with pilotd's counts of the flushes (issue 14)
#   8. sched    tests/gpu/scheduler_check.py: the resource broker and launches that wait, on the GPU
#      preempt  tests/gpu/preempt_check.py: preemptible persistent-block kernels (issue 29): results
#               identical under forced preemption, overhead without it, preemption latency
#      loop_preempt tests/gpu/loop_preempt_check.py: loop-level preemption (idempotent kernels
#               abandoned inside a block, run again): results, overhead, latency, pilotd end to end
#      policy_preempt tests/gpu/policy_preempt_check.py: a test policy preempting sessions through
#               the policies' API every 50 ms: results exact, drain latency per block time
#      priority tests/gpu/priority_check.py: a high tenant's latency probe beside another tenant's
#               flood, without priorities and with the gate at K=2 and K=1 (issue 29)
#      tally    bench/priority_tally.py: Tally's experiment (transformer inference at half load beside
#               transformer training) under time-slicing, MPS, MPS priority and pilot's three ways
#   9. fig1     bench/fig1.py: PILOT Fig. 1, bare CUDA vs MPS vs pilot (default configuration)
#  10. tenants  bench/tenants.py: N PyTorch training / CUDA-graph inference processes at once under
#               time-slicing, MPS and pilot (TENANTS_ARGS, e.g. "--rounds 1 --ns 1,4,8")
#  11. salus    tests/gpu/salus_gpu.sh: the salus policy's trace (Table 2, per-job timelines),
#               Fig. 11 (FAIR), the PyTorch detector probe and boundaries per step; $OUT/salus.md,
#               salus.tgz (~7.5 min)
# Everything printed is also in $OUT/run_all.log; the compare and bench tables come last.
# Files under $OUT (default /tmp/pilot-gpu-out): run_all.log, compare.md, compare.log,
# pilotd-compare.log, bench.md, bench.json, pilotd-bench.log, um_tune.md.
#
# Environment: OUT, PILOT_SITE (default /tmp/site), PYTHON (default python3), NVCC_ARCH
# (default sm_90), SMOKE_TIMEOUT / COMPARE_TIMEOUT / BENCH_TIMEOUT (seconds per stage),
# BENCH_ARGS (extra bench.py arguments, e.g. "--repeats 2").
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/gpu/env.sh
. "$REPO/tests/gpu/env.sh" run_all
SMOKE_TIMEOUT=${SMOKE_TIMEOUT:-120}
COMPARE_TIMEOUT=${COMPARE_TIMEOUT:-240}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240}
UM_TUNE_TIMEOUT=${UM_TUNE_TIMEOUT:-60}  # per variant
BENCH_ARGS=${BENCH_ARGS:-}
TENANTS_ARGS=${TENANTS_ARGS:-}
TENANTS_TIMEOUT=${TENANTS_TIMEOUT:-900}
export OUT PILOT_SITE PYTHON
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

STAGES=()
FAILED=0

SELECTED=" $* "

# stage NAME COMMAND...: runs it, records "NAME: ok/FAILED (rc) in N s"; skips a stage not selected
stage() {
    local name=$1 rc t0=$SECONDS
    shift
    case "$name" in wheels | install) ;; *)
        if [ "$SELECTED" != "  " ] && [[ "$SELECTED" != *" $name "* ]]; then
            STAGES+=("$name: not selected")
            return 0
        fi
    esac
    printf '\n==================== %s: %s\n' "$name" "$*"
    "$@"
    rc=$?
    if [ "$rc" = 0 ]; then
        STAGES+=("$name: ok in $((SECONDS - t0)) s")
    else
        STAGES+=("$name: FAILED (rc $rc$([ "$rc" = 124 ] && echo ', timed out')) in $((SECONDS - t0)) s")
        FAILED=1
    fi
    printf '==================== %s: rc %s in %s s\n' "$name" "$rc" "$((SECONDS - t0))"
    return 0
}

# shellcheck disable=SC2317  # called through stage
install_wheels() {
    local wheels=("$REPO"/.whl/*.whl)
    if [ ! -e "${wheels[0]}" ]; then
        echo "no wheels in $REPO/.whl: relying on the interpreter's own pyzmq/cffi/pycparser"
    else
        install_site_wheels || return 1
    fi
    "$PYTHON" -c 'import zmq, cffi, pycparser; print("zmq", zmq.__version__, "cffi", cffi.__version__)'
}

# shellcheck disable=SC2317  # called through stage
um_tune() {
    local rc=0 variant
    : >"$OUT/um_tune.md"
    for variant in PILOT_UM_HUGEPAGE=0 PILOT_UM_CHUNK=512K PILOT_UM_CHUNK=8M; do
        echo "### $variant" >>"$OUT/um_tune.md"
        # Both are read by the shim.
        env "$variant" timeout -k 10 "$UM_TUNE_TIMEOUT" "$PYTHON" bench/bench.py --start-daemon --only um --repeats 1 \
            --pilot-env "$variant" --out "$OUT/um_tune_part.md" || rc=1
        cat "$OUT/um_tune_part.md" >>"$OUT/um_tune.md" 2>/dev/null
    done
    rm -f "$OUT/um_tune_part.md"
    return "$rc"
}

# shellcheck disable=SC2317  # called from main
environment() {
    echo "repo $REPO, OUT $OUT, PYTHONPATH $PYTHONPATH"
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1
    nvcc --version 2>&1 | tail -n 2
    "$PYTHON" -c 'import sys, setuptools; print("python", sys.version.split()[0], "setuptools", setuptools.__version__)' 2>&1
    return 0
}

# shellcheck disable=SC2317  # called from main
cudnn_all() {  # cuDNN's program natively and under pilot, then PyTorch's convolutions
    local rc=0
    timeout -k 10 180 bash tests/gpu/cudnn_compare.sh --no-install || rc=1
    STEP_TIMEOUT=${STEP_TIMEOUT:-240} timeout -k 10 600 bash tests/gpu/torch_probe.sh --no-install \
        conv train resnet18 || rc=1
    return "$rc"
}

# shellcheck disable=SC2317  # called from main
cublas_all() {
    local rc=0
    timeout -k 10 120 bash tests/gpu/cublas_compare.sh --no-install || rc=1
    if [ -d .realprogs-src/cuda-samples/Common ]; then
        timeout -k 10 300 bash tests/gpu/cublas_samples.sh --no-install || rc=1
    else
        echo "cublas_samples: skipped (the samples' sources were not carried)"
    fi
    timeout -k 10 180 bash bench/blas.sh --no-install || rc=1
    return "$rc"
}

# shellcheck disable=SC2317  # called through stage
# The real-program set when it was carried (hack/build_real_programs.sh); else said and skipped.
real_programs() {
    if [ ! -f "$REPO/.realprogs/manifest.tsv" ]; then
        echo "real: .realprogs not carried (hack/fetch_real_programs.sh, hack/build_real_programs.sh): skipped"
        return 0
    fi
    DEADLINE=${REAL_DEADLINE:-330} PROG_TIMEOUT=${PROG_TIMEOUT:-30} \
        timeout -k 20 $((${REAL_DEADLINE:-330} + 60)) bash tests/gpu/real_programs.sh --no-install
}

main() {
    cd "$REPO" || return 1
    echo "run_all.sh starting $(date -u +%FT%TZ) on $(hostname)"
    environment
    stage wheels install_wheels
    stage install bash tests/gpu/run_compare.sh --install-only
    stage smoke timeout -k 10 "$SMOKE_TIMEOUT" "$PYTHON" tests/gpu/backend_cuda_smoke.py
    stage compare timeout -k 20 "$COMPARE_TIMEOUT" bash tests/gpu/run_compare.sh --no-install
    stage driver timeout -k 10 120 bash tests/gpu/driver_compare.sh --no-install
    stage cublas cublas_all
    stage cudnn cudnn_all
    stage ops timeout -k 10 120 "$PYTHON" tests/gpu/ops_check.py
    stage charge timeout -k 10 180 "$PYTHON" tests/gpu/image_charge_check.py
    stage freeasync timeout -k 10 240 "$PYTHON" tests/gpu/free_async_check.py
    stage faults timeout -k 10 180 "$PYTHON" tests/gpu/fault_check.py
    stage confine timeout -k 10 240 "$PYTHON" tests/gpu/confine_check.py --out "$OUT/confine"
    stage flood timeout -k 10 180 "$PYTHON" tests/gpu/flood_latency.py
    stage graphs timeout -k 10 240 bash tests/gpu/graphs_compare.sh
    stage real real_programs
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
    stage bench timeout -k 20 "$BENCH_TIMEOUT" "$PYTHON" bench/bench.py --start-daemon \
        --out "$OUT/bench.md" --json "$OUT/bench.json" --daemon-log "$OUT/pilotd-bench.log" $BENCH_ARGS

    stage rings timeout -k 10 400 env MODES="on off" bash bench/ring_ab.sh
    stage um_tune um_tune
    stage um_flush timeout -k 10 300 bash bench/um_flush_probe.sh
    stage sched timeout -k 10 180 "$PYTHON" tests/gpu/scheduler_check.py
    stage preempt timeout -k 10 260 "$PYTHON" tests/gpu/preempt_check.py --out "$OUT"
    stage loop_preempt timeout -k 10 240 "$PYTHON" tests/gpu/loop_preempt_check.py --out "$OUT"
    stage policy_preempt timeout -k 10 200 "$PYTHON" tests/gpu/policy_preempt_check.py
    stage priority timeout -k 10 300 "$PYTHON" tests/gpu/priority_check.py
    mkdir -p "$OUT/tally"
    stage tally timeout -k 20 420 "$PYTHON" bench/priority_tally.py --out "$OUT/tally" --python "$PYTHON"
    mkdir -p "$OUT/fig1"
    stage fig1 timeout -k 20 450 "$PYTHON" bench/fig1.py --out "$OUT/fig1" --python "$PYTHON"
    mkdir -p "$OUT/tenants"
    # shellcheck disable=SC2086  # TENANTS_ARGS is a list of words
    stage tenants timeout -k 20 "$TENANTS_TIMEOUT" "$PYTHON" bench/tenants.py --out "$OUT/tenants" \
        --python "$PYTHON" $TENANTS_ARGS
    stage salus timeout -k 20 660 bash tests/gpu/salus_gpu.sh

    printf '\n==================== results\n\n'
    for f in compare.md confine/confine.md real_programs.md bench.md ring_on.md ring_off.md um_tune.md preempt.md loop_preempt.md policy_preempt.md priority.md tally/priority_tally.md fig1/fig1.md tenants/tenants.md salus.md; do
        if [ -f "$OUT/$f" ]; then
            cat "$OUT/$f"
        else
            echo "($f was not written)"
        fi
        echo
    done
    echo "stages:"
    printf '  %s\n' "${STAGES[@]}"
    if [ "$FAILED" = 0 ]; then echo "run_all: every stage passed"; else echo "run_all: SOME STAGE FAILED"; fi
    return "$FAILED"
}

for wanted in "$@"; do
    case "$wanted" in smoke | compare | driver | cublas | cudnn | ops | charge | freeasync | faults | confine | flood | graphs | real | bench | rings | um_tune | um_flush | sched | preempt | loop_preempt | policy_preempt | priority | tally | fig1 | tenants | salus) ;; *)
        echo "run_all.sh: unknown stage '$wanted' (smoke compare driver cublas cudnn ops charge freeasync faults confine flood graphs real bench rings um_tune um_flush sched preempt loop_preempt policy_preempt priority tally fig1 tenants salus)" >&2
        exit 2
    esac
done
main "$@" 2>&1 | tee "$OUT/run_all.log"
exit "${PIPESTATUS[0]}"
