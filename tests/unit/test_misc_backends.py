"""The backend calls behind shim/runtime/misc/api_misc.c: stream priorities, limits, function attributes,
occupancy, pitched allocations, 2D copies and memsets. The sim backend with nvcc-built images
(its answers are the H100's, CUDA 13.0, driver 580); the cuda backend's plumbing with a
recording stand-in for cuda.bindings.driver; and the image parsing of func_attrs.py."""

from __future__ import annotations

import enum
import struct
import types
from typing import Any

import pytest

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_PITCH_VALUE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_UNSUPPORTED_LIMIT,
    BackendError,
)
from pilot.daemon.backends.cuda import CudaBackend
from pilot.daemon.backends.func_attrs import image_function_attrs
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.sim_kernels import KernelRegistry, SimLaunch

SOURCE = r"""
__global__ void __launch_bounds__(128) tiled(float *x)
{ __shared__ float t[256]; t[threadIdx.x] = x[threadIdx.x]; __syncthreads();
  x[threadIdx.x] = t[127 - threadIdx.x]; }
__global__ void plain(float *x) { x[threadIdx.x] += 1.0f; }
__global__ void two(double *x)
{ __shared__ double a[10]; __shared__ char b[3]; a[threadIdx.x] = x[threadIdx.x]; b[threadIdx.x % 3] = 1;
  __syncthreads(); x[threadIdx.x] = a[9 - threadIdx.x] + b[0]; }
int main() { return 0; }
"""
TILED, PLAIN, TWO = "_Z5tiledPf", "_Z5plainPf", "_Z3twoPd"
MAX_THREADS, SHARED, REGS, PTX, BINARY, MAX_DYNAMIC, CARVEOUT = 0, 1, 4, 5, 6, 8, 9


def _code(exc: pytest.ExceptionInfo[BackendError]) -> int:
    return exc.value.code


def _image(compile_cuda: Any, *flags: str) -> bytes:
    [img] = [i for i in compile_cuda(SOURCE, *flags) if image_function_attrs(i)]
    return img


@pytest.fixture(scope="module")
def image(compile_cuda: Any) -> bytes:
    return _image(compile_cuda)


@pytest.fixture
def sim() -> SimBackend:
    kernels = KernelRegistry()

    @kernels.kernel(PLAIN)
    def plain(k: SimLaunch) -> None:
        """Launched only to see the launch checks pass."""

    be = SimBackend(kernels, total_mem=64 << 20)
    be.bind_thread(0)
    return be


# ---- func_attrs.py --------------------------------------------------------------------------

@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_image_attributes(compile_cuda: Any, arch: str | None) -> None:
    """Static shared memory as cudaFuncGetAttributes reports it (sm_90 sections include the
    1 KiB reserved per block, which is not counted), registers, versions."""
    img = _image(compile_cuda, *(["-arch=" + arch] if arch else []))
    attrs = image_function_attrs(img)
    assert {name: a.static_shared_bytes for name, a in attrs.items()} == {
        TILED: 1024, PLAIN: 0, TWO: 83}
    assert all(a.num_regs and a.num_regs > 0 for a in attrs.values())
    want = 90 if arch else 75
    assert {(a.binary_version, a.ptx_version) for a in attrs.values()} == {(want, want)}


def test_image_attributes_of_garbage() -> None:
    assert image_function_attrs(b"") == {}
    assert image_function_attrs(b"\x50\xed\x55\xba" + b"\0" * 12) == {}


# ---- sim ------------------------------------------------------------------------------------

def test_stream_priorities_are_clamped(sim: SimBackend) -> None:
    assert sim.stream_priority_range() == (0, -5)
    got = [sim.stream_priority(sim.stream_create(0, p)) for p in (-10, -5, -3, 0, 3)]
    assert got == [-5, -5, -3, 0, 0]
    assert sim.stream_priority(None) == 0


