#!/usr/bin/env python3
"""Green contexts (SM partitions) as pilotd would use them for per-tenant compute shares (issue 15
item 3): what works across the primary context and a green one, what it costs, and what share of
a compute-bound kernel's throughput a partition gives, alone and beside another tenant.

    python3 tests/gpu/green_probe.py        (on the GPU machine; needs nvcc and cuda-python)

pilotd allocates memory, loads modules and creates events in each GPU's primary context; a
capped tenant's streams would be streams of a green context. Each section prints `GREEN name:
key=value ...` lines and is independent of the others (a failure is printed, the rest go on);
everything is also written to $OUT/green_probe.json when OUT is set.

Sections (python3 tests/gpu/green_probe.py [SECTION...]; each in a process of its own, since a
fault is fatal to every context of the process):
  layout      the device's SM resource: count, split granularity, splits into groups of the
              minimum size, combined groups, creation and destruction cost
  kernel_G_M_F  add_one(ptr, n) (a kernel that writes memory) in a whole-GPU stream (G=none), a
              green context of one split group (one) or of four combined groups (four), on
              memory from the primary or the green context (M), its arguments as cuda-python's
              tuple, a void** array, or packed in `extra` as pilotd launches (F); the none cases
              are the control run 3 lacked
  mem_*, fn_*, cukernel_green, events, gates, coop, launch
              the other questions pilotd's design raises (each case's docstring says which)
  share       throughput of a compute-bound kernel (many waves, no memory traffic) for a fixed
              time: alone on the whole GPU, alone in a ~25% partition, alone in the rest; then
              the 25% partition beside the whole GPU, and beside the rest (disjoint partitions)
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as cu
from fault_probe import build, ok
from fault_probe import code as rc  # the same directory: a script's own folder is on sys.path

SOURCE = r"""
extern "C" __global__ void empty() {}
extern "C" __global__ void add_one(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}
extern "C" __global__ void smids(unsigned *out) {
    if (threadIdx.x == 0) {
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        out[blockIdx.x] = s;
    }
    long long t0 = clock64();
    while (clock64() - t0 < 200000) {}
}
extern "C" __global__ void burn(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    for (int i = 0; i < iters; ++i) { a = a * b + 1e-7f; b = b * a - 1e-7f; }
    if (a == 12345.f) out[0] = b;
}
"""

KERNELS = ("empty", "add_one", "smids", "burn")
CUBIN = b""
VP, INT = ctypes.c_void_p, ctypes.c_int


def emit(section: str, **kv: Any) -> None:
    print(f"GREEN {section}: " + " ".join(f"{k}={v}" for k, v in kv.items()), flush=True)


def load(ctx: Any) -> dict[str, Any]:
    ok(cu.cuCtxSetCurrent(ctx))
    mod = ok(cu.cuModuleLoadData(CUBIN))
    return {n: ok(cu.cuModuleGetFunction(mod, n.encode())) for n in KERNELS}


def launch(fn: Any, stream: Any, grid: int, block: int, args: tuple = (), types: tuple = ()) -> int:
    params = (args, types) if args else None
    return rc(cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, 0))


class Dev:
    """The device, its primary context (current by default) and the probe's kernels in it."""

    def __init__(self) -> None:
        ok(cu.cuInit(0))
        self.dev = ok(cu.cuDeviceGet(0))
        self.pri = ok(cu.cuDevicePrimaryCtxRetain(self.dev))
        self.fn = load(self.pri)
        self.sms = ok(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev))
        self.res = ok(cu.cuDeviceGetDevResource(self.dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))

    def current_primary(self) -> None:
        ok(cu.cuCtxSetCurrent(self.pri))

    def stream(self) -> Any:
        return ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))

    def split(self, min_count: int, groups: int) -> tuple[list[Any], Any]:
        out = ok(cu.cuDevSmResourceSplitByCount(groups, self.res, 0, min_count))
        parts, n, rest = out
        parts = list(parts) if isinstance(parts, (list, tuple)) else [parts]
        return parts[:int(n)], rest

    def green(self, resources: list[Any]) -> tuple[Any, Any, Any]:
        """(green ctx, its CUcontext, a non-blocking stream of it)."""
        desc = ok(cu.cuDevResourceGenerateDesc(resources, len(resources)))
        g = ok(cu.cuGreenCtxCreate(desc, self.dev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
        ctx = ok(cu.cuCtxFromGreenCtx(g))
        s = ok(cu.cuGreenCtxStreamCreate(g, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
        self.current_primary()
        return g, ctx, s


def sm_set(d: Dev, fn: Any, stream: Any) -> tuple[int, str]:
    """(launch rc, the distinct SMs the smids kernel ran on, as 'count:min-max'), after a sync."""
    n = d.sms * 4
    buf = ok(cu.cuMemAlloc(4 * n))
    ok(cu.cuMemsetD32(buf, 0xFFFFFFFF, n))
    r = launch(fn, stream, n, 32, (buf,), (VP,))
    if r:
        return r, "-"
    s = rc(cu.cuStreamSynchronize(stream))
    if s:
        return s, "-"
    host = (ctypes.c_uint * n)()
    ok(cu.cuMemcpyDtoH(ctypes.addressof(host), buf, 4 * n))
    ok(cu.cuMemFree(buf))
    seen = {v for v in host if v != 0xFFFFFFFF}
    return 0, f"{len(seen)}:{min(seen)}-{max(seen)}" if seen else "0"


def section_layout(d: Dev) -> None:
    sm = d.res.sm
    emit("layout", device_sms=d.sms, resource_sms=sm.smCount,
         fields=[f for f in dir(sm) if not f.startswith("_")])
    for attr in ("minSmPartitionSize", "smCoscheduledAlignment", "flags"):
        if hasattr(sm, attr):
            emit("layout", **{attr: getattr(sm, attr)})
    for min_count in (1, 2, 4, 6, 8, 16, 33):
        try:
            parts, rest = d.split(min_count, d.sms)
            emit("layout", **{f"split_{min_count}": f"{len(parts)}x{parts[0].sm.smCount}"
                              f"+{rest.sm.smCount}" if parts else f"0+{rest.sm.smCount}"})
        except RuntimeError as exc:
            emit("layout", **{f"split_{min_count}": f"err:{exc}"})
    parts, rest = d.split(8, d.sms // 8)
    t = time.perf_counter()
    _g, ctx, s = d.green(parts[:4])
    create_ms = (time.perf_counter() - t) * 1e3
    emit("layout", combined_4_groups=ok(cu.cuCtxGetDevResource(
        ctx, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount,
        create_ms=f"{create_ms:.2f}", ran_on=sm_set(d, d.fn["smids"], s))
    try:
        _g2, ctx2, s2 = d.green([*parts[4:], rest])
        emit("layout", rest_with_remainder=ok(cu.cuCtxGetDevResource(
            ctx2, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount,
            rest_ran_on=sm_set(d, d.fn["smids"], s2))
    except RuntimeError as exc:
        emit("layout", rest_with_remainder=f"err:{exc}")
    try:
        g3, _ctx3, s3 = d.green(parts[:4])
        emit("layout", same_sms_twice="ok", twice_ran_on=sm_set(d, d.fn["smids"], s3))
    except RuntimeError as exc:
        emit("layout", same_sms_twice=f"err:{exc}")
    try:
        _g4, _ctx4, s4 = d.green([parts[1], parts[3]])
        emit("layout", non_adjacent_groups="ok", nonadj_ran_on=sm_set(d, d.fn["smids"], s4))
    except RuntimeError as exc:
        emit("layout", non_adjacent_groups=f"err:{exc}")
    # dev resource of the primary context after greens exist
    emit("layout", primary_ctx_sms=ok(cu.cuCtxGetDevResource(
        d.pri, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount)
    ok(cu.cuStreamDestroy(s3))
    t = time.perf_counter()
    r = rc(cu.cuGreenCtxDestroy(g3))
    emit("layout", destroy_rc=r, destroy_ms=f"{(time.perf_counter() - t) * 1e3:.2f}")
    t = time.perf_counter()
    n = 20
    for _ in range(n):
        gx, _cx, sx = d.green(parts[:4])
        ok(cu.cuStreamDestroy(sx))
        ok(cu.cuGreenCtxDestroy(gx))
    emit("layout", create_destroy_ms=f"{(time.perf_counter() - t) / n * 1e3:.2f}")
    d.current_primary()


def add_one_check(fn: Any, stream: Any, ptr: int, n: int = 1024) -> str:
    r = launch(fn, stream, (n + 255) // 256, 256, (ptr, n), (VP, INT))
    if r:
        return f"launch:{r}"
    s = rc(cu.cuStreamSynchronize(stream))
    return "ok" if not s else f"sync:{s}"


def read_ints(ptr: int, n: int, stream: Any) -> list[int]:
    host = (ctypes.c_int * n)()
    ok(cu.cuMemcpyDtoHAsync(ctypes.addressof(host), ptr, 4 * n, stream))
    ok(cu.cuStreamSynchronize(stream))
    return list(host)


def host_func(stream: Any) -> dict[str, Any]:
    """cuLaunchHostFunc through ctypes, as pilotd's gates call it."""
    res = cu.cuGetProcAddress(b"cuLaunchHostFunc", 13000,
                              cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT)
    entry = ctypes.CFUNCTYPE(ctypes.c_int, VP, VP, VP)(int(res[1]))
    fired: list[int] = []
    cb = ctypes.CFUNCTYPE(None, VP)(lambda _p: fired.append(1))
    r = entry(int(stream), ctypes.cast(cb, VP).value, None)
    ok(cu.cuStreamSynchronize(stream))
    return {"host_func_rc": r, "host_func_ran": bool(fired)}


def issue_us(fn: Any, stream: Any, n: int, before: Callable[[], Any] | None = None) -> float:
    for _ in range(100):
        launch(fn, stream, 1, 32)
    ok(cu.cuStreamSynchronize(stream))
    t = time.perf_counter()
    for _ in range(n):
        if before is not None:
            before()
        cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, None, 0)
    us = (time.perf_counter() - t) / n * 1e6
    ok(cu.cuStreamSynchronize(stream))
    return us


class Runner:
    """A tenant for the share measurement: a stream, a burn function, and what it achieved."""

    def __init__(self, name: str, fn: Any, stream: Any, ctx: Any) -> None:
        self.name, self.fn, self.stream, self.ctx = name, fn, stream, ctx
        self.rate = 0.0

    def run(self, d: Dev, grid: int, iters: int, out: int, stop: threading.Event,
            start: threading.Barrier) -> None:
        ok(cu.cuCtxSetCurrent(self.ctx))
        events = [ok(cu.cuEventCreate(2)) for _ in range(2)]
        start.wait()
        t0 = time.perf_counter()
        done = 0
        k = 0
        while not stop.is_set():
            launch(self.fn, self.stream, grid, 256, (out, iters), (VP, INT))
            ok(cu.cuEventRecord(events[k & 1], self.stream))
            if k:
                ok(cu.cuEventSynchronize(events[(k - 1) & 1]))
                done += 1
            k += 1
        ok(cu.cuStreamSynchronize(self.stream))
        done += 1 if k else 0
        self.rate = done / (time.perf_counter() - t0)


def rates(d: Dev, runners: list[Runner], grid: int, iters: int, seconds: float) -> dict[str, float]:
    out = ok(cu.cuMemAlloc(4096))
    stop = threading.Event()
    start = threading.Barrier(len(runners) + 1)
    ths = [threading.Thread(target=r.run, args=(d, grid, iters, out, stop, start)) for r in runners]
    for th in ths:
        th.start()
    start.wait()
    time.sleep(seconds)
    stop.set()
    for th in ths:
        th.join()
    d.current_primary()
    ok(cu.cuMemFree(out))
    return {r.name: r.rate for r in runners}


def section_share(d: Dev) -> None:
    parts, rest = d.split(8, d.sms // 8)
    want = max(8, round(d.sms * 0.25 / 8) * 8)  # 25% rounded to the 8-SM granularity
    k = want // 8
    capped = d.green(parts[:k])
    try:
        others = d.green([*parts[k:], rest])
    except RuntimeError:  # the split's remainder cannot be combined: the rest without it
        others = d.green(parts[k:])
    emit("share", capped_sms=want, rest_sms=ok(cu.cuCtxGetDevResource(
        others[1], cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount)
    ps, ps2 = d.stream(), d.stream()
    grid = d.sms * 8 * 16  # 16 full waves on the whole GPU at 8 blocks of 256 per SM
    # calibrate: about 10 ms per kernel on the whole GPU
    iters = 2000
    t = time.perf_counter()
    launch(d.fn["burn"], ps, grid, 256, (0, iters), (VP, INT))
    ok(cu.cuStreamSynchronize(ps))
    launch(d.fn["burn"], ps, grid, 256, (0, iters), (VP, INT))
    t = time.perf_counter()
    launch(d.fn["burn"], ps, grid, 256, (0, iters), (VP, INT))
    ok(cu.cuStreamSynchronize(ps))
    iters = max(100, int(iters * 10e-3 / (time.perf_counter() - t)))
    emit("share", grid=grid, block=256, iters=iters)
    fn = d.fn["burn"]
    secs = 2.0

    # green streams run the module loaded in their own context, with that context current:
    # the combination known to work whatever the functions section finds
    cap_fn, rest_fn = load(capped[1])["burn"], load(others[1])["burn"]
    d.current_primary()

    def cap() -> Runner:
        return Runner("capped", cap_fn, capped[2], capped[1])

    def rest_() -> Runner:
        return Runner("rest", rest_fn, others[2], others[1])

    def alone(r: Runner) -> float:
        return rates(d, [r], grid, iters, secs)[r.name]

    full = alone(Runner("full", fn, ps, d.pri))
    cap_alone = alone(cap())
    rest_alone = alone(rest_())
    emit("share", full_per_s=f"{full:.2f}", capped_alone=f"{cap_alone / full:.3f}",
         rest_alone=f"{rest_alone / full:.3f}")
    both = rates(d, [cap(), Runner("full", fn, ps2, d.pri)],
                 grid, iters, secs)
    emit("share", capped_beside_primary=f"{both['capped'] / full:.3f}",
         primary_beside_capped=f"{both['full'] / full:.3f}")
    both = rates(d, [cap(), rest_()],
                 grid, iters, secs)
    emit("share", capped_beside_rest=f"{both['capped'] / full:.3f}",
         rest_beside_capped=f"{both['rest'] / full:.3f}")
    both = rates(d, [Runner("a", fn, ps, d.pri), Runner("b", fn, ps2, d.pri)], grid, iters, secs)
    emit("share", two_uncapped_primary=f"{both['a'] / full:.3f},{both['b'] / full:.3f}")
    emit("share", full_again=f"{alone(Runner('full', fn, ps, d.pri)) / full:.3f}")


def green4(d: Dev) -> tuple[Any, Any, Any, dict[str, Any]]:
    """A 32-SM green context with the probe's module loaded in it; the primary context current."""
    parts, _ = d.split(8, d.sms // 8)
    g, gctx, gs = d.green(parts[:4])
    gfn = load(gctx)
    d.current_primary()
    return g, gctx, gs, gfn


def case_mem_primary_in_green(d: Dev) -> None:
    """pilotd's memory (primary-context cuMemAlloc, cuMemAllocManaged) used by a kernel of a
    module loaded in a green context, on its stream, with it current."""
    _g, gctx, gs, gfn = green4(d)
    p = ok(cu.cuMemAlloc(4096))
    ok(cu.cuMemsetD32(p, 41, 1024))
    ok(cu.cuCtxSetCurrent(gctx))
    r = add_one_check(gfn["add_one"], gs, p)
    vals = read_ints(p, 4, gs)
    emit("mem_primary_in_green", device=r, values=vals[:2])
    d.current_primary()
    m = ok(cu.cuMemAllocManaged(4096, 1))
    ctypes.memset(m, 0, 4096)
    ok(cu.cuCtxSetCurrent(gctx))
    r = add_one_check(gfn["add_one"], gs, m)
    emit("mem_primary_in_green", managed=r, managed_value=ctypes.c_int.from_address(m).value)


def case_mem_green_on_primary(d: Dev) -> None:
    """Memory allocated with a green context current (what a partitioned session gets), zeroed
    and read on a primary-context stream (what pilotd's teardown and copies do)."""
    _g, gctx, gs, gfn = green4(d)
    ok(cu.cuCtxSetCurrent(gctx))
    p = ok(cu.cuMemAlloc(4096))
    ok(cu.cuMemsetD32Async(p, 41, 1024, gs))
    r = add_one_check(gfn["add_one"], gs, p)
    d.current_primary()
    ps = d.stream()
    vals = read_ints(p, 2, ps)
    ok(cu.cuMemsetD8Async(p, 0, 4096, ps))
    zero = read_ints(p, 2, ps)
    m = None
    ok(cu.cuCtxSetCurrent(gctx))
    m = ok(cu.cuMemAllocManaged(4096, 1))
    d.current_primary()
    ok(cu.cuMemsetD8Async(m, 7, 4096, ps))
    ok(cu.cuStreamSynchronize(ps))
    emit("mem_green_on_primary", kernel=r, read_on_primary=vals, zeroed_on_primary=zero,
         managed_from_green_memset_on_primary=ctypes.c_ubyte.from_address(m).value,
         free_with_primary_current=rc(cu.cuMemFree(p)))


def case_fn_primary_module_green_stream(d: Dev) -> None:
    """A CUfunction of a module loaded in the primary context, on a green stream (the first run
    faulted with 700 this way, with primary memory): now with green-context memory."""
    _g, gctx, gs, _gfn = green4(d)
    ok(cu.cuCtxSetCurrent(gctx))
    p = ok(cu.cuMemAlloc(4096))
    ok(cu.cuMemsetD32(p, 41, 1024))
    d.current_primary()
    emit("fn_primary_module_green_stream", result=add_one_check(d.fn["add_one"], gs, p))


def case_fn_green_module_primary_current(d: Dev) -> None:
    """A green module's CUfunction on its green stream with the primary context current."""
    _g, _gctx, gs, gfn = green4(d)
    emit("fn_green_module_primary_current", smids=sm_set(d, gfn["smids"], gs))


def case_fn_green_all(d: Dev) -> None:
    """Module, stream, current context and memory all the green context's (pilotd's design)."""
    _g, gctx, gs, gfn = green4(d)
    ok(cu.cuCtxSetCurrent(gctx))
    s2 = d.stream()  # cuStreamCreate with the green context current
    emit("fn_green_all", smids=sm_set(d, gfn["smids"], gs),
         streamcreate_smids=sm_set(d, gfn["smids"], s2))
    ok(cu.cuCtxSetCurrent(gctx))
    s3 = ok(cu.cuGreenCtxStreamCreate(_g, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, -5))
    emit("fn_green_all", prio_stream_smids=sm_set(d, gfn["smids"], s3),
         prio=ok(cu.cuStreamGetPriority(s3)))


def case_cukernel_green(d: Dev) -> None:
    """cuLibraryLoadData's CUkernel (context-independent) on a green stream, primary current."""
    _g, _gctx, gs, _gfn = green4(d)
    lib_ = ok(cu.cuLibraryLoadData(CUBIN, None, None, 0, None, None, 0))
    kern = ok(cu.cuLibraryGetKernel(lib_, b"smids"))
    emit("cukernel_green", smids=sm_set(d, cu.CUfunction(int(kern)), gs))


def case_events(d: Dev) -> None:
    """Events across the primary and a green context: record, wait, query, elapsed time."""
    _g, gctx, gs, gfn = green4(d)
    ps = d.stream()
    ev_p = ok(cu.cuEventCreate(0))
    ok(cu.cuCtxSetCurrent(gctx))
    ev_g = ok(cu.cuEventCreate(0))
    ev_g2 = ok(cu.cuEventCreate(0))
    d.current_primary()
    out = {"green_event_on_primary_stream": rc(cu.cuEventRecord(ev_g, ps)),
           "primary_event_on_green_stream": rc(cu.cuEventRecord(ev_p, gs)),
           "green_waits_primary_event": rc(cu.cuStreamWaitEvent(gs, ev_p, 0)),
           "primary_waits_green_event": rc(cu.cuStreamWaitEvent(ps, ev_g, 0))}
    ok(cu.cuCtxSetCurrent(gctx))
    r0 = rc(cu.cuEventRecord(ev_g, gs))
    launch(gfn["burn"], gs, d.sms * 8, 256, (0, 1000), (VP, INT))
    r1 = rc(cu.cuEventRecord(ev_g2, gs))
    d.current_primary()
    out["sync_rc"] = rc(cu.cuEventSynchronize(ev_g2))
    el = cu.cuEventElapsedTime(ev_g, ev_g2)
    out["elapsed"] = f"{r0},{r1},{rc(el)}:{el[1] if not rc(el) else '-'}"
    out["query_green_event_primary_current"] = rc(cu.cuEventQuery(ev_g2))
    out["stream_query_green"] = rc(cu.cuStreamQuery(gs))
    emit("events", **out)


def case_gates(d: Dev) -> None:
    """pilotd's host-callback gates on a green stream: host memory registered (portable,
    mapped) in the primary context, cuStreamWaitValue32 on it, cuLaunchHostFunc."""
    _g, gctx, gs, _gfn = green4(d)
    buf = ctypes.create_string_buffer(8192)
    base = (ctypes.addressof(buf) + 4095) & ~4095
    ok(cu.cuMemHostRegister(base, 4096, 1 | 2))
    dptr = ok(cu.cuMemHostGetDevicePointer(base, 0))
    ok(cu.cuCtxSetCurrent(gctx))
    r = rc(cu.cuStreamWaitValue32(gs, dptr, 1, cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ))
    time.sleep(0.05)
    held = rc(cu.cuStreamQuery(gs))
    ctypes.c_uint32.from_address(base).value = 1
    emit("gates", wait_value_rc=r, held_rc=held, released_rc=rc(cu.cuStreamSynchronize(gs)))
    emit("gates", **host_func(gs))
    t = time.perf_counter()
    ctypes.memmove(base, bytes(range(16)), 16)
    q = ok(cu.cuMemAlloc(64))
    ok(cu.cuMemcpyHtoDAsync(q, base, 16, gs))
    emit("gates", pinned_htod_on_green=read_ints(q, 1, gs)[0] == 0x03020100,
         us=f"{(time.perf_counter() - t) * 1e6:.1f}")


def case_coop(d: Dev) -> None:
    """A cooperative grid larger than the partition holds at once."""
    _g, gctx, gs, gfn = green4(d)
    ok(cu.cuCtxSetCurrent(gctx))
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    attr.value.cooperative = 1
    for grid in (32, 33, d.sms):
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 1024, 1, 1
        cfg.hStream = gs
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        emit("coop", **{f"grid_{grid}x1024": rc(cu.cuLaunchKernelEx(cfg, gfn["empty"], None, 0))})
        ok(cu.cuStreamSynchronize(gs))
    emit("coop", occupancy_1024=ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        gfn["empty"], 1024, 0)))


def case_launch(d: Dev) -> None:
    _g, gctx, gs, gfn = green4(d)
    ps = d.stream()
    n = 20000
    out = {}
    for rep in range(2):
        out[f"primary_{rep}"] = issue_us(d.fn["empty"], ps, n)
        ok(cu.cuCtxSetCurrent(gctx))
        out[f"green_{rep}"] = issue_us(gfn["empty"], gs, n)
        out[f"green_setcurrent_each_{rep}"] = issue_us(
            gfn["empty"], gs, n, lambda: cu.cuCtxSetCurrent(gctx))
        d.current_primary()
    emit("launch", **{k: f"{v:.2f}" for k, v in out.items()})
    t = time.perf_counter()
    for i in range(n):
        cu.cuCtxSetCurrent(gctx if i & 1 else d.pri)
    emit("launch", ctx_set_current_us=f"{(time.perf_counter() - t) / n * 1e6:.2f}")


# ---- which kernels that touch memory run in a green context (run 3 had no control case) ----

def launch_args(fn: Any, stream: Any, ptr: int, n: int, form: str) -> int:
    """add_one(ptr, n) with its arguments passed as cuda-python's (values, types) tuple, as a
    void** array (the driver's own form), or packed in `extra` (pilot's launch path)."""
    grid = (n + 255) // 256
    if form == "tuple":
        return launch(fn, stream, grid, 256, (ptr, n), (VP, INT))
    if form == "voidpp":
        a0, a1 = VP(int(ptr)), INT(n)
        params = (VP * 2)(ctypes.addressof(a0), ctypes.addressof(a1))
        return rc(cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, params, 0))
    buf = int(ptr).to_bytes(8, "little") + n.to_bytes(4, "little")  # offsets 0 and 8
    size = ctypes.c_size_t(len(buf))
    keep = ctypes.create_string_buffer(buf, len(buf))
    extra = (VP * 5)(1, ctypes.addressof(keep), 2, ctypes.addressof(size), 0)
    return rc(cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, None, ctypes.addressof(extra)))


def arrangement(d: Dev, green: str, memory: str, form: str) -> str:
    """add_one on 1024 ints set to 41, in a 32-SM green context made of one split group
    ("one") or four combined ones ("four"), or on a whole-GPU stream ("none"); memory from the
    primary or the green context; 'ok' when every int became 42."""
    if green == "none":
        ctx, stream, fn = d.pri, d.stream(), d.fn["add_one"]
    else:
        if green == "one":
            parts, _rest = d.split(32, 1)
            _g, ctx, stream = d.green(parts[:1])
        else:
            parts, _rest = d.split(8, d.sms // 8)
            _g, ctx, stream = d.green(parts[:4])
        fn = load(ctx)["add_one"]
    ok(cu.cuCtxSetCurrent(ctx if memory == "green" else d.pri))
    p = ok(cu.cuMemAlloc(4096))
    ok(cu.cuMemsetD32(p, 41, 1024))
    ok(cu.cuCtxSetCurrent(ctx))
    r = launch_args(fn, stream, p, 1024, form)
    if r:
        return f"launch:{r}"
    s = rc(cu.cuStreamSynchronize(stream))
    if s:
        return f"sync:{s}"
    vals = read_ints(p, 1024, stream)
    return "ok" if all(v == 42 for v in vals) else f"wrong:{vals[0]}"


def arrangement_case(green: str, memory: str, form: str) -> Callable[[Dev], None]:
    def case(d: Dev) -> None:
        emit(f"kernel_{green}_{memory}_{form}", result=arrangement(d, green, memory, form))
    return case


ARRANGEMENTS = {f"kernel_{g}_{m}_{f}": arrangement_case(g, m, f)
                for g, m, f in (("none", "primary", "tuple"), ("none", "primary", "voidpp"),
                                ("none", "primary", "packed"), ("one", "green", "voidpp"),
                                ("one", "green", "tuple"), ("one", "primary", "voidpp"),
                                ("four", "green", "voidpp"), ("four", "green", "packed"),
                                ("four", "primary", "packed"), ("one", "primary", "packed"))}


SECTIONS: dict[str, Callable[[Dev], None]] = {
    "layout": section_layout, "mem_primary_in_green": case_mem_primary_in_green,
    "mem_green_on_primary": case_mem_green_on_primary,
    "fn_primary_module_green_stream": case_fn_primary_module_green_stream,
    "fn_green_module_primary_current": case_fn_green_module_primary_current,
    "fn_green_all": case_fn_green_all, "cukernel_green": case_cukernel_green,
    "events": case_events, "gates": case_gates, "coop": case_coop, "launch": case_launch,
    "share": section_share, **ARRANGEMENTS}


def child(name: str) -> int:
    """One section in this process (a fault is fatal to every context of the process)."""
    global CUBIN
    with open(os.environ["GREEN_PROBE_CUBIN"], "rb") as f:
        CUBIN = f.read()
    d = Dev()
    t = time.perf_counter()
    try:
        SECTIONS[name](d)
    except Exception:
        emit(name, error=traceback.format_exc().replace("\n", " | "))
        return 1
    finally:
        emit(name, section_s=f"{time.perf_counter() - t:.1f}")
    return 0


def main() -> int:
    if os.environ.get("GREEN_PROBE_CUBIN"):
        return child(sys.argv[1])
    cubin = build(SOURCE)
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    emit("device", name=ok(cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode(),
         driver=ok(cu.cuDriverGetVersion()), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    failed = 0
    lines: list[str] = []
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        for name in sys.argv[1:] or list(SECTIONS):
            env = dict(os.environ, GREEN_PROBE_CUBIN=f.name)
            try:
                run = subprocess.run([sys.executable, __file__, name], env=env, timeout=30,
                                     capture_output=True, text=True)
                code = str(run.returncode)
                out = run.stdout + run.stderr[-2000:]
            except subprocess.TimeoutExpired as exc:
                code, out = "timeout", str(exc.stdout or "")
            print(out, end="", flush=True)
            print(f"GREEN {name}: exit={code}", flush=True)
            lines.append(out + f"GREEN {name}: exit={code}\n")
            failed += code != "0"
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "green_probe.txt"), "w") as fh:
            fh.write("".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
