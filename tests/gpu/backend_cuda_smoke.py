#!/usr/bin/env python3
"""Smoke test of CudaBackend on a real GPU, run by hand on the GPU machine (no pytest needed).

    PYTHONPATH=<dir holding the pilot package> python3 tests/gpu/backend_cuda_smoke.py

It compiles a small CUDA program with `nvcc -arch=sm_90 -cudart shared` (as a client of the shim
would be built), takes the fatbin out of the executable's `.nv_fatbin` section, and drives every
backend call against the driver: copies and their synchronization rules, streams, events, module
loading, parameter layouts, packed-argument launches from several threads, error mapping,
host-callback gates (the host function and the wait on pinned memory), launches with attributes,
and with two GPUs peer access and copies. Prints one PASS/FAIL line per check (INFO lines for
measurements) and exits 1 if any check failed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pilot.daemon.backends.base import BackendError, Gate, LaunchAttrs
from pilot.daemon.backends.cuda import CudaBackend
from pilot.daemon.protocol import ffi, lib

SOURCE = r"""
struct S { int a; double b; char c[3]; };

extern "C" __global__ void k(S s, char c, double *out) {
    out[0] = s.a;
    out[1] = s.b;
    out[2] = s.c[0] + 10 * s.c[1] + 100 * s.c[2];
    out[3] = c;
}

extern "C" __global__ void noop() {}

extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}

int main() {
    noop<<<1, 1>>>();
    return (int)cudaDeviceSynchronize();
}
"""

MiB = 1 << 20
failures: list[str] = []


def report(ok: bool, name: str, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(name)


def step(name: str, fn: Callable[[], str | None]) -> None:
    """Run one check; an AssertionError or any exception is a FAIL with its reason."""
    try:
        detail = fn()
    except Exception as exc:  # a smoke test reports every failure and keeps going
        report(False, name, f"{type(exc).__name__}: {exc}")
        traceback.print_exc(limit=3)
        return
    report(True, name, detail or "")


def expect_error(code: int, fn: Callable[[], Any]) -> BackendError:
    try:
        fn()
    except BackendError as exc:
        assert exc.code == code, f"expected cudaError {code}, got {exc}"
        return exc
    raise AssertionError(f"expected cudaError {code}, call succeeded")


# ---- building the image ---------------------------------------------------------------------


def section(elf: bytes, wanted: str) -> bytes:
    """One section of an ELF64 little-endian file, by name, from the section header table."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2, "not an ELF64 file"
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", elf, shoff + i * shentsize
        )
        return name, offset, size

    _, str_off, str_size = header(shstrndx)
    names = elf[str_off : str_off + str_size]
    for i in range(shnum):
        name_off, offset, size = header(i)
        name = names[name_off : names.index(b"\0", name_off)].decode()
        if name == wanted:
            return elf[offset : offset + size]
    raise AssertionError(f"no {wanted} section")


def fatbins(data: bytes) -> list[bytes]:
    """Every fatbin image in a `.nv_fatbin` section. Each starts with u32 magic 0xBA55ED50, u16
    version, u16 header_size, u64 fat_size and spans header_size + fat_size bytes; images follow
    each other 8-byte aligned. nvcc 13 puts an nvlink-made image without kernels first, so the
    kernels are not necessarily in the first one."""
    images, pos = [], 0
    while pos + 16 <= len(data):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:
            assert not any(data[pos : pos + 8]), f"bad fatbin magic {magic:#x} at {pos}"
            pos += 8  # padding
            continue
        images.append(data[pos : pos + header_size + fat_size])
        pos += (header_size + fat_size + 7) & ~7
    assert images, "no fatbin image"
    return images


