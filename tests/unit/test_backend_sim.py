"""SimBackend and the sim kernel registry, with a real nvcc-compiled image."""

from __future__ import annotations

import array
import logging
import struct
import threading
from pathlib import Path

import pytest

from pilot.daemon import sim_kernels
from pilot.daemon.backends import sim as backend_sim
from pilot.daemon.backends.base import (
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_SYMBOL,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_LAUNCH_FAILURE,
    CUDA_ERROR_MEMORY_ALLOCATION,
    STICKY_ERRORS,
    Backend,
    BackendError,
    LaunchAttrs,
)
from pilot.daemon.backends.fatbin import kernels_in_image
from pilot.daemon.backends.sim import SIM_BASE_ADDRESS, SimBackend
from pilot.daemon.sim_kernels import KernelRegistry, SimLaunch, load_kernel_file

MiB = 1024 * 1024
VADD = "_Z4vaddPKfS0_Pfi"
SOURCE = r"""
__global__ void vadd(const float *a, const float *b, float *c, int n)
{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) c[i] = a[i] + b[i]; }
struct P { char tag; double scale; };
__global__ void scale(P p, short s, double *out) { *out = p.scale * s + p.tag; }
__global__ void __launch_bounds__(256) bounded(int *p) { *p = 1; }
__global__ void orphan(int *p) { *p = 2; }
int main() { return 0; }
"""


def _code(exc: pytest.ExceptionInfo[BackendError]) -> int:
    return exc.value.code


@pytest.fixture()
def kernels() -> KernelRegistry:
    reg = KernelRegistry()

    @reg.kernel(VADD)
    def vadd(k: SimLaunch) -> None:
        a, b, c, n = k.ptr(0), k.ptr(1), k.ptr(2), k.i32(3)
        threads = k.grid[0] * k.block[0]
        m = min(n, threads)
        va, vb = k.view(a, 4 * m).cast("f"), k.view(b, 4 * m).cast("f")
        k.write(c, array.array("f", (va[i] + vb[i] for i in range(m))).tobytes())

    @reg.kernel("_Z5scale1PsPd")
    def scale(k: SimLaunch) -> None:
        tag, scale_ = k.arg(0, "<b7xd")
        k.write(k.ptr(2), struct.pack("<d", scale_ * k.i16(1) + tag))

    @reg.kernel("_Z7boundedPi")
    def bounded(k: SimLaunch) -> None:
        k.write(k.ptr(0), struct.pack("<i", 1))

    return reg


@pytest.fixture()
def sim(kernels: KernelRegistry) -> SimBackend:
    return SimBackend(kernels, device_count=2, total_mem=4 * MiB)


@pytest.fixture(scope="module")
def image(compile_cuda) -> bytes:
    [img] = [i for i in compile_cuda(SOURCE) if kernels_in_image(i)]
    return img


def test_is_a_backend(sim: SimBackend) -> None:
    backend: Backend = sim  # checked by type checkers; here just the name
    assert backend.name == "sim" and sim.device_count() == 2


# ---- memory ---------------------------------------------------------------------------------

def test_alloc_addresses(sim: SimBackend) -> None:
    ptrs = [sim.mem_alloc(n) for n in (1, 512, 513, 4096)]
    assert all(p >= SIM_BASE_ADDRESS and p % 512 == 0 for p in ptrs)
    assert ptrs == sorted(set(ptrs))
    sim.mem_free(ptrs[0])
    assert sim.mem_alloc(2) not in ptrs  # a freed address goes only to the same size


def test_a_freed_block_goes_to_the_next_allocation_of_its_size_as_it_was(sim: SimBackend) -> None:
    # As CUDA's allocator does: what must not leak between tenants, pilotd clears.
    a = sim.mem_alloc(4096)
    sim.memcpy_htod(a, b"\xa5" * 4096, 4096, None)
    sim.mem_free(a)
    b = sim.mem_alloc(4096)
    out = bytearray(4096)
    sim.memcpy_dtoh(out, b, 4096, None)
    assert b == a and out == b"\xa5" * 4096
    managed = sim.mem_alloc_managed(4096, 1)
    sim.mem_free(managed)
    assert sim.mem_alloc(4096) != managed  # managed memory is never recycled (the driver zeroes it)