def test_limits(sim: SimBackend) -> None:
    assert [sim.ctx_get_limit(i) for i in (0, 1, 2, 4, 5, 6)] == [
        1024, 8650752, 8388608, 2048, 64, 9830400]
    sim.ctx_set_limit(0, 1000)
    assert sim.ctx_get_limit(0) == 1008
    for call in (lambda: sim.ctx_get_limit(3), lambda: sim.ctx_set_limit(3, 1)):
        with pytest.raises(BackendError) as exc:
            call()
        assert _code(exc) == CUDA_ERROR_UNSUPPORTED_LIMIT
    sim.bind_thread(0)
    other = SimBackend(KernelRegistry(), device_count=2)
    other.bind_thread(1)
    other.ctx_set_limit(0, 4096)
    other.bind_thread(0)
    assert other.ctx_get_limit(0) == 1024  # per device


def test_function_attributes(sim: SimBackend, image: bytes) -> None:
    module = sim.module_load(image)
    tiled = sim.function_get(module, TILED)
    assert (tiled.max_threads_per_block, tiled.static_shared_bytes,
            tiled.max_dynamic_shared_bytes) == (128, 1024, 48 * 1024 - 1024)
    attrs = sim.function_attributes(tiled.handle)
    assert len(attrs) == 16
    assert (attrs[MAX_THREADS], attrs[SHARED], attrs[MAX_DYNAMIC], attrs[CARVEOUT]) == (
        128, 1024, 48128, -1)
    assert attrs[REGS] > 0 and attrs[BINARY] == attrs[PTX] == 75


def test_set_attribute_rules_and_launches(sim: SimBackend, image: bytes) -> None:
    module = sim.module_load(image)
    plain = sim.function_get(module, PLAIN).handle
    ptr = sim.mem_alloc(4096)
    args = struct.pack("<Q", ptr)
    with pytest.raises(BackendError) as exc:
        sim.launch(plain, (1, 1, 1), (32, 1, 1), 60000, None, args)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    sim.function_set_attribute(plain, MAX_DYNAMIC, 60000)
    sim.launch(plain, (1, 1, 1), (32, 1, 1), 60000, None, args)
    # the same handle again: the attribute stays with the kernel
    again = sim.function_get(module, PLAIN)
    assert again.handle is plain and again.max_dynamic_shared_bytes == 60000
    tiled = sim.function_get(module, TILED).handle
    for fn, attr, value in ((plain, MAX_DYNAMIC, 232449), (tiled, MAX_DYNAMIC, 232448),
                            (plain, MAX_DYNAMIC, -1), (plain, CARVEOUT, 101),
                            (plain, CARVEOUT, -2), (plain, 10, 1), (plain, 16, 1), (plain, 0, 1)):
        with pytest.raises(BackendError) as exc:
            sim.function_set_attribute(fn, attr, value)
        assert _code(exc) == CUDA_ERROR_INVALID_VALUE, (attr, value)
    sim.function_set_attribute(tiled, MAX_DYNAMIC, 232448 - 1024)
    sim.function_set_attribute(plain, CARVEOUT, 50)
    sim.function_set_attribute(plain, 12, 2)
    attrs = sim.function_attributes(plain)
    assert (attrs[MAX_DYNAMIC], attrs[CARVEOUT], attrs[12]) == (60000, 50, 2)


def test_occupancy_model(sim: SimBackend, image: bytes) -> None:
    """Where threads or block slots bind, the H100's own answers."""
    module = sim.module_load(image)
    tiled = sim.function_get(module, TILED).handle
    plain = sim.function_get(module, PLAIN).handle
    cases = {(tiled, 128, 0): 16, (tiled, 64, 0): 32, (tiled, 256, 0): 8, (plain, 1024, 0): 2,
             (plain, 1025, 0): 0, (tiled, 128, 48129): 0, (plain, 32, 100 * 1024): 0}
    assert {key: sim.occupancy(key[0], key[1], key[2], 0) for key in cases} == cases
    assert sim.occupancy(tiled, 128, 0, 1) == 16
    sim.function_set_attribute(plain, MAX_DYNAMIC, 200 * 1024)
    assert sim.occupancy(plain, 32, 100 * 1024, 0) == 2  # shared memory binds
    for block, flags in ((0, 0), (-1, 0), (128, 2)):
        with pytest.raises(BackendError) as exc:
            sim.occupancy(tiled, block, 0, flags)
        assert _code(exc) == CUDA_ERROR_INVALID_VALUE