def build_images(workdir: Path) -> list[bytes]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src, exe = workdir / "smoke.cu", workdir / "smoke"
    src.write_text(SOURCE)
    cmd = [nvcc, "-arch=sm_90", "-cudart", "shared", "-o", str(exe), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return fatbins(section(exe.read_bytes(), ".nv_fatbin"))


def pack_k(a: int, b: float, c: bytes, ch: int, out: int) -> bytes:
    """k's packed parameters: S at 0 (int, pad, double, char[3], pad to 24), char at 24, the
    pointer at 32: 40 bytes."""
    return struct.pack("<i4xd3s5xb7xQ", a, b, c, ch, out)


def spin_cycles(be: CudaBackend) -> int:
    """About 50 ms of clock64 cycles at the GPU's rated clock (attribute 13, kHz)."""
    khz = be.device_info(0).attrs.get(13, 1_500_000)
    return khz * 50


# ---- the checks -----------------------------------------------------------------------------


_GPU_WAIT_PROBE = """
from cuda.bindings import driver as cu
from pilot.daemon.backends.cuda import CudaBackend
be = CudaBackend([0], gpu_wait="{wait}")
err, dev = cu.cuDeviceGet(0)
err, flags, active = cu.cuDevicePrimaryCtxGetState(dev)
print(int(flags) & int(cu.CUctx_flags.CU_CTX_SCHED_MASK), int(active))
"""


def gpu_wait() -> str:
    """`[daemon] gpu_wait` sets the primary context's schedule before the context is made (a
    process of its own: the flags are the process's)."""
    seen = {}
    for wait, flag in (("blocking", 4), ("yield", 2), ("spin", 1)):
        proc = subprocess.run([sys.executable, "-c", _GPU_WAIT_PROBE.format(wait=wait)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.split() == [str(flag), "1"], (wait, proc.stdout)
        seen[wait] = flag
    return ", ".join(f"{w}: CU_CTX_SCHED flag {f}" for w, f in seen.items())


def main() -> int:
    try:
        import cuda.bindings

        version = getattr(cuda.bindings, "__version__", "?")
    except ImportError:
        version = "missing"
    print(f"INFO python {sys.version.split()[0]}, cuda-bindings {version}")

    be = CudaBackend()
    be.bind_thread(0)
    rng = os.urandom
    state: dict[str, Any] = {}

    def device() -> str:
        assert be.device_count() >= 1
        info = be.device_info(0)
        assert info.name and len(info.uuid) == 16 and info.total_mem > 0
        assert info.driver_version >= 13000, info.driver_version
        assert info.attrs[1] == 1024  # cudaDevAttrMaxThreadsPerBlock
        cc = (info.attrs[75], info.attrs[76])  # compute capability major, minor
        free, total = be.mem_get_info(0)
        assert 0 < free <= total and total <= info.total_mem + 64 * MiB
        box: list[Any] = []
        t = threading.Thread(target=lambda: box.append(be.mem_get_info(0)))  # unbound thread
        t.start()
        t.join()
        assert box and box[0][1] == total
        return f"{info.name}, cc {cc}, {len(info.attrs)} attributes, driver {info.driver_version}"

    def copies() -> str:
        n = MiB
        a, b = be.mem_alloc(n), be.mem_alloc(n)
        state["buf"] = a
        s = be.stream_create(1, 0)
        data = rng(n)
        be.memcpy_htod(a, data, n, s)
        out = bytearray(n)
        be.memcpy_dtoh(out, a, n, s)
        assert out == data, "htod/dtoh round trip"
        be.memcpy_htod(b, memoryview(data)[4096:].toreadonly(), n - 4096, s)  # read-only view
        back = mmap.mmap(-1, n)
        be.memcpy_dtoh(memoryview(back)[: n - 4096], b, n - 4096, s)
        assert back[: n - 4096] == data[4096:], "read-only view source, mmap target"
        be.memset_d8(a, 0x15A, n, s)  # the low byte counts, as in cudaMemset
        be.memcpy_dtoh(out, a, n, s)
        assert out == b"\x5a" * n, "memset"
        be.memcpy_dtod(a + 100, b, 1000, s)
        be.memcpy_dtoh(out, a, n, s)
        assert out[100:1100] == data[4096 : 4096 + 1000] and out[:100] == b"\x5a" * 100, "dtod"
        expect_error(1, lambda: be.memcpy_dtoh(b"read-only", a, 4, s))
        expect_error(1, lambda: be.memcpy_htod(a, b"short", 6, s))
        assert be.mem_alloc(0) == 0
        be.mem_free(0)
        be.mem_free(b)
        be.stream_destroy(s)
        return "1 MiB htod/dtoh/memset/dtod"

    def registered() -> str:
        n = 4 * MiB
        shm = mmap.mmap(-1, n)
        base = ctypes.addressof(ctypes.c_char.from_buffer(shm))
        be.host_register(base, n)
        dev = be.mem_alloc(n)
        s = be.stream_create(1, 0)
        try:
            first = rng(n)
            shm[:] = first
            t0 = time.perf_counter()
            be.memcpy_htod(dev, memoryview(shm), n, s)
            dt = time.perf_counter() - t0
            shm[:] = b"\0" * n  # allowed now: memcpy_htod returned, so the source is free
            out = bytearray(n)
            be.memcpy_dtoh(out, dev, n, s)
            assert out == first, "pinned source was overwritten before the DMA read it"
            be.memcpy_dtoh(memoryview(shm), dev, n, s)  # into pinned memory
            assert shm[:] == first
        finally:
            be.host_unregister(base)
            be.mem_free(dev)
            be.stream_destroy(s)
        return f"4 MiB pinned htod in {dt * 1e3:.2f} ms ({n / dt / 1e9:.1f} GB/s incl. sync)"

    def module() -> str:
        with tempfile.TemporaryDirectory() as tmp:
            images = build_images(Path(tmp))
        mod = None
        for image in images:  # every image loads; the one holding k is kept
            candidate = be.module_load(image)
            try:
                be.function_get(candidate, "k")
            except BackendError as exc:
                assert exc.code == 98, exc
                be.module_unload(candidate)
                continue
            assert mod is None, "k in two images"
            mod, size = candidate, len(image)
        assert mod is not None, "no image holds k"
        state["mod"] = mod
        k = be.function_get(mod, "k")
        assert k.params == [(0, 24), (24, 1), (32, 8)], k.params
        assert k.arg_bytes == 40 and k.max_threads_per_block > 0
        assert be.function_get(mod, "noop").params == []
        state["k"], state["noop"] = k, be.function_get(mod, "noop")
        state["spin"] = be.function_get(mod, "spin")
        assert state["spin"].params == [(0, 8)]
        exc = expect_error(98, lambda: be.function_get(mod, "missing"))
        sizes = [len(i) for i in images]
        return f"images {sizes}, k in the {size}-byte one; k params {k.params}; missing -> {exc}"

    def launches() -> str:
        k, out = state["k"], be.mem_alloc(32)
        be.launch(k.handle, (1, 1, 1), (1, 1, 1), 0, None, pack_k(-7, 3.25, b"\1\2\3", 42, out))
        be.stream_synchronize(None)
        got = bytearray(32)
        be.memcpy_dtoh(got, out, 32, None)
        values = struct.unpack("<4d", got)
        assert values == (-7.0, 3.25, 321.0, 42.0), values
        be.launch(state["noop"], (1, 1, 1), (1, 1, 1), 0, None, b"")  # FunctionInfo, no params
        be.stream_synchronize(None)
        expect_error(1, lambda: be.launch(k, (1, 1, 1), (2048, 1, 1), 0, None, bytes(40)))  # CUDA 13
        be.mem_free(out)
        return f"k(S{{-7,3.25,{{1,2,3}}}}, 42, out) -> {values}"

    def threaded_launches() -> str:
        """Each thread reuses its own packed-argument block; results must not mix."""
        k = state["k"]
        outs = [be.mem_alloc(32) for _ in range(4)]
        errors: list[str] = []

        def worker(i: int) -> None:
            try:
                be.bind_thread(0)
                s = be.stream_create(1, 0)
                for j in range(2000):
                    args = pack_k(i * 100000 + j, float(i), bytes([i, i, i]), i, outs[i])
                    be.launch(k.handle, (1, 1, 1), (1, 1, 1), 0, s, args)
                be.stream_synchronize(s)
                be.stream_destroy(s)
            except Exception as exc:  # reported by the main thread
                errors.append(repr(exc))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for i, ptr in enumerate(outs):
            got = bytearray(32)
            be.memcpy_dtoh(got, ptr, 32, None)
            expected = (float(i * 100000 + 1999), float(i), 111.0 * i, float(i))
            assert struct.unpack("<4d", got) == expected, (i, struct.unpack("<4d", got))
            be.mem_free(ptr)
        return "4 threads x 2000 launches"

    def streams_events() -> str:
        s1, s2 = be.stream_create(1, 0), be.stream_create(1, -1)
        start, end, untimed = be.event_create(0), be.event_create(0), be.event_create(2)
        be.event_record(start, s1)
        be.launch(state["spin"], (1, 1, 1), (1, 1, 1), 0, s1, struct.pack("<q", spin_cycles(be)))
        be.event_record(end, s1)
        busy = (be.stream_query(s1), be.event_query(end))
        assert busy == (False, False), f"queries while spinning gave {busy}"
        be.stream_wait_event(s2, end)
        be.event_record(untimed, s2)
        be.event_synchronize(untimed)
        assert be.event_query(end) and be.stream_query(s1), "s2 waited, so s1's work is done"
        ms = be.event_elapsed_ms(start, end)
        assert 5.0 < ms < 5000.0, ms
        expect_error(400, lambda: be.event_elapsed_ms(start, untimed))  # DisableTiming event
        be.stream_synchronize(s2)
        for e in (start, end, untimed):
            be.event_destroy(e)
        be.stream_destroy(s1)
        be.stream_destroy(s2)
        return f"spin took {ms:.1f} ms by events; NOT_READY seen on stream and event"

    def errors() -> str:
        exc = expect_error(2, lambda: be.mem_alloc(1 << 50))
        assert "CUDA_ERROR_OUT_OF_MEMORY" in str(exc), exc
        expect_error(101, lambda: be.bind_thread(be.device_count()))
        return str(exc)

    def launch_rate() -> str | None:
        noop, s = state["noop"].handle, be.stream_create(1, 0)
        for _ in range(1000):
            be.launch(noop, (1, 1, 1), (1, 1, 1), 0, s, b"")
        be.stream_synchronize(s)
        n = 20000
        t0 = time.perf_counter()
        for _ in range(n):
            be.launch(noop, (1, 1, 1), (1, 1, 1), 0, s, b"")
        t1 = time.perf_counter()
        be.stream_synchronize(s)
        args = pack_k(1, 2.0, b"abc", 4, state["buf"])
        k = state["k"].handle
        t2 = time.perf_counter()
        for _ in range(n):
            be.launch(k, (1, 1, 1), (1, 1, 1), 0, s, args)
        t3 = time.perf_counter()
        be.stream_synchronize(s)
        be.stream_destroy(s)
        print(
            f"INFO launch: {(t1 - t0) / n * 1e6:.2f} us/call without params, "
            f"{(t3 - t2) / n * 1e6:.2f} us/call with 40 bytes of params (issue only)"
        )
        return None

    def gates() -> str:
        """A gate as callbacks.py sets one: the host function reports the stream got there, and
        the work queued after it waits until the gate's word is opened from the host."""
        page = mmap.mmap(-1, 4096)
        base = ctypes.addressof(ctypes.c_char.from_buffer(page))
        be.map_host(base, 4096)
        device_address = be.host_device_pointer(base)
        read_fd, write_fd = os.pipe()
        gate = ffi.cast("pilot_gate *", base)
        gate.fd, gate.token, gate.target, gate.wait = write_fd, 77, 1, 0
        s, after = be.stream_create(1, 0), be.event_create(2)
        try:
            be.gate(s, Gate(base, device_address, 1, stream_callback=False))
            be.launch(state["noop"], (1, 1, 1), (1, 1, 1), 0, s, b"")
            be.event_record(after, s)
            import select

            assert select.select([read_fd], [], [], 10)[0], "the host function did not run"
            assert struct.unpack("<Q", os.read(read_fd, 8))[0] == 77
            time.sleep(0.05)
            assert not be.event_query(after), "work after a closed gate ran"
            lib.pilot_gate_open(gate, 1)
            be.event_synchronize(after)
            mode = "cuStreamWaitValue32" if be._wait_value_ok else "a waiting host function"
        finally:
            be.event_destroy(after)
            be.stream_destroy(s)
            os.close(read_fd)
            os.close(write_fd)
        return f"held until opened, with {mode}"

    def pinned_memfd() -> str:
        """What daemon/pinned.py relies on: a MAP_SHARED memfd mapping registered portable and
        device-mapped, copied from and to in stream order, and written by a kernel through its
        device pointer, which a second mapping of the memfd (the client's) sees."""
        n = 4 << 20
        fd = os.memfd_create("pilot-smoke")
        os.ftruncate(fd, n)
        view, other = mmap.mmap(fd, n), mmap.mmap(fd, n)  # the daemon's and the client's
        os.close(fd)
        base = ctypes.addressof(ctypes.c_char.from_buffer(view))
        be.map_host(base, n)
        devptr = be.host_device_pointer(base)
        dev, s = be.mem_alloc(n), be.stream_create(1, 0)
        try:
            other[:n] = bytes(range(256)) * (n // 256)
            be.memcpy_htod_async(dev, base, n, s)
            be.memset_d8(dev, 0x11, 4096, s)
            be.memcpy_dtoh_async(base, dev, n, s)
            be.stream_synchronize(s)
            assert other[:4096] == b"\x11" * 4096 and other[4096:8192] == bytes(range(256)) * 16
            be.memset_d8(devptr, 0x22, 4096, s)  # the device writes the host pages directly
            be.stream_synchronize(s)
            assert other[:4096] == b"\x22" * 4096, "a device write through the device pointer"
        finally:
            be.stream_destroy(s)
            be.mem_free(dev)
            be.host_unregister(base)
        return f"device pointer {'=' if devptr == base else '!='} host address"

    def launch_ex() -> str:
        noop, s = state["noop"], be.stream_create(1, 0)
        be.launch_ex(noop, (4, 1, 1), (32, 1, 1), 0, s, b"", LaunchAttrs(cooperative=True))
        exc = expect_error(720, lambda: be.launch_ex(noop, (10**6, 1, 1), (1024, 1, 1), 0, s, b"",
                                                     LaunchAttrs(cooperative=True)))
        be.launch_ex(noop, (8, 1, 1), (32, 1, 1), 0, s, b"", LaunchAttrs(cluster=(2, 1, 1), cluster_policy=1))
        be.launch_ex(noop, (1, 1, 1), (32, 1, 1), 0, s, b"", LaunchAttrs(priority=-1))
        refused = []
        for grid, cluster in (((15, 1, 1), (2, 1, 1)), ((32, 1, 1), (16, 1, 1))):  # untiled, too big
            try:
                be.launch_ex(noop, grid, (32, 1, 1), 0, s, b"", LaunchAttrs(cluster=cluster))
            except BackendError as err:
                refused.append(err.code)
        assert len(refused) == 2, f"clusters the device cannot run were launched: {refused}"
        be.stream_synchronize(s)
        be.stream_destroy(s)
        return f"cooperative, cluster, priority; too large -> {exc}; bad clusters -> {refused}"

    def peers() -> str | None:
        if be.device_count() < 2:
            print("INFO peers: one GPU, skipped")
            return None
        can = be.can_access_peer(0, 1)
        if can:
            be.enable_peer_access(0, 1)
            be.enable_peer_access(0, 1)  # again: already enabled is fine
        n = 4 * MiB
        a = be.mem_alloc(n)
        be.bind_thread(1)
        b = be.mem_alloc(n)
        s1 = be.stream_create(1, 0)
        data = rng(n)
        be.memcpy_htod(b, data, n, s1)
        be.stream_synchronize(s1)
        be.bind_thread(0)
        s0 = be.stream_create(1, 0)
        be.memcpy_peer(a, 0, b, 1, n, s0)
        out = bytearray(n)
        be.memcpy_dtoh(out, a, n, s0)
        assert out == data, "peer copy"
        be.stream_destroy(s0)
        be.mem_free(a)
        be.bind_thread(1)
        be.stream_destroy(s1)
        be.mem_free(b)
        be.bind_thread(0)
        return f"peer access 0 -> 1: {can}; 4 MiB copied from device 1 to device 0"

    def teardown() -> str | None:
        be.mem_free(state.pop("buf"))
        be.module_unload(state.pop("mod"))
        be.close()
        return None

    for name, fn in [
        ("device", device),
        ("copies", copies),
        ("registered", registered),
        ("module", module),
        ("launches", launches),
        ("threaded_launches", threaded_launches),
        ("streams_events", streams_events),
        ("errors", errors),
        ("launch_rate", launch_rate),
        ("gates", gates),
        ("pinned_memfd", pinned_memfd),
        ("launch_ex", launch_ex),
        ("peers", peers),
        ("teardown", teardown),
        ("gpu_wait", gpu_wait),
    ]:
        step(name, fn)

    print(
        f"{'FAIL' if failures else 'PASS'} backend_cuda_smoke: "
        f"{len(failures)} failed{': ' + ', '.join(failures) if failures else ''}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
