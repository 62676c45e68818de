#!/usr/bin/env python3
"""What the driver does after a context-fatal kernel fault, and what separate contexts cost: the
measurements behind pilotd's fault handling (issue 12) and compute shares (issue 15).

    python3 tests/gpu/fault_probe.py [PROBE...]     (on the GPU machine; needs nvcc, cuda-python)

Probes, each in its own process (a fault poisons the process's context, so they must not share
one); each prints `PROBE name: key=value ...` lines:
  detect      a kernel faults (illegal address) on one stream of the primary context: how soon
              and through which calls the other streams and calls see it (which cheap call can a
              watcher poll), and what the faulting stream's synchronize returns
  reset       after a fault: cuDevicePrimaryCtxReset with and without releasing, the time it takes,
              whether the next retain gives a working context (same handle?), and whether host
              memory registered before the fault is still registered
  isolate     two contexts in one process (cuCtxCreate, and a green context): one faults, does the
              other keep working, and is the primary context untouched
  concurrency two small spinning kernels: on two streams of one context vs in two contexts from two
              threads: concurrent or time-sliced (what isolation costs)
  green       a compute-bound kernel in a green context of ~25% of the SMs vs the whole GPU, alone
              and beside a full-GPU context
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from cuda.bindings import driver as cu

SOURCE = r"""
extern "C" __global__ void fault(int *p) { *(volatile int *)(p + 1000000000LL) = 1; }
extern "C" __global__ void add_one(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
extern "C" __global__ void burn(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    for (int i = 0; i < iters; ++i) { a = a * b + 1e-7f; b = b * a - 1e-7f; }
    if (a == 12345.f) out[0] = b;
}
"""

CUBIN: bytes = b""


def ok(res: Any) -> Any:
    """The value of a cuda-python result tuple; raises on an error."""
    err = res[0] if isinstance(res, tuple) else res
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{err!r}")
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


def code(res: Any) -> int:
    err = res[0] if isinstance(res, tuple) else res
    return int(err)


def emit(probe: str, **kv: Any) -> None:
    print(f"PROBE {probe}: " + " ".join(f"{k}={v}" for k, v in kv.items()), flush=True)


def build(source: str = SOURCE) -> bytes:
    """`source` compiled to an sm_90 cubin (green_probe.py builds its kernels with it too)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.cu")
        with open(src, "w") as f:
            f.write(source)
        nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
        subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-o", f"{tmp}/k.cubin", src], check=True)
        with open(f"{tmp}/k.cubin", "rb") as f:
            return f.read()


class Ctx:
    """A context with the probe's kernels loaded."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        ok(cu.cuCtxSetCurrent(ctx))
        self.mod = ok(cu.cuModuleLoadData(CUBIN))
        self.fn = {n: ok(cu.cuModuleGetFunction(self.mod, n.encode()))
                   for n in ("fault", "add_one", "spin", "burn")}

    def stream(self) -> Any:
        return ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))

    def launch(self, name: str, args: tuple, types: tuple, stream: Any, grid: int = 1,
               block: int = 1) -> int:
        return code(cu.cuLaunchKernel(self.fn[name], grid, 1, 1, block, 1, 1, 0, stream,
                                      (args, types), 0))


def primary(dev: Any) -> Ctx:
    return Ctx(ok(cu.cuDevicePrimaryCtxRetain(dev)))


def check_works(c: Ctx) -> str:
    """Allocate, add one on the GPU, read back: 'ok' or what failed."""
    try:
        ok(cu.cuCtxSetCurrent(c.ctx))
        s = c.stream()
        p = ok(cu.cuMemAlloc(4096))
        ok(cu.cuMemsetD32Async(p, 41, 1024, s))
        r = c.launch("add_one", (p, 1024), (ctypes.c_void_p, ctypes.c_int), s, 4, 256)
        if r:
            return f"launch:{r}"
        buf = (ctypes.c_int * 1024)()
        ok(cu.cuMemcpyDtoHAsync(ctypes.addressof(buf), p, 4096, s))
        ok(cu.cuStreamSynchronize(s))
        ok(cu.cuMemFree(p))
        return "ok" if all(v == 42 for v in buf) else f"wrong:{buf[0]}"
    except RuntimeError as exc:
        return f"err:{exc}"


def probe_detect(dev: Any) -> None:
    c = primary(dev)
    s_fault, s_idle, s_busy = c.stream(), c.stream(), c.stream()
    p = ok(cu.cuMemAlloc(4096))
    ev = ok(cu.cuEventCreate(0))
    ok(cu.cuEventRecord(ev, s_idle))
    ok(cu.cuStreamSynchronize(s_idle))
    c.launch("spin", (2_000_000_000,), (ctypes.c_longlong,), s_busy)  # ~1 s of one SM
    t0 = time.perf_counter()
    r = c.launch("fault", (p,), (ctypes.c_void_p,), s_fault)
    emit("detect", launch_rc=r)
    seen = None
    polls = 0
    while time.perf_counter() - t0 < 5:
        polls += 1
        q = code(cu.cuStreamQuery(s_idle))
        if q != 0:
            seen = (time.perf_counter() - t0, q)
            break
    emit("detect", idle_stream_query_rc=seen[1] if seen else 0,
         detect_ms=f"{seen[0] * 1e3:.3f}" if seen else "none", polls=polls)
    calls = {
        "cuStreamQuery(idle)": lambda: cu.cuStreamQuery(s_idle),
        "cuStreamQuery(busy)": lambda: cu.cuStreamQuery(s_busy),
        "cuEventQuery(done)": lambda: cu.cuEventQuery(ev),
        "cuCtxGetDevice": lambda: cu.cuCtxGetDevice(),
        "cuMemGetInfo": lambda: cu.cuMemGetInfo(),
        "cuCtxGetApiVersion": lambda: cu.cuCtxGetApiVersion(c.ctx),
        "cuCtxGetFlags": lambda: cu.cuCtxGetFlags(),
        "cuMemAlloc": lambda: cu.cuMemAlloc(4096),
        "cuMemAllocManaged": lambda: cu.cuMemAllocManaged(4096, 1),
        "cuStreamCreate": lambda: cu.cuStreamCreate(1),
        "cuMemFree(old)": lambda: cu.cuMemFree(p),
        "cuStreamSynchronize(fault)": lambda: cu.cuStreamSynchronize(s_fault),
        "cuCtxSynchronize": lambda: cu.cuCtxSynchronize(),
        "cuLaunchKernel": lambda: (c.launch("spin", (10,), (ctypes.c_longlong,), s_idle),),
        "cuMemcpyHtoD": lambda: cu.cuMemcpyHtoD(p, bytes(4), 4),
        "cuCtxGetState?": lambda: (getattr(cu, "cuCtxGetId", lambda x: (0, 0))(c.ctx)),
    }
    for name, fn in calls.items():
        t = time.perf_counter()
        try:
            rc = code(fn())
        except Exception as exc:
            rc = f"raised:{type(exc).__name__}"
        emit("detect", call=name, rc=rc, us=f"{(time.perf_counter() - t) * 1e6:.1f}")


def probe_reset(dev: Any) -> None:
    c = primary(dev)
    host = ctypes.create_string_buffer(1 << 16)
    hp = ctypes.addressof(host) & ~4095
    ok(cu.cuMemHostRegister(hp + 4096, 8192, 1 | 2))
    s = c.stream()
    p = ok(cu.cuMemAlloc(4096))
    c.launch("fault", (p,), (ctypes.c_void_p,), s)
    emit("reset", sync_rc=code(cu.cuStreamSynchronize(s)))
    old = int(c.ctx)
    t = time.perf_counter()
    rel = code(cu.cuDevicePrimaryCtxRelease(dev))
    emit("reset", release_rc=rel, release_ms=f"{(time.perf_counter() - t) * 1e3:.2f}")
    t = time.perf_counter()
    rs = code(cu.cuDevicePrimaryCtxReset(dev))
    emit("reset", reset_rc=rs, reset_ms=f"{(time.perf_counter() - t) * 1e3:.2f}")
    t = time.perf_counter()
    c2 = primary(dev)
    emit("reset", retain_load_ms=f"{(time.perf_counter() - t) * 1e3:.2f}",
         same_handle=int(c2.ctx) == old, works=check_works(c2))
    flags = cu.cuMemHostGetFlags(hp + 4096)
    emit("reset", host_registered_after_reset_rc=code(flags))
    # Reset while another thread still has the old context current and calls into it
    c3 = primary(dev)
    s3 = c3.stream()
    c3.launch("fault", (p,), (ctypes.c_void_p,), s3)
    code(cu.cuStreamSynchronize(s3))
    results: list[Any] = []

    def other() -> None:
        ok(cu.cuCtxSetCurrent(c3.ctx))
        time.sleep(0.2)
        results.append(code(cu.cuStreamQuery(s3)))
        results.append(code(cu.cuMemAlloc(4096)))
        results.append(check_works(c3))

    th = threading.Thread(target=other)
    th.start()
    code(cu.cuDevicePrimaryCtxRelease(dev))
    t = time.perf_counter()
    rs = code(cu.cuDevicePrimaryCtxReset(dev))
    emit("reset", reset2_rc=rs, reset2_ms=f"{(time.perf_counter() - t) * 1e3:.2f}")
    th.join()
    emit("reset", old_handle_other_thread=results)


def probe_isolate(dev: Any) -> None:
    pri = primary(dev)
    params = None
    a = Ctx(ok(cu.cuCtxCreate(params, 0, dev)))
    b = Ctx(ok(cu.cuCtxCreate(params, 0, dev)))
    green = None
    try:
        res = ok(cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
        desc = ok(cu.cuDevResourceGenerateDesc([res], 1))
        g = ok(cu.cuGreenCtxCreate(desc, dev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
        green = Ctx(ok(cu.cuCtxFromGreenCtx(g)))
    except Exception as exc:
        emit("isolate", green_error=repr(exc))
    # b runs a long kernel while a faults
    ok(cu.cuCtxSetCurrent(b.ctx))
    sb = b.stream()
    b.launch("spin", (1_000_000_000,), (ctypes.c_longlong,), sb)
    ok(cu.cuCtxSetCurrent(a.ctx))
    sa = a.stream()
    pa = ok(cu.cuMemAlloc(4096))
    a.launch("fault", (pa,), (ctypes.c_void_p,), sa)
    emit("isolate", faulting_sync_rc=code(cu.cuStreamSynchronize(sa)))
    ok(cu.cuCtxSetCurrent(b.ctx))
    emit("isolate", other_ctx_long_kernel_sync_rc=code(cu.cuStreamSynchronize(sb)))
    emit("isolate", other_ctx=check_works(b), primary=check_works(pri),
         green=check_works(green) if green else "n/a")
    t = time.perf_counter()
    emit("isolate", destroy_faulted_rc=code(cu.cuCtxDestroy(a.ctx)),
         destroy_ms=f"{(time.perf_counter() - t) * 1e3:.2f}")
    emit("isolate", primary_after_destroy=check_works(pri))
    # the reverse: a fault in the primary context, does a created context survive?
    c = Ctx(ok(cu.cuCtxCreate(params, 0, dev)))
    ok(cu.cuCtxSetCurrent(pri.ctx))
    sp = pri.stream()
    pp = ok(cu.cuMemAlloc(4096))
    pri.launch("fault", (pp,), (ctypes.c_void_p,), sp)
    emit("isolate", primary_fault_sync_rc=code(cu.cuStreamSynchronize(sp)))
    emit("isolate", created_after_primary_fault=check_works(c),
         green_after_primary_fault=check_works(green) if green else "n/a")


def spin_cycles_for(c: Ctx, ms: float) -> int:
    s = c.stream()
    cycles = 100_000_000
    t = time.perf_counter()
    c.launch("spin", (cycles,), (ctypes.c_longlong,), s)
    ok(cu.cuStreamSynchronize(s))
    per_ms = cycles / ((time.perf_counter() - t) * 1e3)
    return int(per_ms * ms)


def probe_concurrency(dev: Any) -> None:
    c = primary(dev)
    cyc = spin_cycles_for(c, 200)
    s1, s2 = c.stream(), c.stream()
    t = time.perf_counter()
    for s in (s1, s2):
        c.launch("spin", (cyc,), (ctypes.c_longlong,), s, grid=4)
    ok(cu.cuCtxSynchronize())
    one_ctx = (time.perf_counter() - t) * 1e3
    ctxs = [Ctx(ok(cu.cuCtxCreate(None, 0, dev))) for _ in range(2)]
    streams = []
    for x in ctxs:
        ok(cu.cuCtxSetCurrent(x.ctx))
        streams.append(x.stream())
    barrier = threading.Barrier(2)

    def run(i: int) -> None:
        ok(cu.cuCtxSetCurrent(ctxs[i].ctx))
        barrier.wait()
        ctxs[i].launch("spin", (cyc,), (ctypes.c_longlong,), streams[i], grid=4)
        ok(cu.cuStreamSynchronize(streams[i]))

    t = time.perf_counter()
    ths = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    two_ctx = (time.perf_counter() - t) * 1e3
    emit("concurrency", kernel_ms=200, one_context_two_streams_ms=f"{one_ctx:.1f}",
         two_contexts_ms=f"{two_ctx:.1f}")
    # cost of switching the current context per call (what an isolation mode pays per call)
    n = 20000
    t = time.perf_counter()
    for i in range(n):
        ok(cu.cuCtxSetCurrent(ctxs[i & 1].ctx))
    emit("concurrency", ctx_set_current_us=f"{(time.perf_counter() - t) / n * 1e6:.3f}")


def probe_green(dev: Any) -> None:
    pri = primary(dev)
    sm_count = ok(cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    res = ok(cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    want = max(8, round(sm_count * 0.25 / 8) * 8)
    out = cu.cuDevSmResourceSplitByCount(1, res, 0, want)
    emit("green", sm_count=sm_count, want=want, split_rc=code(out))
    groups, _n, remaining = out[1], out[2], out[3]
    part = groups[0] if isinstance(groups, (list, tuple)) else groups
    emit("green", part_sms=part.sm.smCount, remaining_sms=remaining.sm.smCount)
    desc = ok(cu.cuDevResourceGenerateDesc([part], 1))
    g = ok(cu.cuGreenCtxCreate(desc, dev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    gc = Ctx(ok(cu.cuCtxFromGreenCtx(g)))
    gs = ok(cu.cuGreenCtxStreamCreate(g, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
    ok(cu.cuCtxSetCurrent(pri.ctx))
    out_p = ok(cu.cuMemAlloc(4096))
    grid, iters = sm_count * 8, 20000

    def timed(c: Ctx, s: Any) -> float:
        ok(cu.cuCtxSetCurrent(c.ctx))
        c.launch("burn", (out_p, iters), (ctypes.c_void_p, ctypes.c_int), s, grid, 256)
        ok(cu.cuStreamSynchronize(s))
        t = time.perf_counter()
        for _ in range(3):
            c.launch("burn", (out_p, iters), (ctypes.c_void_p, ctypes.c_int), s, grid, 256)
        ok(cu.cuStreamSynchronize(s))
        return (time.perf_counter() - t) / 3 * 1e3

    ps = pri.stream()
    full = timed(pri, ps)
    green_ms = timed(gc, gs)
    emit("green", full_ms=f"{full:.2f}", green_ms=f"{green_ms:.2f}",
         green_share=f"{full / green_ms:.3f}")
    # side by side: green (25%) and the primary context at once, from two threads
    ok(cu.cuCtxSetCurrent(pri.ctx))
    res_ms: dict[str, float] = {}
    barrier = threading.Barrier(2)

    def run(name: str, c: Ctx, s: Any, reps: int) -> None:
        ok(cu.cuCtxSetCurrent(c.ctx))
        barrier.wait()
        t = time.perf_counter()
        for _ in range(reps):
            c.launch("burn", (out_p, iters), (ctypes.c_void_p, ctypes.c_int), s, grid, 256)
        ok(cu.cuStreamSynchronize(s))
        res_ms[name] = (time.perf_counter() - t) / reps * 1e3

    ths = [threading.Thread(target=run, args=("green", gc, gs, 3)),
           threading.Thread(target=run, args=("full", pri, ps, 6))]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    emit("green", together_green_ms=f"{res_ms['green']:.2f}",
         together_full_ms=f"{res_ms['full']:.2f}",
         together_green_share=f"{full / res_ms['green']:.3f}",
         together_full_share=f"{full / res_ms['full']:.3f}")


PROBES = {"detect": probe_detect, "reset": probe_reset, "isolate": probe_isolate,
          "concurrency": probe_concurrency, "green": probe_green}


def main() -> int:
    global CUBIN
    names = sys.argv[1:] or list(PROBES)
    if len(names) == 1 and os.environ.get("FAULT_PROBE_CHILD"):
        with open(os.environ["FAULT_PROBE_CUBIN"], "rb") as f:
            CUBIN = f.read()
        ok(cu.cuInit(0))
        PROBES[names[0]](ok(cu.cuDeviceGet(0)))
        return 0
    cubin = build()
    failed = 0
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        for name in names:
            env = dict(os.environ, FAULT_PROBE_CHILD="1", FAULT_PROBE_CUBIN=f.name)
            try:
                rc = subprocess.run([sys.executable, __file__, name], env=env, timeout=60).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            print(f"PROBE {name}: exit={rc}", flush=True)
            failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