def test_alloc_zero_and_free_null(sim: SimBackend) -> None:
    assert sim.mem_alloc(0) == 0
    sim.mem_free(0)


def test_copy_roundtrip(sim: SimBackend) -> None:
    a, b = sim.mem_alloc(1000), sim.mem_alloc(1000)
    data = bytes(range(256)) * 3 + bytes(232)
    sim.memcpy_htod(a, data, 1000, None)
    sim.memcpy_dtod(b + 10, a, 990, None)
    out = bytearray(1000)
    sim.memcpy_dtoh(out, b, 1000, None)
    assert out == bytes(10) + data[:990]
    sim.memset_d8(b + 1, 0x1AB, 3, None)  # only the low byte counts
    small = bytearray(6)
    sim.memcpy_dtoh(small, b, 6, None)
    assert small == bytes(1) + b"\xab\xab\xab" + bytes(2)


def test_overlapping_dtod(sim: SimBackend) -> None:
    a = sim.mem_alloc(16)
    sim.memcpy_htod(a, bytes(range(16)), 16, None)
    sim.memcpy_dtod(a + 4, a, 8, None)
    out = bytearray(16)
    sim.memcpy_dtoh(out, a, 16, None)
    assert out == bytes([0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15])


def test_new_memory_reads_zero_even_large(sim: SimBackend) -> None:
    p = sim.mem_alloc(2 * MiB)  # mmap-backed
    out = bytearray(b"x" * 64)
    sim.memcpy_dtoh(out, p + MiB, 64, None)
    assert out == bytes(64)
    sim.memset_d8(p, 7, 2 * MiB, None)
    sim.memcpy_dtoh(out, p + 2 * MiB - 64, 64, None)
    assert out == bytes([7]) * 64


@pytest.mark.parametrize("offset,count", [(0, 101), (100, 1), (-1, 2), (50, 60), (612, 1)])
def test_out_of_bounds_copies(sim: SimBackend, offset: int, count: int) -> None:
    a = sim.mem_alloc(100)
    sim.mem_alloc(100)  # a neighbour: ranges must not run into it
    buf = bytearray(count)
    for call in (lambda: sim.memcpy_htod(a + offset, buf, count, None),
                 lambda: sim.memcpy_dtoh(buf, a + offset, count, None),
                 lambda: sim.memcpy_dtod(a + offset, a, count, None),
                 lambda: sim.memset_d8(a + offset, 0, count, None)):
        with pytest.raises(BackendError) as exc:
            call()
        assert _code(exc) == CUDA_ERROR_INVALID_VALUE


def test_host_buffer_checks(sim: SimBackend) -> None:
    a = sim.mem_alloc(64)
    with pytest.raises(BackendError) as exc:
        sim.memcpy_htod(a, b"short", 6, None)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    with pytest.raises(BackendError) as exc:
        sim.memcpy_dtoh(b"read-only", a, 4, None)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    sim.memcpy_htod(0xDEAD, b"", 0, None)  # zero bytes: nothing to check


def test_use_after_free_and_double_free(sim: SimBackend) -> None:
    a = sim.mem_alloc(64)
    sim.mem_free(a)
    with pytest.raises(BackendError) as exc:
        sim.memcpy_htod(a, bytes(4), 4, None)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    with pytest.raises(BackendError) as exc:
        sim.mem_free(a)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE


def test_free_of_interior_pointer(sim: SimBackend) -> None:
    a = sim.mem_alloc(1024)
    with pytest.raises(BackendError) as exc:
        sim.mem_free(a + 512)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    sim.mem_free(a)