def test_pitched_allocation(sim: SimBackend) -> None:
    for width, pitch in ((1, 512), (512, 512), (513, 1024), (100000, 100352)):
        ptr, got = sim.mem_alloc_pitch(width, 3)
        assert got == pitch
        assert sim._memory.region(ptr, 3 * pitch) is not None
        assert sim._memory.region(ptr, 3 * pitch + 1) is None
        sim.mem_free(ptr)


def test_2d_copies_and_memset(sim: SimBackend) -> None:
    width, height, spitch = 5, 4, 7
    src = bytes(range(spitch * height))
    a, pa = sim.mem_alloc_pitch(width, height)
    b, pb = sim.mem_alloc_pitch(width + 2, height)
    sim.memcpy_2d_htod(a, pa, src, spitch, width, height, None)
    sim.memset_d8(b, 0xEE, pb * height, None)
    sim.memcpy_2d_dtod(b + 2, pb, a, pa, width, height, None)
    sim.memset_2d_d8(b + pb + 3, pb, 0x1AB, 2, 2, None)
    out = bytearray(9 * height)
    sim.memcpy_2d_dtoh(out, 9, b, pb, width + 2, height, None)
    want = bytearray()
    for r in range(height):
        row = bytearray([0xEE, 0xEE]) + bytearray(src[r * spitch:r * spitch + width])
        if r in (1, 2):
            row[3:5] = b"\xab\xab"
        want += row + bytes(2)
    assert out == want
    with pytest.raises(BackendError) as exc:
        sim.memcpy_2d_dtod(b, 4, a, pa, width, 2, None)
    assert _code(exc) == CUDA_ERROR_INVALID_PITCH_VALUE
    with pytest.raises(BackendError) as exc:
        sim.memset_2d_d8(a, pa, 0, width, height + 1, None)  # the last row is past the end
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    with pytest.raises(BackendError) as exc:
        sim.memcpy_2d_htod(a, pa, src[:10], spitch, width, height, None)  # host buffer short
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    sim.memcpy_2d_dtod(a, pa, a, pa, 0, 3, None)  # empty: nothing checked, nothing done


# ---- cuda (stand-in driver) -----------------------------------------------------------------

class _Memcpy2D:
    """cuda-python's CUDA_MEMCPY2D as a plain record."""


class FakeCu(types.ModuleType):
    """Records every cu* call; answers `replies[name]` (a tuple or callable) or (0,)."""

    CUlimit = enum.IntEnum("CUlimit", {f"L{i}": i for i in range(7)})
    CUfunction_attribute = enum.IntEnum("CUfunction_attribute", {f"A{i}": i for i in range(10)})
    CUmemorytype = enum.IntEnum("CUmemorytype", {"HOST": 1, "DEVICE": 2})
    CUDA_MEMCPY2D = _Memcpy2D

    def __init__(self) -> None:
        super().__init__("fake_cu")
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.replies: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args: Any) -> tuple[Any, ...]:
            self.calls.append((name, args))
            reply = self.replies.get(name, (0,))
            return reply(*args) if callable(reply) else reply

        return call


@pytest.fixture
def cuda() -> tuple[CudaBackend, FakeCu]:
    fake = FakeCu()
    be = object.__new__(CudaBackend)  # no driver to initialize: only the methods under test
    be._cu = fake
    be._sync = fake.cuStreamSynchronize
    be._pinned = ()
    return be, fake


