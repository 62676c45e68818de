"""CudaBackend without a GPU: a stand-in `cuda.bindings.driver` records calls and answers
(CUresult, ...) tuples, so the parts that are pure plumbing (error mapping, the packed launch
buffer, the parameter-info loop, copy synchronization) are checked on any machine.
The real driver is exercised by tests/gpu/backend_cuda_smoke.py on the GPU machine."""

from __future__ import annotations

import ctypes
import enum
import mmap
import re
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pilot.daemon.backends import cuda as backend_cuda
from pilot.daemon.backends.base import (
    BackendError,
    ChannelDesc,
    CopySide,
    FunctionInfo,
    Resource,
    TextureDesc,
    ViewDesc,
)
from pilot.daemon.backends.cuda import CudaBackend, check

try:  # the real enum types where cuda-python is installed; a minimal stand-in otherwise
    from cuda.bindings import driver as _real

    CUresult: Any = _real.CUresult
    CUdevice_attribute: Any = _real.CUdevice_attribute
    CUfunction_attribute: Any = _real.CUfunction_attribute
except ImportError:  # pragma: no cover - depends on the machine
    _real = None
    CUresult = enum.IntEnum(
        "CUresult",
        {
            "CUDA_SUCCESS": 0,
            "CUDA_ERROR_INVALID_VALUE": 1,
            "CUDA_ERROR_OUT_OF_MEMORY": 2,
            "CUDA_ERROR_INVALID_HANDLE": 400,
            "CUDA_ERROR_NOT_FOUND": 500,
            "CUDA_ERROR_NOT_READY": 600,
            "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
            "CUDA_ERROR_MPS_SERVER_NOT_READY": 807,
        },
    )
    CUdevice_attribute = enum.IntEnum(
        "CUdevice_attribute",
        {"CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 1, "CU_DEVICE_ATTRIBUTE_WARP_SIZE": 10},
    )
    CUfunction_attribute = enum.IntEnum(
        "CUfunction_attribute",
        {
            "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 0,
            "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES": 1,
            "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES": 8,
        },
    )

OK = CUresult.CUDA_SUCCESS
INVALID_VALUE = CUresult.CUDA_ERROR_INVALID_VALUE


class FakeDriver(types.ModuleType):
    """Any cu* attribute is a recorder: it logs (name, args) and answers replies[name] (a tuple,
    or a callable given the arguments), `(CUDA_SUCCESS,)` by default."""

    def __init__(self) -> None:
        super().__init__("cuda.bindings.driver")
        self.CUresult = CUresult
        self.CUdevice_attribute = CUdevice_attribute
        self.CUfunction_attribute = CUfunction_attribute
        self.CU_MEMHOSTREGISTER_PORTABLE = 1
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.replies: dict[str, tuple[Any, ...] | Callable[..., tuple[Any, ...]]] = {
            "cuDeviceGetCount": (OK, 1),
            "cuDeviceGet": lambda ordinal: (OK, f"dev{ordinal}"),
            "cuDevicePrimaryCtxRetain": lambda dev: (OK, f"ctx:{dev}"),
            "cuGetErrorName": lambda err: (OK, CUresult(err).name.encode()),
            "cuGetErrorString": lambda err: (OK, f"text of {int(err)}".encode()),
            "cuMemGetInfo": (OK, 1 << 30, 2 << 30),
            "cuModuleLoadData": (OK, 0x4D0D),
        }

    def __getattr__(self, name: str) -> Callable[..., tuple[Any, ...]]:
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args: Any) -> tuple[Any, ...]:
            self.calls.append((name, args))
            reply = self.replies.get(name, (OK,))
            return reply(*args) if callable(reply) else reply

        return call

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == name]


@pytest.fixture
def drv(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    """Install the stand-in where `from cuda.bindings import driver` finds it."""
    fake = FakeDriver()
    try:
        import cuda.bindings as pkg
    except ImportError:  # pragma: no cover - no cuda-python on this machine
        pkg = types.ModuleType("cuda.bindings")
        root = types.ModuleType("cuda")
        root.bindings = pkg  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "cuda", root)
        monkeypatch.setitem(sys.modules, "cuda.bindings", pkg)
    monkeypatch.setattr(pkg, "driver", fake, raising=False)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", fake)
    return fake


@pytest.fixture
def backend(drv: FakeDriver) -> CudaBackend:
    be = CudaBackend()
    be.bind_thread(0)
    drv.calls.clear()
    return be


# ---- error funnel ---------------------------------------------------------------------------


def test_check_returns_values(drv: FakeDriver) -> None:
    assert check((OK,)) is None
    assert check((OK, 7)) == 7
    assert check((OK, 1, 2)) == (1, 2)


@pytest.mark.parametrize(
    ("driver_code", "runtime_code"),
    [(1, 1), (2, 2), (400, 400), (500, 500), (700, 700), (719, 719), (999, 999)],
)
def test_check_maps_code_and_message(drv: FakeDriver, driver_code: int, runtime_code: int) -> None:
    err = CUresult(driver_code)
    with pytest.raises(BackendError) as info:
        check((err, None), "cuSomething")
    assert info.value.code == runtime_code
    assert f"cuSomething: {err.name}: text of {driver_code}" in str(info.value)