def test_capacity(sim: SimBackend) -> None:
    assert sim.mem_get_info(0) == (4 * MiB, 4 * MiB)
    a = sim.mem_alloc(MiB + 1)  # charged in 512-byte units
    assert sim.mem_get_info(0) == (3 * MiB - 512, 4 * MiB)
    with pytest.raises(BackendError) as exc:
        sim.mem_alloc(3 * MiB)
    assert _code(exc) == CUDA_ERROR_MEMORY_ALLOCATION
    sim.mem_free(a)
    sim.mem_free(sim.mem_alloc(4 * MiB))
    assert sim.mem_get_info(0) == (4 * MiB, 4 * MiB)


def test_devices_have_their_own_capacity(sim: SimBackend) -> None:
    result: list[int] = []
    t = threading.Thread(target=lambda: (sim.bind_thread(1), result.append(sim.mem_alloc(MiB))))
    t.start()
    t.join()
    assert sim.mem_get_info(1)[0] == 3 * MiB and sim.mem_get_info(0)[0] == 4 * MiB
    sim.mem_free(result[0])  # one address space: any thread frees any pointer
    with pytest.raises(BackendError) as exc:
        sim.bind_thread(2)
    assert _code(exc) == CUDA_ERROR_INVALID_DEVICE


def test_device_info(sim: SimBackend) -> None:
    info0, info1 = sim.device_info(0), sim.device_info(1)
    assert info0.name == "pilot simulated GPU (H100-like)" and info0.total_mem == 4 * MiB
    assert (info0.attrs[75], info0.attrs[76], info0.attrs[16]) == (9, 0, 132)
    assert len(info0.uuid) == 16 and info0.uuid != info1.uuid
    with pytest.raises(BackendError):
        sim.device_info(2)


def test_concurrent_threads(sim: SimBackend) -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(200):
                p = sim.mem_alloc(256)
                payload = bytes([(seed + i) % 256]) * 256
                sim.memcpy_htod(p, payload, 256, None)
                out = bytearray(256)
                sim.memcpy_dtoh(out, p, 256, None)
                assert out == payload
                sim.mem_free(p)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sim.mem_get_info(0)[0] == 4 * MiB


# ---- streams and events -------------------------------------------------------------------

def test_streams(sim: SimBackend) -> None:
    s = sim.stream_create(1, 0)
    assert sim.stream_query(s) and sim.stream_query(None)
    sim.stream_synchronize(s)
    sim.stream_destroy(s)
    for call in (lambda: sim.stream_query(s), lambda: sim.stream_destroy(s),
                 lambda: sim.memset_d8(sim.mem_alloc(8), 0, 8, s)):
        with pytest.raises(BackendError) as exc:
            call()
        assert _code(exc) == CUDA_ERROR_INVALID_RESOURCE_HANDLE
    with pytest.raises(BackendError) as exc:
        sim.stream_create(0x10, 0)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE


def test_event_elapsed(sim: SimBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([1_000_000, 3_500_000])
    monkeypatch.setattr(backend_sim.time, "perf_counter_ns", lambda: next(clock))
    start, end = sim.event_create(0), sim.event_create(1)
    sim.event_record(start, None)
    sim.event_record(end, sim.stream_create(0, 0))
    assert sim.event_query(end)
    sim.event_synchronize(end)
    assert sim.event_elapsed_ms(start, end) == pytest.approx(2.5)


def test_event_elapsed_errors(sim: SimBackend) -> None:
    timed, untimed, unrecorded = sim.event_create(0), sim.event_create(2), sim.event_create(0)
    for ev in (timed, untimed):
        sim.event_record(ev, None)
    for a, b in ((timed, untimed), (untimed, timed), (timed, unrecorded), (unrecorded, timed)):
        with pytest.raises(BackendError) as exc:
            sim.event_elapsed_ms(a, b)
        assert _code(exc) == CUDA_ERROR_INVALID_RESOURCE_HANDLE
    sim.event_destroy(timed)
    with pytest.raises(BackendError) as exc:
        sim.event_record(timed, None)
    assert _code(exc) == CUDA_ERROR_INVALID_RESOURCE_HANDLE
    with pytest.raises(BackendError) as exc:
        sim.event_create(4)  # interprocess needs disable-timing
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE


# ---- execution ----------------------------------------------------------------------------

def _vadd_setup(sim: SimBackend, n: int) -> tuple[int, int, int, array.array, array.array]:
    a_host = array.array("f", (i * 0.5 for i in range(n)))
    b_host = array.array("f", (1000.25 - i for i in range(n)))
    a, b, c = (sim.mem_alloc(4 * n) for _ in range(3))
    sim.memcpy_htod(a, a_host, 4 * n, None)
    sim.memcpy_htod(b, b_host, 4 * n, None)
    return a, b, c, a_host, b_host


def test_vector_add(sim: SimBackend, image: bytes) -> None:
    n = 1000
    a, b, c, a_host, b_host = _vadd_setup(sim, n)
    fn = sim.function_get(sim.module_load(image), VADD)
    assert fn.params == [(0, 8), (8, 8), (16, 8), (24, 4)] and fn.arg_bytes == 28
    assert (fn.max_threads_per_block, fn.max_dynamic_shared_bytes) == (1024, 48 * 1024)
    sim.launch(fn.handle, (4, 1, 1), (256, 1, 1), 0, None, struct.pack("<QQQi", a, b, c, n))
    out = array.array("f", bytes(4 * n))
    sim.memcpy_dtoh(out, c, 4 * n, None)
    assert list(out) == [x + y for x, y in zip(a_host, b_host, strict=True)]


def test_launch_uses_grid(sim: SimBackend, image: bytes) -> None:
    n = 1000
    a, b, c, a_host, b_host = _vadd_setup(sim, n)
    fn = sim.function_get(sim.module_load(image), VADD)
    sim.launch(fn.handle, (2, 1, 1), (256, 1, 1), 0, None, struct.pack("<QQQi", a, b, c, n))
    out = array.array("f", bytes(4 * n))
    sim.memcpy_dtoh(out, c, 4 * n, None)
    assert out[511] == a_host[511] + b_host[511] and out[512] == 0.0


def test_struct_params_cut_by_layout(sim: SimBackend, image: bytes) -> None:
    fn = sim.function_get(sim.module_load(image), "_Z5scale1PsPd")
    assert fn.params == [(0, 16), (16, 2), (24, 8)]
    out = sim.mem_alloc(8)
    args = struct.pack("<b7xdh6xQ", -3, 1.5, 4, out)
    sim.launch(fn.handle, (1, 1, 1), (1, 1, 1), 0, None, args)
    result = bytearray(8)
    sim.memcpy_dtoh(result, out, 8, None)
    assert struct.unpack("<d", result)[0] == 1.5 * 4 - 3
    with pytest.raises(BackendError) as exc:
        sim.launch(fn.handle, (1, 1, 1), (1, 1, 1), 0, None, args[:31])
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE


@pytest.mark.parametrize("grid,block,shared", [
    ((1, 1, 1), (1025, 1, 1), 0), ((1, 1, 1), (1, 1, 65), 0), ((1, 1, 1), (32, 32, 2), 0),
    ((0, 1, 1), (1, 1, 1), 0), ((1, 1, 1), (1, 0, 1), 0), ((2**31, 1, 1), (1, 1, 1), 0),
    ((1, 65536, 1), (1, 1, 1), 0), ((1, 1, 65536), (1, 1, 1), 0),
    ((1, 1, 1), (1, 1, 1), 48 * 1024 + 1), ((1, 1, 1), (1, 1, 1), -1),
])
def test_invalid_configuration(sim: SimBackend, image: bytes, grid, block, shared) -> None:
    fn = sim.function_get(sim.module_load(image), VADD)
    with pytest.raises(BackendError) as exc:
        sim.launch(fn.handle, grid, block, shared, None, bytes(28))
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE  # CUDA 13 says so natively


def test_limits_that_are_fine(sim: SimBackend, image: bytes) -> None:
    fn = sim.function_get(sim.module_load(image), VADD)
    for grid, block in (((2**31 - 1, 65535, 65535), (1024, 1, 1)), ((1, 1, 1), (1, 16, 64))):
        sim.launch(fn.handle, grid, block, 48 * 1024, None, struct.pack("<QQQi", 0, 0, 0, 0))


def test_launch_bounds(sim: SimBackend, image: bytes) -> None:
    fn = sim.function_get(sim.module_load(image), "_Z7boundedPi")
    assert fn.max_threads_per_block == 256
    p = sim.mem_alloc(4)
    sim.launch(fn.handle, (1, 1, 1), (256, 1, 1), 0, None, struct.pack("<Q", p))
    with pytest.raises(BackendError) as exc:
        sim.launch(fn.handle, (1, 1, 1), (512, 1, 1), 0, None, struct.pack("<Q", p))
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE  # CUDA 13 natively, H100


def test_kernel_without_emulation(sim: SimBackend, image: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """It fails as CUDA's invalid device function, and pilotd says once, at warning level (the
    program sees the error later, without the name), which kernel it was."""
    fn = sim.function_get(sim.module_load(image), "_Z6orphanPi")
    for _ in range(3):
        with pytest.raises(BackendError, match="_Z6orphanPi") as exc:
            sim.launch(fn.handle, (1, 1, 1), (1, 1, 1), 0, None, bytes(8))
        assert _code(exc) == sim_kernels.CUDA_ERROR_INVALID_DEVICE_FUNCTION == 98
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "_Z6orphanPi" in r.getMessage()]
    assert len(warned) == 1 and "has no emulation" in warned[0].getMessage()
    assert "--sim-kernels" in warned[0].getMessage()


def test_function_not_in_image(sim: SimBackend, image: bytes) -> None:
    with pytest.raises(BackendError) as exc:
        sim.function_get(sim.module_load(image), "_Z7missingv")
    assert _code(exc) == 98


def test_emulation_crash_is_sticky_launch_failure(
        sim: SimBackend, kernels: KernelRegistry, image: bytes,
        caplog: pytest.LogCaptureFixture) -> None:
    @kernels.kernel("_Z6orphanPi")
    def orphan(k: SimLaunch) -> None:
        raise ZeroDivisionError("emulation bug")

    fn = sim.function_get(sim.module_load(image), "_Z6orphanPi")
    with caplog.at_level(logging.ERROR, logger="pilot.daemon.sim_kernels"):
        sim.launch(fn.handle, (1, 1, 1), (1, 1, 1), 0, None, bytes(8))  # reported later, as on the GPU
    with pytest.raises(BackendError) as exc:
        sim.stream_synchronize(None)
    assert _code(exc) == CUDA_ERROR_LAUNCH_FAILURE and exc.value.code in STICKY_ERRORS
    assert "ZeroDivisionError" in caplog.text and "_Z6orphanPi" in caplog.text


def test_kernel_fault_corrupts_every_later_call(sim: SimBackend, image: bytes) -> None:
    """As on the H100 (tests/gpu/fault_probe.py): a kernel that faults makes every later call of
    the process fail with the fault's error, allocations and new streams included; device
    queries still answer, and context_error() reports it."""
    fn = sim.function_get(sim.module_load(image), VADD)
    a = sim.mem_alloc(16)
    other = sim.stream_create(1, 0)
    assert sim.context_error(0) == 0
    sim.mem_free(a)
    sim.launch(fn.handle, (1, 1, 1), (4, 1, 1), 0, None, struct.pack("<QQQi", a, a, a, 4))
    assert sim.context_error(0) == CUDA_ERROR_ILLEGAL_ADDRESS
    for call in (lambda: sim.stream_synchronize(None), lambda: sim.stream_query(other),
                 lambda: sim.mem_alloc(16), lambda: sim.stream_create(1, 0),
                 lambda: sim.mem_get_info(0), lambda: sim.module_load(image)):
        with pytest.raises(BackendError) as exc:
            call()
        assert _code(exc) == CUDA_ERROR_ILLEGAL_ADDRESS
    assert sim.device_count() >= 1 and sim.device_info(0).name


def test_emulation_out_of_bounds_is_illegal_address(sim: SimBackend, image: bytes) -> None:
    fn = sim.function_get(sim.module_load(image), VADD)
    a = sim.mem_alloc(16)
    sim.mem_free(a)
    sim.launch(fn.handle, (1, 1, 1), (4, 1, 1), 0, None, struct.pack("<QQQi", a, a, a, 4))
    with pytest.raises(BackendError) as exc:  # the kernel read a freed buffer
        sim.stream_synchronize(None)
    assert _code(exc) == CUDA_ERROR_ILLEGAL_ADDRESS


def test_bad_images_and_modules(sim: SimBackend, image: bytes) -> None:
    for bad in (b"", b"not a fatbin", image[: len(image) // 2]):
        with pytest.raises(BackendError) as exc:
            sim.module_load(bad)
        assert _code(exc) == CUDA_ERROR_INVALID_IMAGE
    module = sim.module_load(image)
    fn = sim.function_get(module, VADD)
    sim.module_unload(module)
    for call in (lambda: sim.function_get(module, VADD), lambda: sim.module_unload(module),
                 lambda: sim.launch(fn.handle, (1, 1, 1), (1, 1, 1), 0, None, bytes(28))):
        with pytest.raises(BackendError) as exc:
            call()
        assert _code(exc) == CUDA_ERROR_INVALID_RESOURCE_HANDLE


# ---- the registry -------------------------------------------------------------------------

KERNEL_FILE = '''
import struct
from pilot.daemon.sim_kernels import sim_kernel, SimLaunch

@sim_kernel("_Z4fillPii")
def fill(k: SimLaunch) -> None:
    k.write(k.ptr(0), struct.pack("<i", k.i32(1)))
'''


def test_load_kernel_file_isolated(tmp_path: Path) -> None:
    path = tmp_path / "kernels.py"
    path.write_text(KERNEL_FILE)
    before = sim_kernels.default_registry.names()
    reg1, reg2 = load_kernel_file(path), load_kernel_file(path)
    assert reg1.names() == reg2.names() == ["_Z4fillPii"]
    assert reg1.get("_Z4fillPii") is not reg2.get("_Z4fillPii")
    assert sim_kernels.default_registry.names() == before


def test_load_several_files_and_duplicates(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(KERNEL_FILE)
    (tmp_path / "b.py").write_text(KERNEL_FILE.replace("_Z4fillPii", "_Z5otherv"))
    assert sim_kernels.load_kernel_files([tmp_path / "a.py", tmp_path / "b.py"]).names() == [
        "_Z4fillPii", "_Z5otherv"]
    with pytest.raises(ImportError, match="registered twice"):
        sim_kernels.load_kernel_files([tmp_path / "a.py", tmp_path / "a.py"])
    with pytest.raises(ImportError, match=r"missing\.py"):
        load_kernel_file(tmp_path / "missing.py")


def test_sim_launch_helpers() -> None:
    memory = backend_sim.SimMemory(1, MiB)
    p = memory.alloc(16, 0)
    params = [struct.pack("<Q", p), struct.pack("<i", -5), struct.pack("<I", 2**32 - 1),
              struct.pack("<f", 1.5), struct.pack("<d", -2.25), struct.pack("<b", -1),
              struct.pack("<h", -300)]
    k = SimLaunch("k", (1, 2, 3), (4, 5, 6), 128, params, memory)
    assert (k.ptr(0), k.i32(1), k.u32(2), k.f32(3), k.f64(4), k.i8(5), k.i16(6)) == (
        p, -5, 2**32 - 1, 1.5, -2.25, -1, -300)
    k.write(p + 4, b"abcd")
    assert k.read(p, 8) == bytes(4) + b"abcd"
    for addr, n in ((p + 8, 9), (p - 1, 1), (p + 16, 1), (p, -1)):
        with pytest.raises(BackendError) as exc:
            k.view(addr, n)
        assert _code(exc) == CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(IndexError):
        k.ptr(7)
    with pytest.raises(struct.error):
        k.i32(0)  # 8-byte parameter read as 4 bytes: an emulation bug, not silent truncation


# ---- module variables (__device__, __constant__) --------------------------------------------

VARS_SOURCE = r"""
__constant__ float coeffs[4] = {0.5f, 1.5f, 2.5f, 3.5f};
__device__ int counter;
__device__ int seeded = 42;
__global__ void bump(int by) { atomicAdd(&counter, by + (int)coeffs[1]); }
int main() { return 0; }
"""
BUMP = "_Z4bumpi"


@pytest.fixture(scope="module")
def vars_image(compile_cuda) -> bytes:
    [img] = [i for i in compile_cuda(VARS_SOURCE) if kernels_in_image(i)]
    return img


def _read(sim: SimBackend, addr: int, fmt: str) -> tuple:
    out = bytearray(struct.calcsize(fmt))
    sim.memcpy_dtoh(out, addr, len(out), None)
    return struct.unpack(fmt, out)


def test_module_variables(sim: SimBackend, kernels: KernelRegistry, vars_image: bytes) -> None:
    @kernels.kernel(BUMP)
    def bump(k: SimLaunch) -> None:
        (coeff,) = struct.unpack("<f", k.read(k.symbol("coeffs") + 4, 4))
        view = k.symbol_view("counter")
        struct.pack_into("<i", view, 0, struct.unpack("<i", view)[0] + k.i32(0) + int(coeff))

    free_before = sim.mem_get_info(0)[0]
    module = sim.module_load(vars_image)
    assert sim.mem_get_info(0)[0] < free_before  # the variables take device memory
    coeffs, counter, seeded = (sim.module_get_global(module, n)
                               for n in ("coeffs", "counter", "seeded"))
    assert (coeffs[1], counter[1], seeded[1]) == (16, 4, 4)
    assert _read(sim, coeffs[0], "<4f") == (0.5, 1.5, 2.5, 3.5)  # initializers
    assert _read(sim, seeded[0], "<i") == (42,) and _read(sim, counter[0], "<i") == (0,)
    sim.memcpy_htod(counter[0], struct.pack("<i", 5), 4, None)
    fn = sim.function_get(module, BUMP)
    sim.launch(fn.handle, (1, 1, 1), (1, 1, 1), 0, None, struct.pack("<i", 2))
    assert _read(sim, counter[0], "<i") == (5 + 2 + 1,)  # the kernel saw both writes
    with pytest.raises(BackendError) as exc:  # one block holds them all (the session checks
        sim.memcpy_htod(coeffs[0] + 10**6, bytes(4), 4, None)  # each variable), and it ends
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    with pytest.raises(BackendError) as exc:
        sim.module_get_global(module, "nope")
    assert _code(exc) == CUDA_ERROR_INVALID_SYMBOL

    other = sim.module_load(vars_image)  # a second load has its own, freshly initialized copy
    seeded2 = sim.module_get_global(other, "seeded")
    assert seeded2[0] != seeded[0]
    sim.memcpy_htod(seeded[0], struct.pack("<i", 7), 4, None)
    assert _read(sim, seeded2[0], "<i") == (42,)

    sim.module_unload(module)
    sim.module_unload(other)
    assert sim.mem_get_info(0)[0] == free_before
    with pytest.raises(BackendError) as exc:
        sim.memcpy_dtoh(bytearray(4), seeded[0], 4, None)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    with pytest.raises(BackendError) as exc:
        sim.module_get_global(module, "seeded")
    assert _code(exc) == CUDA_ERROR_INVALID_RESOURCE_HANDLE


def test_module_without_variables_takes_no_memory(sim: SimBackend, image: bytes) -> None:
    free_before = sim.mem_get_info(0)[0]
    module = sim.module_load(image)
    assert sim.mem_get_info(0)[0] == free_before
    with pytest.raises(BackendError) as exc:
        sim.module_get_global(module, "anything")
    assert _code(exc) == CUDA_ERROR_INVALID_SYMBOL


def test_sim_launch_symbols() -> None:
    memory = backend_sim.SimMemory(1, MiB)
    p = memory.alloc(64, 0)
    symbols = {"counter": (p, 4), "__nv_static_32__60249f86_10_a_cu_9bb3a52e_hidden": (p + 8, 4),
               "__nv_static_32__11111111_10_b_cu_22222222_twice": (p + 16, 4),
               "__nv_static_32__33333333_10_c_cu_44444444_twice": (p + 24, 4)}
    k = SimLaunch("k", (1, 1, 1), (1, 1, 1), 0, [], memory, symbols=symbols)
    assert k.symbol("counter") == p and k.symbol("hidden") == p + 8
    k.symbol_view("hidden")[:] = b"\x01\x02\x03\x04"
    assert k.read(p + 8, 4) == b"\x01\x02\x03\x04"
    for name in ("missing", "twice", "idden"):  # unknown, ambiguous, not a whole name
        with pytest.raises(BackendError) as exc:
            k.symbol(name)
        assert _code(exc) == CUDA_ERROR_LAUNCH_FAILURE
    with pytest.raises(BackendError):
        SimLaunch("k", (1, 1, 1), (1, 1, 1), 0, [], memory).symbol("counter")


# ---- SM partitions (compute shares) ----

def test_sm_layout_is_the_h100s(sim: SimBackend) -> None:
    """The geometry tests/gpu/green_probe.py read on the H100: 15 units of 8 SMs, 12 in none."""
    lay = sim.sm_layout(0)
    assert lay is not None and (lay.sms, lay.unit, lay.units, lay.spare) == (132, 8, 15, 12)
    assert sim.partition_create(0, (0, 1, 2, 3), False).sm_count == 32
    assert sim.partition_create(0, tuple(range(4, 15)), True).sm_count == 100
    for bad in ((), (15,), (1, 1)):
        with pytest.raises(BackendError) as exc:
            sim.partition_create(0, bad, False)
        assert _code(exc) == CUDA_ERROR_INVALID_VALUE


def test_kernel_runs_only_where_its_module_was_loaded(sim: SimBackend, image: bytes) -> None:
    """A module loaded in the whole-GPU context, launched on a partition's stream, faulted on the
    H100 (context-fatal 700): the sim fails it the same way; loaded in the partition it runs."""
    n = 256
    a, b, c, a_host, b_host = _vadd_setup(sim, n)
    args = struct.pack("<QQQi", a, b, c, n)
    outside = sim.function_get(sim.module_load(image), VADD)
    part = sim.partition_create(0, (0, 1, 2, 3), False)
    sim.use_partition(0, part)
    stream = sim.partition_stream_create(part, 1, 0)
    with pytest.raises(BackendError) as exc:
        sim.launch(outside.handle, (1, 1, 1), (256, 1, 1), 0, stream, args)
    assert _code(exc) == CUDA_ERROR_ILLEGAL_ADDRESS and CUDA_ERROR_ILLEGAL_ADDRESS in STICKY_ERRORS
    inside = sim.function_get(sim.module_load(image), VADD)
    sim.launch(inside.handle, (1, 1, 1), (256, 1, 1), 0, stream, args)
    out = array.array("f", bytes(4 * n))
    sim.memcpy_dtoh(out, c, 4 * n, stream)
    assert out[255] == a_host[255] + b_host[255]
    sim.use_partition(0, None)
    with pytest.raises(BackendError):  # and the partition's kernel on a whole-GPU stream
        sim.launch(inside.handle, (1, 1, 1), (256, 1, 1), 0, sim.stream_create(1, 0), args)


def test_cooperative_grid_is_bounded_by_the_partition(sim: SimBackend, image: bytes) -> None:
    part = sim.partition_create(0, (0, 1, 2, 3), False)
    sim.use_partition(0, part)
    stream = sim.partition_stream_create(part, 1, 0)
    fn = sim.function_get(sim.module_load(image), VADD)
    per_sm = sim.occupancy(fn.handle, 1024, 0, 0)
    coop = LaunchAttrs(cooperative=True)
    sim.launch_ex(fn.handle, (per_sm * 32, 1, 1), (1024, 1, 1), 0, stream, bytes(28), coop)
    with pytest.raises(BackendError) as exc:  # fits on 132 SMs, not on the partition's 32
        sim.launch_ex(fn.handle, (per_sm * 32 + 1, 1, 1), (1024, 1, 1), 0, stream, bytes(28), coop)
    assert _code(exc) == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