def test_cuda_limits_and_priorities(cuda: tuple[CudaBackend, FakeCu]) -> None:
    be, cu = cuda
    cu.replies["cuCtxGetLimit"] = lambda limit: (0, 1024 * (int(limit) + 1))
    cu.replies["cuCtxGetStreamPriorityRange"] = (0, 0, -5)
    cu.replies["cuStreamGetPriority"] = (0, -3)
    assert be.ctx_get_limit(2) == 3072
    be.ctx_set_limit(0, 4096)
    assert cu.calls[-1] == ("cuCtxSetLimit", (FakeCu.CUlimit(0), 4096))
    with pytest.raises(BackendError) as exc:
        be.ctx_get_limit(9)
    assert _code(exc) == CUDA_ERROR_INVALID_VALUE
    assert be.stream_priority_range() == (0, -5)
    assert be.stream_priority("stream") == -3


def test_cuda_function_attributes(cuda: tuple[CudaBackend, FakeCu]) -> None:
    be, cu = cuda
    cu.replies["cuFuncGetAttribute"] = lambda attr, fn: (1, None) if attr == 7 else (0, 100 + attr)
    values = be.function_attributes("fn")
    assert values == [100 + i for i in range(7)] + [0, 108, 109] + [0] * 6  # 7 fails, 10+ unknown
    be.function_set_attribute("fn", 8, 65536)
    assert cu.calls[-1] == ("cuFuncSetAttribute", ("fn", FakeCu.CUfunction_attribute(8), 65536))
    with pytest.raises(BackendError):
        be.function_set_attribute("fn", 12, 1)  # not in this binding's enum
    cu.replies["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"] = (0, 16)
    assert be.occupancy("fn", 128, 0, 1) == 16
    assert cu.calls[-1][1] == ("fn", 128, 0, 1)


def test_cuda_pitch_and_2d(cuda: tuple[CudaBackend, FakeCu]) -> None:
    be, cu = cuda
    cu.replies["cuMemAllocPitch"] = (0, 0x7000, 512)
    assert be.mem_alloc_pitch(100, 3) == (0x7000, 512)
    assert cu.calls[-1] == ("cuMemAllocPitch", (100, 3, 16))
    src = bytes(30)
    be.memcpy_2d_htod(0x7000, 512, src, 10, 10, 3, "s")
    name, (p, stream) = cu.calls[-1]
    assert (name, stream) == ("cuMemcpy2DAsync", "s")
    assert (int(p.srcMemoryType), p.srcPitch, int(p.dstMemoryType), p.dstDevice, p.dstPitch,
            p.WidthInBytes, p.Height) == (1, 10, 2, 0x7000, 512, 10, 3)
    assert isinstance(p.srcHost, int) and p.srcHost
    out = bytearray(30)
    be.memcpy_2d_dtoh(out, 10, 0x7000, 512, 10, 3, "s")
    assert [c[0] for c in cu.calls[-2:]] == ["cuMemcpy2DAsync", "cuStreamSynchronize"]
    p = cu.calls[-2][1][0]
    assert (int(p.srcMemoryType), p.srcDevice, int(p.dstMemoryType), p.dstPitch) == (2, 0x7000, 1, 10)
    be.memcpy_2d_dtod(0x9000, 1024, 0x7000, 512, 10, 3, "s")
    p = cu.calls[-1][1][0]
    assert (p.srcDevice, p.srcPitch, p.dstDevice, p.dstPitch) == (0x7000, 512, 0x9000, 1024)
    be.memset_2d_d8(0x7000, 512, 0x1AB, 10, 3, "s")
    assert cu.calls[-1] == ("cuMemsetD2D8Async", (0x7000, 512, 0xAB, 10, 3, "s"))
    with pytest.raises(BackendError):
        be.memcpy_2d_htod(0x7000, 512, bytes(29), 10, 10, 3, "s")  # host buffer too short
    count = len(cu.calls)
    be.memcpy_2d_dtod(0x9000, 1024, 0x7000, 512, 0, 3, "s")
    be.memset_2d_d8(0x7000, 512, 0, 10, 0, "s")
    assert len(cu.calls) == count  # empty operations reach no driver