def test_error_without_runtime_counterpart_is_unknown(drv: FakeDriver) -> None:
    if 916 not in {int(v) for v in CUresult}:
        pytest.skip("this cuda-python has no CUDA_ERROR_KEY_ROTATION")
    with pytest.raises(BackendError) as info:
        check((CUresult(916),))
    assert info.value.code == 999


def test_missing_kernel_is_invalid_device_function(backend: CudaBackend, drv: FakeDriver) -> None:
    drv.replies["cuModuleGetFunction"] = (CUresult.CUDA_ERROR_NOT_FOUND, None)
    with pytest.raises(BackendError) as info:
        backend.function_get("mod", "nope")
    assert info.value.code == 98
    assert drv.called("cuModuleGetFunction") == [("mod", b"nope")]


def _header_enum(path: Path, pattern: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for name, value in re.findall(pattern, path.read_text(errors="replace"), re.M):
        found.setdefault(int(value), name)
    return found


def test_mapping_table_agrees_with_headers() -> None:
    """Every CUresult lands on a cudaError_t that exists, named as the table (or CamelCase) says."""
    include = Path("/usr/local/cuda/include")
    if not (include / "cuda.h").exists() or not (include / "driver_types.h").exists():
        pytest.skip("no CUDA headers here")
    driver = _header_enum(include / "cuda.h", r"^\s*(CUDA_ERROR_\w+)\s*=\s*(\d+)")
    runtime = _header_enum(include / "driver_types.h", r"^\s*(cudaError\w+)\s*=\s*(\d+)")
    for code, name in driver.items():
        mapped, expected = backend_cuda.DRIVER_TO_RUNTIME.get(code, (code, ""))
        if not expected:
            words = name[len("CUDA_ERROR_") :].split("_")
            expected = "cudaError" + "".join(w.capitalize() for w in words)
        assert runtime.get(mapped, "").lower() == expected.lower(), (code, name, mapped)


# ---- launch ---------------------------------------------------------------------------------


def test_launch_passes_packed_buffer_through_extra(backend: CudaBackend, drv: FakeDriver) -> None:
    args = bytes(range(40))
    seen: dict[str, Any] = {}

    def launch(
        f: Any,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shmem: int,
        stream: Any,
        params: Any,
        extra: int,
    ) -> tuple[Any, ...]:
        # Read the array the way the driver does, while the call is in progress.
        words = (ctypes.c_void_p * 5).from_address(extra)
        seen["tags"] = (words[0], words[2], words[4])
        seen["size"] = ctypes.c_size_t.from_address(words[3]).value
        seen["bytes"] = ctypes.string_at(words[1], seen["size"])
        seen["rest"] = (f, gx, gy, gz, bx, by, bz, shmem, stream, params)
        return (OK,)

    drv.replies["cuLaunchKernel"] = launch
    backend.launch("func", (2, 3, 4), (32, 1, 1), 128, "stream", args)
    assert seen["tags"] == (1, 2, None)  # BUFFER_POINTER, BUFFER_SIZE, END (NULL)
    assert seen["size"] == 40
    assert seen["bytes"] == args
    assert seen["rest"] == ("func", 2, 3, 4, 32, 1, 1, 128, "stream", None)

    info = FunctionInfo("handle", [(0, 4)], 1024, 0, 0)
    backend.launch(info, (1, 1, 1), (1, 1, 1), 0, None, memoryview(b"\x07\x00\x00\x00"))
    assert seen["rest"][0] == "handle" and seen["bytes"] == b"\x07\x00\x00\x00"


def test_launch_without_parameters_passes_no_extra(backend: CudaBackend, drv: FakeDriver) -> None:
    backend.launch("func", (1, 1, 1), (1, 1, 1), 0, None, b"")
    (call,) = drv.called("cuLaunchKernel")
    assert call[-2:] == (None, 0)


def test_launch_bad_configuration(backend: CudaBackend, drv: FakeDriver) -> None:
    drv.replies["cuLaunchKernel"] = (INVALID_VALUE,)
    with pytest.raises(BackendError) as info:
        backend.launch("func", (1, 1, 1), (2048, 1, 1), 0, None, b"")
    assert info.value.code == 1  # CUDA 13: cudaErrorInvalidValue, as natively on the H100
    with pytest.raises(BackendError) as info:
        backend.launch("func", (1, 1, 1), (32, 1, 1), 0, None, b"\0" * 4)
    assert info.value.code == 1


# ---- function info --------------------------------------------------------------------------


def test_param_info_loop_stops_at_invalid_value(backend: CudaBackend, drv: FakeDriver) -> None:
    layout = [(0, 24), (24, 1), (32, 8)]
    drv.replies["cuModuleGetFunction"] = (OK, "func")
    drv.replies["cuFuncGetParamInfo"] = lambda f, i: (
        (OK, *layout[i]) if i < len(layout) else (INVALID_VALUE, 0, 0)
    )
    attrs = {0: 1024, 1: 48, 8: 99 * 1024}
    drv.replies["cuFuncGetAttribute"] = lambda attr, f: (OK, attrs[int(attr)])
    info = backend.function_get("mod", "k")
    assert info.params == layout and info.arg_bytes == 40
    assert [a[1] for a in drv.called("cuFuncGetParamInfo")] == [0, 1, 2, 3]
    assert (info.max_threads_per_block, info.static_shared_bytes) == (1024, 48)
    assert info.max_dynamic_shared_bytes == 99 * 1024

    drv.replies["cuFuncGetParamInfo"] = (CUresult.CUDA_ERROR_INVALID_HANDLE, 0, 0)
    with pytest.raises(BackendError) as err:
        backend.function_get("mod", "k")
    assert err.value.code == 400


# ---- copies ---------------------------------------------------------------------------------


def test_htod_waits_only_for_registered_sources(backend: CudaBackend, drv: FakeDriver) -> None:
    shm = mmap.mmap(-1, 1 << 16)
    base = ctypes.addressof(ctypes.c_char.from_buffer(shm))
    backend.host_register(base, len(shm))
    assert drv.called("cuMemHostRegister") == [(base, len(shm), 1)]  # PORTABLE

    backend.memcpy_htod(0x1000, memoryview(shm)[256:512].toreadonly(), 256, "s")
    assert drv.called("cuMemcpyHtoDAsync") == [(0x1000, base + 256, 256, "s")]
    assert drv.called("cuStreamSynchronize") == [("s",)]

    drv.calls.clear()
    backend.memcpy_htod(0x1000, b"x" * 64, 64, "s")  # pageable: the driver staged it
    assert len(drv.called("cuMemcpyHtoDAsync")) == 1 and not drv.called("cuStreamSynchronize")

    backend.host_unregister(base)
    drv.calls.clear()
    backend.memcpy_htod(0x1000, memoryview(shm)[:16], 16, "s")
    assert not drv.called("cuStreamSynchronize")

    with pytest.raises(BackendError) as info:
        backend.memcpy_htod(0x1000, b"short", 6, "s")
    assert info.value.code == 1


def _fill(dst: Any, src: int, n: int, s: Any) -> tuple[Any]:
    """A cuMemcpyDtoHAsync that, like cuda-python's, takes an address or a writable buffer."""
    addr = dst if isinstance(dst, int) else ctypes.addressof((ctypes.c_char * n).from_buffer(dst))
    ctypes.memset(addr, 0xAB, n)
    return (OK,)


def test_dtoh_into_pageable_bytearray_needs_no_synchronize(backend: CudaBackend, drv: FakeDriver) -> None:
    # An async copy to pageable memory returns once the data is there (CUDA's documented rule).
    drv.replies["cuMemcpyDtoHAsync"] = _fill
    out = bytearray(8)
    backend.memcpy_dtoh(out, 0x2000, 4, "s")
    assert out == b"\xab" * 4 + b"\0" * 4
    assert drv.called("cuStreamSynchronize") == []


def test_dtoh_into_other_buffers_synchronizes(backend: CudaBackend, drv: FakeDriver) -> None:
    # A memoryview may be registered staging memory, where the DMA runs after the call returns.
    drv.replies["cuMemcpyDtoHAsync"] = _fill
    store = bytearray(8)
    backend.memcpy_dtoh(memoryview(store), 0x2000, 4, "s")
    assert store == b"\xab" * 4 + b"\0" * 4
    assert drv.called("cuStreamSynchronize") == [("s",)]
    with pytest.raises(BackendError):
        backend.memcpy_dtoh(b"readonly", 0x2000, 4, "s")


def test_unbound_thread_borrows_a_context_to_register(drv: FakeDriver) -> None:
    be = CudaBackend()
    be.host_register(0x10000, 4096)
    names = [n for n, _ in drv.calls]
    assert names[-3:] == ["cuCtxPushCurrent", "cuMemHostRegister", "cuCtxPopCurrent"]


# ---- the rest -------------------------------------------------------------------------------


def test_zero_sizes_skip_the_driver(backend: CudaBackend, drv: FakeDriver) -> None:
    assert backend.mem_alloc(0) == 0
    backend.mem_free(0)
    backend.memcpy_htod(0x1000, b"", 0, None)
    assert drv.calls == []


def test_queries(backend: CudaBackend, drv: FakeDriver) -> None:
    assert backend.stream_query("s") is True
    drv.replies["cuStreamQuery"] = (CUresult.CUDA_ERROR_NOT_READY,)
    assert backend.stream_query("s") is False
    drv.replies["cuEventQuery"] = (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
    with pytest.raises(BackendError) as info:
        backend.event_query("e")
    assert info.value.code == 700
    drv.replies["cuEventElapsedTime"] = (OK, 1.5)
    assert backend.event_elapsed_ms("a", "b") == 1.5


def test_module_load_terminates_ptx_only(backend: CudaBackend, drv: FakeDriver) -> None:
    fatbin = b"\x50\xed\x55\xba\x01\x00\x10\x00" + b"\1" * 8
    backend.module_load(fatbin)
    backend.module_load(b".version 8.0")
    assert [a[0] for a in drv.called("cuModuleLoadData")] == [fatbin, b".version 8.0\0"]


def test_a_module_is_charged_what_the_driver_loaded(backend: CudaBackend, drv: FakeDriver) -> None:
    """Issue 27 (4): the driver's sizes of the variables the image names (PTX here, which has no
    ELF), or the memory the load took when larger (a compressed image names none)."""
    ptx = b".version 8.0\n.target sm_90\n.visible .global .align 1 .b8 big[1073741824];\n\0"
    drv.replies["cuModuleGetGlobal"] = lambda mod, name: (
        (OK, 0x7000, 1 << 30) if name == b"big" else (CUresult(500), 0, 0))
    module = backend.module_load(ptx)
    assert backend.module_loaded_bytes(module, ptx) == 1 << 30
    frees = iter([8 << 30, 6 << 30])  # the load took 2 GiB
    drv.replies["cuMemGetInfo"] = lambda: (OK, next(frees), 80 << 30)
    module = backend.module_load(b"\x50\xed\x55\xba\x01\x00\x10\x00" + b"\1" * 8)
    assert backend.module_loaded_bytes(module, b"") == 2 << 30


def test_a_module_is_not_charged_what_another_thread_allocated_meanwhile(
        backend: CudaBackend, drv: FakeDriver) -> None:
    """Issue 30: pilotd's vGPU threads allocate while one of them loads a module, and the load
    is measured by cuMemGetInfo before and after: a 4 GiB scratch another thread allocated
    meanwhile was charged to the module (on the H100, to a salus job, past the lanes' C). A
    load the free memory moved under is charged its named variables only."""
    fatbin = b"\x50\xed\x55\xba\x01\x00\x10\x00" + b"\1" * 8
    free = [8 << 30]
    drv.replies["cuMemGetInfo"] = lambda: (OK, free[0], 80 << 30)

    def alloc(size: int) -> tuple[Any, ...]:
        free[0] -= size
        return (OK, 0x7F0000)

    def load_beside_an_allocation(image: bytes) -> tuple[Any, ...]:
        other = threading.Thread(target=backend.mem_alloc, args=(4 << 30,))
        other.start()
        other.join()
        free[0] -= 6 << 20  # the load's own code pages
        return (OK, 0x4D0D)

    drv.replies["cuMemAlloc"] = alloc
    drv.replies["cuModuleLoadData"] = load_beside_an_allocation
    module = backend.module_load(fatbin)
    assert backend.module_loaded_bytes(module, b"") == 0  # not 4 GiB + 6 MiB
    def load_alone(image: bytes) -> tuple[Any, ...]:
        free[0] -= 6 << 20
        return (OK, 0x4D0E)

    drv.replies["cuModuleLoadData"] = load_alone
    module = backend.module_load(fatbin)  # alone: what it took
    assert backend.module_loaded_bytes(module, b"") == 6 << 20


def test_device_info_skips_rejected_attributes(backend: CudaBackend, drv: FakeDriver) -> None:
    drv.replies["cuDeviceGetName"] = (OK, b"Fake GPU\0\0\0")
    drv.replies["cuDeviceGetUuid"] = (OK, types.SimpleNamespace(bytes=bytes(range(16))))
    drv.replies["cuDeviceTotalMem"] = (OK, 80 << 30)
    drv.replies["cuDriverGetVersion"] = (OK, 13000)
    drv.replies["cuDeviceGetAttribute"] = lambda attr, dev: (
        (OK, 1024) if int(attr) == 1 else (INVALID_VALUE, 0)
    )
    info = backend.device_info(0)
    assert (info.name, info.uuid, info.total_mem, info.driver_version) == (
        "Fake GPU",
        bytes(range(16)),
        80 << 30,
        13000,
    )
    assert info.attrs == {1: 1024}
    with pytest.raises(BackendError) as err:
        backend.device_info(1)
    assert err.value.code == 101


def test_constants_match_cuda_python() -> None:
    """The ABI numbers the backend hard-codes are the binding's."""
    cu = pytest.importorskip("cuda.bindings.driver")
    assert (cu.CU_LAUNCH_PARAM_BUFFER_POINTER, cu.CU_LAUNCH_PARAM_BUFFER_SIZE) == (1, 2)
    assert cu.CU_LAUNCH_PARAM_END == 0 and cu.CU_MEMHOSTREGISTER_PORTABLE == 1
    flags = cu.CUevent_flags
    assert (int(flags.CU_EVENT_BLOCKING_SYNC), int(flags.CU_EVENT_DISABLE_TIMING)) == (1, 2)
    assert int(flags.CU_EVENT_INTERPROCESS) == 4
    assert int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING) == 1


# ---- module variables ---------------------------------------------------------------------


def test_module_get_global(backend: CudaBackend, drv: FakeDriver) -> None:
    drv.replies["cuModuleGetGlobal"] = (OK, 0x7F0000001000, 64)
    assert backend.module_get_global("mod", "coeffs") == (0x7F0000001000, 64)
    assert drv.called("cuModuleGetGlobal") == [("mod", b"coeffs")]


def test_missing_global_is_invalid_symbol(backend: CudaBackend, drv: FakeDriver) -> None:
    drv.replies["cuModuleGetGlobal"] = (CUresult.CUDA_ERROR_NOT_FOUND, None, None)
    with pytest.raises(BackendError) as info:
        backend.module_get_global("mod", "nope")
    assert info.value.code == 13  # cudaErrorInvalidSymbol, as cudaMemcpyToSymbol reports it


# ---- several devices, launches with attributes, host-callback gates ------------------------

needs_real = pytest.mark.skipif(_real is None, reason="needs cuda-python's types")


def _two_device_backend(drv: FakeDriver) -> CudaBackend:
    drv.replies["cuDeviceGetCount"] = (OK, 2)
    be = CudaBackend()
    be.bind_thread(0)
    drv.calls.clear()
    return be


@needs_real
def test_launch_ex_passes_attributes_and_the_packed_buffer(backend: CudaBackend, drv: FakeDriver) -> None:
    from pilot.daemon.backends.base import LaunchAttrs

    for name in ("CUlaunchConfig", "CUlaunchAttribute", "CUlaunchAttributeID", "CUclusterSchedulingPolicy"):
        setattr(drv, name, getattr(_real, name))
    seen: dict[str, Any] = {}

    def launch_ex(cfg: Any, f: Any, params: Any, extra: int) -> tuple[Any, ...]:
        ids = _real.CUlaunchAttributeID
        seen["shape"] = (cfg.gridDimX, cfg.gridDimY, cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs)
        by_id = {a.id: a.value for a in cfg.attrs}
        seen["cooperative"] = by_id[ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE].cooperative
        dim = by_id[ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION].clusterDim
        seen["cluster"] = (dim.x, dim.y, dim.z)
        seen["policy"] = int(by_id[ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE]
                             .clusterSchedulingPolicyPreference)
        seen["priority"] = by_id[ids.CU_LAUNCH_ATTRIBUTE_PRIORITY].priority
        words = (ctypes.c_void_p * 5).from_address(extra)
        seen["args"] = ctypes.string_at(words[1], 8)
        seen["rest"] = (f, params)
        return (OK,)

    drv.replies["cuLaunchKernelEx"] = launch_ex
    attrs = LaunchAttrs(cooperative=True, cluster=(2, 1, 1), cluster_policy=1, priority=-3)
    backend.launch_ex("func", (8, 2, 1), (128, 1, 1), 256, _real.CUstream(0x1234), bytes(range(8)), attrs)
    assert seen == {"shape": (8, 2, 128, 256, 4), "cooperative": 1, "cluster": (2, 1, 1),
                    "policy": 1, "priority": -3, "args": bytes(range(8)), "rest": ("func", None)}
    drv.replies["cuLaunchKernelEx"] = (CUresult(720),)  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    with pytest.raises(BackendError) as err:
        backend.launch_ex("func", (9999, 1, 1), (1, 1, 1), 0, _real.CUstream(0), b"", LaunchAttrs(True))
    assert err.value.code == 720


def test_peer_copies_name_both_contexts(drv: FakeDriver) -> None:
    be = _two_device_backend(drv)
    be.memcpy_peer(0x100, 1, 0x200, 0, 64, "stream")
    assert drv.called("cuMemcpyPeerAsync") == [(0x100, "ctx:dev1", 0x200, "ctx:dev0", 64, "stream")]
    be.memcpy_peer(0x100, 1, 0x200, 0, 0, "stream")  # nothing to copy: no driver call
    assert len(drv.called("cuMemcpyPeerAsync")) == 1
    with pytest.raises(BackendError):
        be.memcpy_peer(0x100, 2, 0x200, 0, 64, "stream")


@needs_real
def test_peer_access_enabled_once_per_context(drv: FakeDriver) -> None:
    be = _two_device_backend(drv)
    drv.replies["cuCtxEnablePeerAccess"] = (CUresult(704),)  # already enabled: fine
    be.enable_peer_access(0, 1)
    assert drv.called("cuCtxEnablePeerAccess") == [("ctx:dev1", 0)]
    drv.replies["cuCtxEnablePeerAccess"] = (CUresult(217),)  # CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
    with pytest.raises(BackendError) as err:
        be.enable_peer_access(0, 1)
    assert err.value.code == 217
    drv.replies["cuDeviceCanAccessPeer"] = (OK, 1)
    assert be.can_access_peer(0, 1) is True


def _gate_backend(backend: CudaBackend, drv: FakeDriver) -> list[tuple[Any, ...]]:
    from types import SimpleNamespace

    drv.CUstreamWaitValue_flags = SimpleNamespace(CU_STREAM_WAIT_VALUE_GEQ=0)
    drv.CUresult = CUresult
    calls: list[tuple[Any, ...]] = []
    backend._launch_host_func = lambda *a: calls.append(("host", *a)) or 0
    backend._add_callback = lambda *a: calls.append(("callback", *a)) or 0
    return calls


def test_gate_is_a_host_function_then_a_wait_on_the_word(backend: CudaBackend, drv: FakeDriver) -> None:
    from pilot.daemon.backends.base import Gate
    from pilot.daemon.protocol import ffi, lib

    calls = _gate_backend(backend, drv)
    backend._wait_value_ok = True
    slot = ffi.new("pilot_gate *")
    address = int(ffi.cast("uintptr_t", slot))
    fire = int(ffi.cast("uintptr_t", ffi.addressof(lib, "pilot_gate_fire")))
    fire_status = int(ffi.cast("uintptr_t", ffi.addressof(lib, "pilot_gate_fire_status")))
    backend.gate(0x5000, Gate(address, 0xD000, 7, stream_callback=False))
    backend.gate(0x5000, Gate(address, 0xD000, 8, stream_callback=True))
    assert calls == [("host", 0x5000, fire, address), ("callback", 0x5000, fire_status, address, 0)]
    assert drv.called("cuStreamWaitValue32") == [(0x5000, 0xD000, 7, 0), (0x5000, 0xD000, 8, 0)]
    assert slot.wait == 0


def test_gate_without_stream_memory_operations_waits_in_the_host_function(
        backend: CudaBackend, drv: FakeDriver) -> None:
    from pilot.daemon.backends.base import Gate
    from pilot.daemon.protocol import ffi

    calls = _gate_backend(backend, drv)
    drv.replies["cuStreamCreate"] = (OK, "scratch")
    drv.replies["cuStreamWaitValue32"] = (CUresult(801),)  # the probe: CUDA_ERROR_NOT_SUPPORTED
    slot = ffi.new("pilot_gate *")
    backend.gate(0x5000, Gate(int(ffi.cast("uintptr_t", slot)), 0xD000, 1, stream_callback=False))
    assert backend._wait_value_ok is False and slot.wait == 1
    assert [c[0] for c in calls] == ["host"]
    assert drv.called("cuStreamWaitValue32") == [("scratch", 0xD000, 0, 0)]  # the probe only
    assert drv.called("cuStreamDestroy") == [("scratch",)]


def test_gate_memory_is_portable_and_mapped(backend: CudaBackend, drv: FakeDriver) -> None:
    drv.replies["cuMemHostGetDevicePointer"] = (OK, 0xBEEF000)
    backend.map_host(0x7000, 4096)
    assert drv.called("cuMemHostRegister") == [(0x7000, 4096, 3)]  # PORTABLE | DEVICEMAP
    assert backend.host_device_pointer(0x7000) == 0xBEEF000


def test_pinned_copies_are_stream_ordered(backend: CudaBackend, drv: FakeDriver) -> None:
    """Copies from and to a client's pinned range (daemon/pinned.py) pass the view's address to
    the driver and return without waiting for the stream."""
    backend.memcpy_htod_async(0xD000, 0x7000, 4096, "s")
    backend.memcpy_dtoh_async(0x7000, 0xD000, 4096, "s")
    backend.memcpy_htod_async(0xD000, 0x7000, 0, "s")  # nothing to copy
    assert drv.called("cuMemcpyHtoDAsync") == [(0xD000, 0x7000, 4096, "s")]
    assert drv.called("cuMemcpyDtoHAsync") == [(0x7000, 0xD000, 4096, "s")]
    assert not drv.called("cuStreamSynchronize")


# ---- CUDA arrays, 3D copies, texture and surface objects ---------------------------------------
# The driver's functions are the recording stand-in, its structs and enums cuda-python's own (so
# every field set is type-checked by the real bindings); tests/gpu/arrays_compare.sh runs them on
# the real driver.

_cu = _real
STRUCTS = ("CUDA_ARRAY3D_DESCRIPTOR", "CUDA_MEMCPY3D", "CUDA_RESOURCE_DESC", "CUDA_TEXTURE_DESC",
           "CUDA_RESOURCE_VIEW_DESC", "CUarray_format", "CUmemorytype", "CUresourcetype",
           "CUaddress_mode", "CUfilter_mode", "CUresourceViewFormat", "CUtexObject",
           "CUsurfObject", "CUarray")
FLOAT1 = ChannelDesc(32, 0, 0, 0, 2)
UCHAR4 = ChannelDesc(8, 8, 8, 8, 1)


@pytest.fixture
def arr_backend(drv: FakeDriver) -> CudaBackend:
    if _cu is None:
        pytest.skip("needs cuda-python's structs")
    for name in STRUCTS:
        setattr(drv, name, getattr(_cu, name))
    drv.replies["cuArray3DCreate"] = lambda d: (OK, _cu.CUarray(0x1234))
    drv.replies["cuMemAlloc"] = lambda n: (OK, _cu.CUdeviceptr(0x9000))
    drv.replies["cuTexObjectCreate"] = lambda rd, td, vd: (OK, _cu.CUtexObject(7))
    drv.replies["cuSurfObjectCreate"] = lambda rd: (OK, _cu.CUsurfObject(8))
    be = CudaBackend()
    be.bind_thread(0)
    drv.calls.clear()
    return be


def _array(backend: CudaBackend, drv: FakeDriver, desc: ChannelDesc = UCHAR4) -> Any:
    arr = backend.array_create(9, 5, 4, desc, 2)
    [(d,)] = drv.called("cuArray3DCreate")
    return arr, d


def test_array_create_converts_the_channel_format(arr_backend: CudaBackend, drv: FakeDriver) -> None:
    _, d = _array(arr_backend, drv)
    assert (d.Width, d.Height, d.Depth, d.NumChannels, d.Flags) == (9, 5, 4, 4, 2)
    assert d.Format == _cu.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
    drv.calls.clear()
    arr_backend.array_create(16, 0, 0, ChannelDesc(16, 0, 0, 0, 2), 0)
    [(d,)] = drv.called("cuArray3DCreate")
    assert d.Format == _cu.CUarray_format.CU_AD_FORMAT_HALF and (d.Height, d.Depth) == (0, 0)


def test_memcpy_3d_names_each_side(arr_backend: CudaBackend, drv: FakeDriver) -> None:
    arr, _ = _array(arr_backend, drv)
    host = bytearray(36 * 3 * 2)
    arr_backend.memcpy_3d(CopySide("array", array=arr, x=4, y=1, z=2),
                          CopySide("host", buffer=host, pitch=36, rows=3), 36, 3, 2, "s")
    [(p, stream)] = drv.called("cuMemcpy3DAsync")
    assert stream == "s" and (p.WidthInBytes, p.Height, p.Depth) == (36, 3, 2)
    assert p.srcMemoryType == _cu.CUmemorytype.CU_MEMORYTYPE_HOST
    assert (p.srcPitch, p.srcHeight) == (36, 3)
    assert p.dstMemoryType == _cu.CUmemorytype.CU_MEMORYTYPE_ARRAY
    assert int(p.dstArray) == 0x1234 and (p.dstXInBytes, p.dstY, p.dstZ) == (4, 1, 2)
    assert not drv.called("cuStreamSynchronize")  # a pageable source is staged by the driver

    drv.calls.clear()
    arr_backend.memcpy_3d(CopySide("host", buffer=host, pitch=36, rows=3),
                          CopySide("device", ptr=0x5000, pitch=512, rows=6, x=8, y=2, z=1),
                          36, 3, 2, "s")
    [(p, _)] = drv.called("cuMemcpy3DAsync")
    assert int(p.srcDevice) == 0x5000 and (p.srcPitch, p.srcHeight, p.srcXInBytes) == (512, 6, 8)
    assert drv.called("cuStreamSynchronize") == [("s",)]  # the host holds the bytes on return


def test_array_destroy_zeroes_every_slice_first(arr_backend: CudaBackend, drv: FakeDriver) -> None:
    arr, _ = _array(arr_backend, drv)
    drv.calls.clear()
    arr_backend.array_destroy(arr, "s")
    assert drv.called("cuMemAlloc") == [(36 * 5,)]
    copies = [p for p, _ in drv.called("cuMemcpy3DAsync")]
    assert [p.dstZ for p in copies] == [0, 1, 2, 3]
    assert all(int(p.srcDevice) == 0x9000 and p.WidthInBytes == 36 and p.Height == 5
               for p in copies)
    names = [n for n, _ in drv.calls]
    assert names.index("cuStreamSynchronize") < names.index("cuArrayDestroy")
    assert names[-1] == "cuArrayDestroy"


def test_texture_objects(arr_backend: CudaBackend, drv: FakeDriver) -> None:
    arr, _ = _array(arr_backend, drv, ChannelDesc(32, 0, 0, 0, 1))
    handle = arr_backend.texture_create(
        Resource(0, array=arr), TextureDesc(address_mode=(1, 1, 0), normalized_coords=1), None)
    assert handle == 7
    [(rd, td, vd)] = drv.called("cuTexObjectCreate")
    assert rd.resType == _cu.CUresourcetype.CU_RESOURCE_TYPE_ARRAY and vd is None
    assert int(rd.res.array.hArray) == 0x1234
    assert td.flags == 0x03  # integer elements read as such, normalized coordinates
    assert td.addressMode[0] == _cu.CUaddress_mode.CU_TR_ADDRESS_MODE_CLAMP

    drv.calls.clear()
    arr_backend.texture_create(Resource(3, ptr=0x7000, width=5, height=4, pitch=512, desc=FLOAT1),
                               TextureDesc(), ViewDesc(format=0x1, width=5, height=4))
    [(rd, td, vd)] = drv.called("cuTexObjectCreate")
    assert rd.resType == _cu.CUresourcetype.CU_RESOURCE_TYPE_PITCH2D and td.flags == 0
    p2d = rd.res.pitch2D
    assert (int(p2d.devPtr), p2d.width, p2d.height, p2d.pitchInBytes, p2d.numChannels) == \
        (0x7000, 5, 4, 512, 1)
    assert p2d.format == _cu.CUarray_format.CU_AD_FORMAT_FLOAT and vd.width == 5

    arr_backend.texture_destroy(7)
    assert [int(h) for (h,) in drv.called("cuTexObjectDestroy")] == [7]
    assert arr_backend.surface_create(arr) == 8
    arr_backend.surface_destroy(8)
    assert [int(h) for (h,) in drv.called("cuSurfObjectDestroy")] == [8]


def test_array_destroy_zeroes_in_chunks_and_without_device_memory(arr_backend: CudaBackend,
                                                                   drv: FakeDriver) -> None:
    big = arr_backend.array_create(1024, 4096, 0, FLOAT1, 0)  # 4 KiB rows, 16 MiB
    drv.calls.clear()
    arr_backend.array_destroy(big, "s")
    assert drv.called("cuMemAlloc") == [(8 << 20,)]  # 2048 rows at a time
    assert [(p.dstY, p.Height) for p, _ in drv.called("cuMemcpy3DAsync")] == [(0, 2048), (2048, 2048)]

    arr, _ = _array(arr_backend, drv)
    drv.calls.clear()
    drv.replies["cuMemAlloc"] = (_cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)  # the GPU is full
    arr_backend.array_destroy(arr, "s")
    copies = [p for p, _ in drv.called("cuMemcpy3DAsync")]
    assert len(copies) == 4 and all(p.srcMemoryType == _cu.CUmemorytype.CU_MEMORYTYPE_HOST
                                    for p in copies)
    assert not drv.called("cuMemFree") and drv.called("cuArrayDestroy")


# ---- MPS ([isolation] mps; router/mps.py) ---------------------------------------------------

MPS_SERVER_NOT_READY = 807


def refuse_first(times: int, code: int) -> Callable[..., tuple[Any, ...]]:
    """cuDevicePrimaryCtxRetain refusing `times` times with `code`, then retaining."""
    calls = {"n": 0}

    def retain(dev: Any) -> tuple[Any, ...]:
        calls["n"] += 1
        return (CUresult(code),) if calls["n"] <= times else (OK, f"ctx:{dev}")
    return retain


def test_init_waits_while_mps_refuses_the_process(drv: FakeDriver, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """An engine restarting after its fault meets an MPS server that takes no new client until
    every client that had work running has exited: initialization tries again, logging it once."""
    pauses: list[float] = []
    monkeypatch.setattr(backend_cuda.time, "sleep", pauses.append)
    drv.replies["cuDevicePrimaryCtxRetain"] = refuse_first(3, MPS_SERVER_NOT_READY)
    with caplog.at_level("WARNING", logger="pilot.backend"):
        be = CudaBackend()
    assert be.device_count() == 1 and len(pauses) == 3 and pauses == sorted(pauses)
    assert len(drv.called("cuInit")) == 4  # the whole initialization again
    assert drv.called("cuDevicePrimaryCtxRelease") == []  # nothing was retained before
    waits = [r.getMessage() for r in caplog.records]
    assert len(waits) == 2 and "MPS server does not take this process yet" in waits[0]
    assert "MPS took this process after" in waits[1]


def test_init_releases_what_it_retained_before_trying_again(
        drv: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_cuda.time, "sleep", lambda s: None)
    drv.replies["cuDeviceGetCount"] = (OK, 2)
    refused = refuse_first(1, MPS_SERVER_NOT_READY)
    drv.replies["cuDevicePrimaryCtxRetain"] = lambda dev: (
        (OK, f"ctx:{dev}") if dev == "dev0" else refused(dev))
    be = CudaBackend()
    assert be.device_count() == 2
    assert drv.called("cuDevicePrimaryCtxRelease") == [("dev0",)]  # the first try's


def test_init_gives_up_on_mps_after_its_patience_and_at_once_on_other_errors(
        drv: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_cuda.time, "sleep", lambda s: None)
    monkeypatch.setattr(backend_cuda, "MPS_INIT_PATIENCE", -1.0)  # already past
    drv.replies["cuDevicePrimaryCtxRetain"] = refuse_first(99, MPS_SERVER_NOT_READY)
    with pytest.raises(BackendError) as exc:
        CudaBackend()
    assert exc.value.code == MPS_SERVER_NOT_READY and len(drv.called("cuInit")) == 1
    monkeypatch.setattr(backend_cuda, "MPS_INIT_PATIENCE", 60.0)
    drv.calls.clear()
    drv.replies["cuDevicePrimaryCtxRetain"] = refuse_first(99, int(INVALID_VALUE))
    with pytest.raises(BackendError):
        CudaBackend()
    assert len(drv.called("cuInit")) == 1  # not an MPS refusal: no second try


def test_mps_asked_but_not_in_effect_refuses_to_start(drv: FakeDriver) -> None:
    """The driver runs a process without MPS when it cannot reach the control daemon: with
    `mps` the backend checks each device's contexts are MPS clients, else it does not start."""
    attr = getattr(drv.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_MPS_ENABLED", None)
    if attr is None:  # pragma: no cover - the stand-in enum of machines without cuda-python
        pytest.skip("no CU_DEVICE_ATTRIBUTE_MPS_ENABLED in this cuda-python")
    drv.replies["cuDeviceGetAttribute"] = lambda a, dev: (OK, 0 if a == attr else 1)
    with pytest.raises(BackendError, match="would not be confined"):
        CudaBackend(mps=True)
    CudaBackend()  # without `mps` nothing is asked: only the first backend asked, once
    assert len([a for a, _ in drv.called("cuDeviceGetAttribute") if a == attr]) == 1
    drv.replies["cuDeviceGetAttribute"] = lambda a, dev: (OK, 1)
    assert CudaBackend(mps=True).device_count() == 1
