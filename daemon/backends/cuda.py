"""The real-GPU backend: backend.Backend over cuda-python's driver API (cuda.bindings.driver).

Why the driver API and not the runtime: the daemon must load the client's fatbin images itself
(cuModuleLoadData), launch from a packed parameter buffer it received over the wire
(CU_LAUNCH_PARAM_BUFFER_POINTER), and make one context current per vGPU thread; the runtime
API hides all three. Each device's *primary* context is used, so anything else in the daemon
that touches the runtime (NVML helpers, tests) shares the same context and allocations.

cuda-python is imported inside the constructor, so `import pilot.daemon.backends.cuda` works on
machines without it (CI, the sim backend's tests).

Handle conventions: device pointers are ints; streams, events, modules and functions are the
binding's CUstream/CUevent/CUmodule/CUfunction objects. Device indexes are positions in the
`devices` list the backend was built with (like CUDA_VISIBLE_DEVICES), not raw ordinals.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from pilot.daemon.backends.base import (
    CHANNEL_FLOAT,
    CHANNEL_SIGNED,
    CHANNEL_UNSIGNED,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_UNKNOWN,
    RANGE_ATTR_DEVICE_IDS,
    RANGE_ATTR_ID_TYPE,
    RESOURCE_ARRAY,
    RESOURCE_LINEAR,
    ArrayShape,
    BackendError,
    ChannelDesc,
    CopySide,
    DeviceInfo,
    FunctionInfo,
    Gate,
    LaunchAttrs,
    Resource,
    SmLayout,
    TextureDesc,
    ViewDesc,
    format_pci_bus_id,
)
from pilot.daemon.backends.cublas import CudaLibraries
from pilot.daemon.backends.cudnn import CudaDnn
from pilot.daemon.backends.fatbin import variable_names
from pilot.daemon.backends.libraries import BlasSettings, GemmCall, LtCall
from pilot.daemon.backends.linker import CudaLinker
from pilot.daemon.protocol import ffi as _pffi
from pilot.daemon.protocol import lib as _plib

log = logging.getLogger("pilot.backend")
_LINKER = CudaLinker()  # libcuda's linker, loaded on first use (cuLink* of programs)

# CUresults with which MPS refuses a process for a while (connection failed, RPC failure, server
# not ready, too many clients or connections, client terminated): CUDA initialization tries
# again for up to MPS_INIT_PATIENCE seconds (CudaBackend._open_devices).
MPS_RETRY_ERRORS = frozenset({805, 806, 807, 808, 809, 810})
MPS_INIT_PATIENCE = 60.0

# --------------------------------------------------------------------------------------------
# Error funnel
# --------------------------------------------------------------------------------------------

# CUresult -> (cudaError_t, runtime name) wherever the runtime's name or number differs from
# the driver's. Checked against CUDA 13.0 cuda.h and driver_types.h: every CUresult not listed
# here has a cudaError_t of the same number whose name is the driver's in CamelCase
# (CUDA_ERROR_ILLEGAL_ADDRESS 700 = cudaErrorIllegalAddress 700), so unlisted codes pass through
# unchanged. tests/unit/test_backend_cuda.py re-checks this against the headers when present.
DRIVER_TO_RUNTIME: dict[int, tuple[int, str]] = {
    2: (2, "cudaErrorMemoryAllocation"),  # CUDA_ERROR_OUT_OF_MEMORY
    3: (3, "cudaErrorInitializationError"),  # CUDA_ERROR_NOT_INITIALIZED
    4: (4, "cudaErrorCudartUnloading"),  # CUDA_ERROR_DEINITIALIZED
    46: (46, "cudaErrorDevicesUnavailable"),  # CUDA_ERROR_DEVICE_UNAVAILABLE
    200: (200, "cudaErrorInvalidKernelImage"),  # CUDA_ERROR_INVALID_IMAGE
    201: (201, "cudaErrorDeviceUninitialized"),  # CUDA_ERROR_INVALID_CONTEXT
    202: (
        CUDA_ERROR_UNKNOWN,
        "cudaErrorUnknown",
    ),  # CUDA_ERROR_CONTEXT_ALREADY_CURRENT: no runtime value
    205: (205, "cudaErrorMapBufferObjectFailed"),  # CUDA_ERROR_MAP_FAILED
    206: (206, "cudaErrorUnmapBufferObjectFailed"),  # CUDA_ERROR_UNMAP_FAILED
    209: (209, "cudaErrorNoKernelImageForDevice"),  # CUDA_ERROR_NO_BINARY_FOR_GPU
    216: (216, "cudaErrorDeviceAlreadyInUse"),  # CUDA_ERROR_CONTEXT_ALREADY_IN_USE
    400: (400, "cudaErrorInvalidResourceHandle"),  # CUDA_ERROR_INVALID_HANDLE
    500: (500, "cudaErrorSymbolNotFound"),  # CUDA_ERROR_NOT_FOUND
    708: (708, "cudaErrorSetOnActiveProcess"),  # CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE
    719: (719, "cudaErrorLaunchFailure"),  # CUDA_ERROR_LAUNCH_FAILED
    916: (CUDA_ERROR_UNKNOWN, "cudaErrorUnknown"),  # CUDA_ERROR_KEY_ROTATION: no runtime value
}

# (driver call, CUresult) -> cudaError_t where the runtime reports a call's failure differently
# from the generic mapping: cudaLaunchKernel on a kernel the image lacks gives
# cudaErrorInvalidDeviceFunction, not cudaErrorSymbolNotFound.
CALL_OVERRIDES: dict[tuple[str, int], int] = {
    ("cuModuleGetFunction", 500): 98,  # cudaErrorInvalidDeviceFunction
    ("cuModuleGetGlobal", 500): 13,  # cudaErrorInvalidSymbol
}

# What cudart reports when there is no driver library at all: cudaErrorInsufficientDriver.
_NO_DRIVER = 35

# The opt-out of compute shares on CUDA ("0"; sm_layout says why it exists).
SM_SHARES_ENV = "PILOT_SM_SHARES"

# CUresult values the backend branches on; same numbers as the cudaError_t ones.
_CU_ERROR_INVALID_VALUE = CUDA_ERROR_INVALID_VALUE
_CU_ERROR_NOT_READY = CUDA_ERROR_NOT_READY
_CU_ERROR_NOT_SUPPORTED = CUDA_ERROR_NOT_SUPPORTED
_CU_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704

# cuMemHostRegister flags (cuda.h): PORTABLE 1 (pinned for every context), DEVICEMAP 2 (mapped
# into the device address space, so a stream can wait on the memory).
_HOST_REGISTER_PORTABLE = 1
_HOST_REGISTER_DEVICEMAP = 2


def _describe(err: Any) -> tuple[str, str]:
    """The driver's own name and text for a CUresult; never raises (it runs on error paths)."""
    code = int(err)
    try:
        from cuda.bindings import driver as cu

        name_res = cu.cuGetErrorName(err)
        text_res = cu.cuGetErrorString(err)
    except Exception:  # describing an error must not raise another
        return f"CUresult {code}", "unknown error"
    name = name_res[1] if not name_res[0] and name_res[1] else f"CUresult {code}".encode()
    text = text_res[1] if not text_res[0] and text_res[1] else b"unknown error"
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return str(name), str(text)


def error(err: Any, call: str = "") -> BackendError:
    """Build the BackendError for a failed CUresult: runtime numbering, driver's wording."""
    code = int(err)
    runtime = CALL_OVERRIDES.get((call, code))
    if runtime is None:
        runtime = DRIVER_TO_RUNTIME.get(code, (code, ""))[0]
    name, text = _describe(err)
    message = f"{name}: {text}"
    return BackendError(runtime, f"{call}: {message}" if call else message)


def check(result: tuple[Any, ...], call: str = "") -> Any:
    """The one error funnel. cuda-python calls return (CUresult, *values); raise on failure,
    otherwise return None, the single value, or the tuple of values.

    CUresult is an int subclass (IntEnum or cuda-python's FastEnum), so success is falsy.
    """
    err = result[0]
    if err:
        raise error(err, call)
    n = len(result)
    if n == 2:
        return result[1]
    if n == 1:
        return None
    return result[1:]


# --------------------------------------------------------------------------------------------
# Zero-copy host buffers
# --------------------------------------------------------------------------------------------


class _PyBuffer(ctypes.Structure):
    """CPython's Py_buffer (part of the stable ABI since 3.11), filled by PyObject_GetBuffer.

    Why not ctypes.from_buffer: it refuses read-only objects (bytes, zmq frames), and
    from_buffer_copy copies. PyObject_GetBuffer exports any contiguous buffer, read-only or
    not, without copying, and pins it (no resize/close) until PyBuffer_Release.
    """

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_void_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_PyBUF_SIMPLE = 0  # contiguous bytes, read-only allowed
_PyBUF_WRITABLE = 1

# A private PyDLL handle (the same lookup ctypes.pythonapi does), so setting argtypes here
# cannot clash with other users of ctypes.pythonapi. PyDLL holds the GIL and raises the
# Python exception PyObject_GetBuffer sets (BufferError, TypeError).
_pyapi = ctypes.PyDLL(None)
_get_buffer = _pyapi.PyObject_GetBuffer
_get_buffer.argtypes = (ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)
_get_buffer.restype = ctypes.c_int
_release_buffer = _pyapi.PyBuffer_Release
_release_buffer.argtypes = (ctypes.POINTER(_PyBuffer),)
_release_buffer.restype = None


def _export(obj: Any, count: int, writable: bool) -> _PyBuffer:
    """Export `obj`'s buffer and check it holds `count` bytes; the caller must release it."""
    view = _PyBuffer()
    try:
        _get_buffer(obj, ctypes.byref(view), _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE)
    except (BufferError, TypeError, ValueError) as exc:
        kind = "a writable" if writable else "a contiguous"
        raise BackendError(
            CUDA_ERROR_INVALID_VALUE, f"host buffer is not {kind} buffer: {exc}"
        ) from None
    if view.len < count:
        _release_buffer(ctypes.byref(view))
        raise BackendError(
            CUDA_ERROR_INVALID_VALUE, f"host buffer holds {view.len} bytes, copy needs {count}"
        )
    return view


# --------------------------------------------------------------------------------------------
# Packed kernel parameters
# --------------------------------------------------------------------------------------------

# cuda.h: CU_LAUNCH_PARAM_END_AS_INT 0x00, CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT 0x01,
# CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT 0x02 (ABI constants).
_LAUNCH_PARAM_END = 0
_LAUNCH_PARAM_BUFFER_POINTER = 1
_LAUNCH_PARAM_BUFFER_SIZE = 2


class _PackedArgs(ctypes.Structure):
    """cuLaunchKernel's `extra` array and the size_t it points at, in one block of memory.

    The first five fields are the void* array {BUFFER_POINTER, buf, BUFFER_SIZE, &size, END}.
    `buf` is a c_char_p field: assigning a bytes object stores a pointer to the bytes' own
    storage (no copy) and keeps a reference to it in the structure, so the parameter buffer is
    alive until the next assignment, i.e. past cuLaunchKernel's return, when the driver has
    copied the parameters. One instance per thread, reused: cuda-python drops the GIL during
    the launch, so a shared instance could be rewritten under a launch in progress.
    """

    _fields_ = [
        ("tag_pointer", ctypes.c_void_p),
        ("buf", ctypes.c_char_p),
        ("tag_size", ctypes.c_void_p),
        ("size_ptr", ctypes.c_void_p),
        ("end", ctypes.c_void_p),
        ("size", ctypes.c_size_t),
    ]

    def __init__(self) -> None:
        super().__init__()
        base = ctypes.addressof(self)
        self.tag_pointer = _LAUNCH_PARAM_BUFFER_POINTER
        self.tag_size = _LAUNCH_PARAM_BUFFER_SIZE
        self.size_ptr = base + _PackedArgs.size.offset
        self.end = _LAUNCH_PARAM_END
        self.extra = base  # what cuLaunchKernel's `extra` (a void_ptr) receives


_FATBIN_MAGIC = b"\x50\xed\x55\xba"  # 0xBA55ED50 little-endian
_ELF_MAGIC = b"\x7fELF"


# --------------------------------------------------------------------------------------------
# The backend
# --------------------------------------------------------------------------------------------


class CudaBackend:
    """backend.Backend on real GPUs; see the module docstring for the conventions."""

    name = "cuda"
    _memory_changes = 0  # set in __init__; the class default serves backends built without it

    def __init__(self, devices: list[int] | None = None, gpu_wait: str = "auto",
                 mps: bool = False) -> None:
        """`gpu_wait`: how a pilotd thread waits in a synchronization, the primary contexts'
        schedule (`[daemon] gpu_wait`). "auto" leaves the driver's default: with pilotd's one
        context per GPU that is spinning, a core per waiting vGPU thread (the lowest latency);
        "yield" spins but gives way; "blocking" sleeps until the GPU interrupts (no CPU while
        waiting, a wake-up more per synchronization): for hosts whose cores are short.
        `mps` (`[isolation] mps`): the contexts must be MPS clients (router/mps.py), else the
        backend does not start: the driver quietly runs without MPS when it cannot reach the
        control daemon, and this process's kernels would then not be confined."""
        from cuda.bindings import driver as cu

        self._cu: Any = cu
        # Hot-path bindings, looked up once.
        self._launch_kernel = cu.cuLaunchKernel
        self._htod = cu.cuMemcpyHtoDAsync
        self._dtoh = cu.cuMemcpyDtoHAsync
        self._sync = cu.cuStreamSynchronize
        self._range_attribute_fn: Any = None  # cuMemRangeGetAttribute through ctypes, once used

        self._ordinals: list[int] = []  # CUDA ordinal per index
        self._devices: list[Any] = []  # CUdevice per index
        self._contexts: list[Any] = []  # retained primary CUcontext per index
        self._open_devices(devices, gpu_wait)
        if mps:
            self._check_mps()
        self._tls = threading.local()  # .device: bound index; .packed: _PackedArgs
        # Registered (pinned) host ranges as (start, end); replaced whole, never mutated, so
        # copy threads read it without a lock.
        self._pinned: tuple[tuple[int, int], ...] = ()
        self._pinned_lock = threading.Lock()
        # Host callbacks (gate()): driver entry points called through ctypes, so the driver's
        # callback thread runs pilot_gate_fire without the GIL; resolved on first use.
        self._launch_host_func: Any = None
        self._add_callback: Any = None
        self._wait_value_ok: bool | None = None  # cuStreamWaitValue32 usable (probed once)
        self._gate_lock = threading.Lock()
        self._probes: dict[int, Any] = {}  # device index -> the fault watch's idle stream
        self._probe_lock = threading.Lock()
        self._load_taken: dict[int, int] = {}  # CUmodule -> device memory its load took
        self._load_lock = threading.Lock()
        # Counts the device-memory changes of every vGPU thread (allocations, frees, module
        # loads): a module load measured while it moved was measuring others' memory too.
        self._memory_changes = 0
        self._libraries = CudaLibraries()  # cuBLAS, cuBLASLt (backends/cublas.py)
        self._dnn = CudaDnn()  # cuDNN (backends/cudnn.py)

    def _open_devices(self, devices: list[int] | None, gpu_wait: str) -> None:
        """cuInit and each device's primary context, tried again for up to MPS_INIT_PATIENCE
        while MPS refuses this process (MPS_RETRY_ERRORS): its server is starting, or recovering
        from a fault (on Hopper it takes no new client until every client that had work running
        at the fault has exited; an engine restarting after its own fault meets exactly that)."""
        deadline = time.monotonic() + MPS_INIT_PATIENCE
        waited_since: float | None = None
        pause = 0.05
        while True:
            try:
                self._open_devices_once(devices, gpu_wait)
            except BackendError as exc:
                self._release_contexts()
                if exc.code not in MPS_RETRY_ERRORS or time.monotonic() > deadline:
                    raise
                if waited_since is None:
                    waited_since = time.monotonic()
                    log.warning("CUDA initialization: %s: the MPS server does not take this process "
                                "yet (it is starting, or recovering from a fault until every client "
                                "that had work running has exited); trying again for up to %.0f s",
                                exc, MPS_INIT_PATIENCE)
                time.sleep(pause)
                pause = min(1.0, pause * 2)
                continue
            if waited_since is not None:
                log.warning("CUDA initialization: MPS took this process after %.1f s",
                            time.monotonic() - waited_since)
            return

    def _open_devices_once(self, devices: list[int] | None, gpu_wait: str) -> None:
        cu = self._cu
        try:
            init = cu.cuInit(0)
        except Exception as exc:  # the binding raises when libcuda.so.1 cannot be loaded
            raise BackendError(_NO_DRIVER, f"cuInit: {type(exc).__name__}: {exc}") from exc
        check(init, "cuInit")
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        ordinals = list(range(count)) if devices is None else list(devices)
        for ordinal in ordinals:
            if not 0 <= ordinal < count:
                raise BackendError(CUDA_ERROR_INVALID_DEVICE, f"device {ordinal} of {count}")
        self._ordinals = ordinals
        schedule = None if gpu_wait == "auto" else getattr(
            cu.CUctx_flags, {"spin": "CU_CTX_SCHED_SPIN", "yield": "CU_CTX_SCHED_YIELD",
                             "blocking": "CU_CTX_SCHED_BLOCKING_SYNC"}[gpu_wait])
        for ordinal in ordinals:
            dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
            if schedule is not None:  # before the context is made, so every stream of it waits so
                check(cu.cuDevicePrimaryCtxSetFlags(dev, int(schedule)), "cuDevicePrimaryCtxSetFlags")
            self._contexts.append(
                check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            )
            self._devices.append(dev)

    def _release_contexts(self) -> None:
        """The primary contexts retained so far (an initialization cut short)."""
        devices, self._devices, self._contexts = self._devices, [], []
        for dev in devices:
            try:
                check(self._cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
            except BackendError as exc:
                log.debug("releasing a primary context after a failed start: %s", exc)

    def _check_mps(self) -> None:
        """Every device's contexts are MPS clients (CU_DEVICE_ATTRIBUTE_MPS_ENABLED), else raise."""
        cu = self._cu
        attr = getattr(cu.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_MPS_ENABLED", None)
        if attr is None:
            log.warning("[isolation] mps: this cuda-python has no CU_DEVICE_ATTRIBUTE_MPS_ENABLED: "
                        "cannot check that this process is an MPS client (pilotd's MPS control "
                        "daemon lists its servers: `pilotctl status`)")
            return
        for index, dev in enumerate(self._devices):
            if not check(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"):
                raise BackendError(
                    CUDA_ERROR_NOT_SUPPORTED,
                    f"[isolation] mps is on, but the driver does not run this process's contexts "
                    f"on CUDA device {self._ordinals[index]} under MPS (it could not reach the "
                    f"control daemon at CUDA_MPS_PIPE_DIRECTORY="
                    f"{os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '(unset)')}, or the GPU does not "
                    f"support it): its kernels would not be confined, so pilotd does not start")

    def close(self) -> None:
        """Release the primary contexts (not in the interface; for orderly daemon shutdown)."""
        self._dnn.close()
        self._libraries.close()
        cu = self._cu
        devices, self._devices, self._contexts = self._devices, [], []
        for dev in devices:
            check(cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")

    # ---- device ------------------------------------------------------------------------------

    def device_count(self) -> int:
        return len(self._contexts)

    def _index(self, device: int) -> int:
        if not 0 <= device < len(self._contexts):
            raise BackendError(
                CUDA_ERROR_INVALID_DEVICE, f"device {device} of {len(self._contexts)}"
            )
        return device

    def _ordinal(self, device: int) -> int:
        return self._ordinals[self._index(device)]

    def _index_of_ordinal(self, ordinal: int) -> int:
        """The backend index of a CUDA ordinal; CPU (-1) and invalid (-2) ids pass through, a
        device outside the backend's list reads as invalid."""
        if ordinal < 0:
            return ordinal
        return self._ordinals.index(ordinal) if ordinal in self._ordinals else -2

    def bind_thread(self, device: int) -> None:
        check(self._cu.cuCtxSetCurrent(self._contexts[self._index(device)]), "cuCtxSetCurrent")
        self._tls.device = device
        self._tls.partition = None

    @contextmanager
    def _context(self, device: int) -> Iterator[None]:
        """Run a block with `device`'s context current, restoring the thread's own afterwards."""
        if getattr(self._tls, "device", None) == device:
            yield
            return
        cu = self._cu
        check(cu.cuCtxPushCurrent(self._contexts[self._index(device)]), "cuCtxPushCurrent")
        try:
            yield
        finally:
            check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def context_error(self, device: int) -> int:
        """A query of an idle stream of pilotd's own: after a context-fatal fault the driver
        answers every call with the fault's error (~10 us on the H100, fault_probe.py)."""
        cu = self._cu
        index = self._index(device)
        with self._probe_lock:
            stream = self._probes.get(index)
            if stream is None:
                with self._context(device):
                    stream = self._probes[index] = check(
                        cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        with self._context(device):
            err = int(cu.cuStreamQuery(stream)[0])
        if err in (0, CUDA_ERROR_NOT_READY):
            return 0
        return DRIVER_TO_RUNTIME.get(err, (err, ""))[0]

    def device_info(self, device: int) -> DeviceInfo:
        cu = self._cu
        dev = self._devices[self._index(device)]
        raw_name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
        name = bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace")
        uuid = bytes(check(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes)[:16]
        total = check(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
        version = check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        # cudaDeviceAttr shares CUdevice_attribute's numbering (checked in the CUDA 13.0
        # headers: all 80 attributes named alike have equal values; the rest differ only in
        # spelling, e.g. cudaDevAttrMaxTexture1DWidth = CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH
        # = 21), so keys are usable as cudaDeviceAttr. Attributes this driver rejects are skipped.
        attrs: dict[int, int] = {}
        for attr in cu.CUdevice_attribute:
            value = int(attr)
            if value in attrs or attr.name == "CU_DEVICE_ATTRIBUTE_MAX":
                continue
            res = cu.cuDeviceGetAttribute(attr, dev)
            if not res[0]:
                attrs[value] = int(res[1])
        return DeviceInfo(
            name=name, uuid=uuid, total_mem=int(total), driver_version=int(version), attrs=attrs
        )

    def host_pci_bus_ids(self) -> dict[int, str]:
        """The PCI bus id of every GPU the driver enumerates, by CUDA ordinal (not in the
        Backend interface: the router ranks GPUs by it for CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
        cu = self._cu
        attr = cu.CUdevice_attribute
        ids: dict[int, str] = {}
        for ordinal in range(check(cu.cuDeviceGetCount(), "cuDeviceGetCount")):
            dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
            domain, bus, device = (
                int(check(cu.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute"))
                for a in (attr.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, attr.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
                          attr.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID))
            ids[ordinal] = format_pci_bus_id(domain, bus, device)
        return ids

    def mem_get_info(self, device: int) -> tuple[int, int]:
        with self._context(device):
            free, total = check(self._cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    # ---- memory ------------------------------------------------------------------------------

    def mem_alloc(self, size: int) -> int:
        if size == 0:
            return 0  # cudaMalloc(&p, 0) succeeds with p = NULL; the driver would refuse
        try:
            return int(check(self._cu.cuMemAlloc(size), "cuMemAlloc"))
        finally:
            self._memory_changes += 1

    def mem_free(self, ptr: int) -> None:
        if ptr == 0:
            return  # cudaFree(NULL) is a no-op
        try:
            check(self._cu.cuMemFree(ptr), "cuMemFree")
        finally:
            self._memory_changes += 1

    def _is_pinned(self, address: int, count: int) -> bool:
        end = address + count
        for start, stop in self._pinned:
            if address < stop and start < end:
                return True
        return False

    def memcpy_htod(self, dst: int, src: Any, count: int, stream: Any) -> None:
        """Pageable sources: cuMemcpyHtoDAsync returns once the driver has staged the bytes.
        Registered sources are DMA'd straight from `src` after the call returns, so those copies
        wait for the stream before `src` is handed back for reuse."""
        if count <= 0:
            if count < 0:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"negative count {count}")
            return
        view = _export(src, count, writable=False)
        try:
            address = view.buf
            check(self._htod(dst, address, count, stream), "cuMemcpyHtoDAsync")
            if self._pinned and self._is_pinned(address, count):
                check(self._sync(stream), "cuStreamSynchronize")
        finally:
            _release_buffer(ctypes.byref(view))

    def memcpy_dtoh(self, dst: Any, src: int, count: int, stream: Any) -> None:
        if count <= 0:
            if count < 0:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"negative count {count}")
            return
        if type(dst) is bytearray and len(dst) >= count:
            # Hot path (small copies travel back in the reply): a fresh bytearray is pageable,
            # and an async copy to pageable memory returns only once the data is there, so no
            # stream synchronize is needed; cuda-python takes the buffer without a copy.
            check(self._dtoh(dst, src, count, stream), "cuMemcpyDtoHAsync")
            return
        view = _export(dst, count, writable=True)
        try:
            check(self._dtoh(view.buf, src, count, stream), "cuMemcpyDtoHAsync")
            check(self._sync(stream), "cuStreamSynchronize")
        finally:
            _release_buffer(ctypes.byref(view))

    def memcpy_dtod(self, dst: int, src: int, count: int, stream: Any) -> None:
        if count:
            check(self._cu.cuMemcpyDtoDAsync(dst, src, count, stream), "cuMemcpyDtoDAsync")

    def memset_d8(self, ptr: int, value: int, count: int, stream: Any) -> None:
        if count:
            # cudaMemset takes an int and uses its low byte.
            check(self._cu.cuMemsetD8Async(ptr, value & 0xFF, count, stream), "cuMemsetD8Async")

    def memset_wide(self, ptr: int, value: int, elem_size: int, count: int, stream: Any) -> None:
        if count:
            if elem_size == 2:
                check(self._cu.cuMemsetD16Async(ptr, value & 0xFFFF, count, stream),
                      "cuMemsetD16Async")
            else:
                check(self._cu.cuMemsetD32Async(ptr, value & 0xFFFFFFFF, count, stream),
                      "cuMemsetD32Async")

    def host_register(self, address: int, size: int) -> None:
        """Pin with CU_MEMHOSTREGISTER_PORTABLE (1) rather than 0: with several devices the
        staging memory must count as pinned in every primary context, not only the current one
        (otherwise other devices' copies fall back to staged, pageable-speed transfers). The
        driver needs a current context; a thread not bound yet borrows the first device's."""
        cu = self._cu
        with self._context(getattr(self._tls, "device", 0)):
            check(
                cu.cuMemHostRegister(address, size, cu.CU_MEMHOSTREGISTER_PORTABLE),
                "cuMemHostRegister",
            )
        with self._pinned_lock:
            self._pinned = (*self._pinned, (address, address + size))

    def host_unregister(self, address: int) -> None:
        with self._context(getattr(self._tls, "device", 0)):
            check(self._cu.cuMemHostUnregister(address), "cuMemHostUnregister")
        # Forget the range only once the driver has let go of it, so a copy racing with this
        # call still synchronizes.
        with self._pinned_lock:
            self._pinned = tuple(r for r in self._pinned if r[0] != address)

    def memcpy_htod_async(self, dst: int, src: int, count: int, stream: Any) -> None:
        if count:
            check(self._htod(dst, src, count, stream), "cuMemcpyHtoDAsync")

    def memcpy_dtoh_async(self, dst: int, src: int, count: int, stream: Any) -> None:
        if count:
            check(self._dtoh(dst, src, count, stream), "cuMemcpyDtoHAsync")

    # ---- unified memory ------------------------------------------------------------------------

    def mem_alloc_managed(self, size: int, flags: int) -> int:
        try:
            return int(check(self._cu.cuMemAllocManaged(size, flags), "cuMemAllocManaged"))
        finally:
            self._memory_changes += 1

    def mem_address_range(self, ptr: int) -> tuple[int, int]:
        base, size = check(self._cu.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
        return int(base), int(size)

    def _location(self, location_type: int, location_id: int) -> Any:
        cu = self._cu
        loc = cu.CUmemLocation()
        loc.type = cu.CUmemLocationType(location_type)
        if location_type == int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE):
            location_id = self._ordinal(location_id)
        loc.id = location_id
        return loc

    def mem_advise(self, ptr: int, count: int, advice: int, location_type: int,
                   location_id: int) -> None:
        cu = self._cu
        check(cu.cuMemAdvise(ptr, count, cu.CUmem_advise(advice),
                             self._location(location_type, location_id)), "cuMemAdvise")

    def mem_prefetch(self, ptr: int, count: int, location_type: int, location_id: int,
                     flags: int, stream: Any) -> None:
        check(self._cu.cuMemPrefetchAsync(ptr, count, self._location(location_type, location_id),
                                          flags, stream), "cuMemPrefetchAsync")

    def mem_range_attribute(self, ptr: int, count: int, attribute: int, data_size: int) -> bytes:
        values = self._range_attribute(ptr, count, attribute, data_size)
        translate = attribute in RANGE_ATTR_DEVICE_IDS
        if attribute in RANGE_ATTR_ID_TYPE:  # an id is a device ordinal only for device locations
            [kind] = self._range_attribute(ptr, count, RANGE_ATTR_ID_TYPE[attribute], 4)
            translate = kind == int(self._cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE)
        ints = [self._index_of_ordinal(v) if translate else v for v in values]
        out = b"".join(int(v).to_bytes(4, "little", signed=True) for v in ints)
        return out[:data_size].ljust(data_size, b"\0")

    def _range_attribute(self, ptr: int, count: int, attribute: int, data_size: int) -> list[int]:
        """cuMemRangeGetAttribute's 32-bit values, called through ctypes: cuda-bindings' wrapper
        refuses the location type and id attributes (5-8: "Unsupported attribute")."""
        fn = self._range_attribute_fn
        if fn is None:
            fn = ctypes.CDLL("libcuda.so.1").cuMemRangeGetAttribute
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64,
                           ctypes.c_size_t]
            fn.restype = ctypes.c_int
            self._range_attribute_fn = fn
        out = (ctypes.c_int32 * max(data_size // 4, 1))()
        err = fn(out, data_size, attribute, ptr, count)
        if err:
            raise BackendError(err, f"cuMemRangeGetAttribute({attribute}): {err}")
        return list(out)

    def stream_attach_mem(self, stream: Any, ptr: int, length: int, flags: int) -> None:
        check(self._cu.cuStreamAttachMemAsync(stream, ptr, length, flags), "cuStreamAttachMemAsync")

    def managed_residency(self, device: int) -> tuple[int, int] | None:
        """The driver reports no per-device residency of managed pages."""
        return None

    # ---- streams and events ------------------------------------------------------------------
    # Runtime and driver flags share values (driver_types.h vs cuda.h, CUDA 13.0):
    # cudaStreamNonBlocking 1 = CU_STREAM_NON_BLOCKING; cudaEventBlockingSync 1,
    # cudaEventDisableTiming 2, cudaEventInterprocess 4 = CU_EVENT_* of the same values.

    def stream_create(self, flags: int, priority: int) -> Any:
        """A whole-GPU stream, even while a partition is current (the daemon's own streams,
        made lazily on a vGPU thread that may be serving a capped session)."""
        if getattr(self._tls, "partition", None) is None:
            return check(self._cu.cuStreamCreateWithPriority(flags, priority),
                         "cuStreamCreateWithPriority")
        cu = self._cu
        check(cu.cuCtxPushCurrent(self._contexts[self._index(self._tls.device)]), "cuCtxPushCurrent")
        try:
            return check(cu.cuStreamCreateWithPriority(flags, priority),
                         "cuStreamCreateWithPriority")
        finally:
            check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def partition_stream_create(self, partition: Any, flags: int, priority: int) -> Any:
        return check(self._cu.cuGreenCtxStreamCreate(partition.green, flags, priority),
                     "cuGreenCtxStreamCreate")

    def stream_destroy(self, stream: Any) -> None:
        check(self._cu.cuStreamDestroy(stream), "cuStreamDestroy")

    def stream_synchronize(self, stream: Any) -> None:
        check(self._sync(stream), "cuStreamSynchronize")

    def stream_query(self, stream: Any) -> bool:
        return self._ready(self._cu.cuStreamQuery(stream), "cuStreamQuery")

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        check(self._cu.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")

    # ---- graphs ----

    def stream_begin_capture(self, stream: Any) -> None:
        cu = self._cu
        check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")

    def stream_end_capture(self, stream: Any) -> Any:
        return check(self._cu.cuStreamEndCapture(stream), "cuStreamEndCapture")

    def graph_instantiate(self, graph: Any) -> tuple[Any, int]:
        cu = self._cu
        try:
            nodes = check(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1]
            return check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate"), int(nodes)
        finally:
            check(cu.cuGraphDestroy(graph), "cuGraphDestroy")

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        check(self._cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")

    def graph_exec_destroy(self, graph_exec: Any) -> None:
        check(self._cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")

    def event_create(self, flags: int) -> Any:
        return check(self._cu.cuEventCreate(flags), "cuEventCreate")

    def event_destroy(self, event: Any) -> None:
        check(self._cu.cuEventDestroy(event), "cuEventDestroy")

    def event_record(self, event: Any, stream: Any) -> None:
        check(self._cu.cuEventRecord(event, stream), "cuEventRecord")

    def event_synchronize(self, event: Any) -> None:
        check(self._cu.cuEventSynchronize(event), "cuEventSynchronize")

    def event_query(self, event: Any) -> bool:
        return self._ready(self._cu.cuEventQuery(event), "cuEventQuery")

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        # The binding returns (CUresult, float milliseconds).
        return float(check(self._cu.cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    @staticmethod
    def _ready(result: tuple[Any, ...], call: str) -> bool:
        err = result[0]
        if not err:
            return True
        if int(err) == _CU_ERROR_NOT_READY:
            return False
        raise error(err, call)

    # ---- execution ---------------------------------------------------------------------------

    def link(self, inputs: list[Any], options: list[tuple[int, int]]) -> tuple[bytes, str]:
        return _LINKER.link(inputs, options)

    def module_load(self, image: bytes) -> Any:
        """cuda-python takes the image as any buffer-protocol object and holds the export only
        for the call, which is all the driver needs (it copies what it keeps). Fatbins and
        cubins carry their own length; PTX text is read up to a NUL, so a PTX image without one
        gets it appended here rather than letting the driver read past the buffer."""
        head = bytes(image[:4])
        if head not in (_FATBIN_MAGIC, _ELF_MAGIC) and (len(image) == 0 or image[-1] != 0):
            image = bytes(image) + b"\0"
        cu = self._cu
        self._memory_changes += 1  # before the first reading: a load measured meanwhile sees it
        changes = self._memory_changes
        free_before = int(check(cu.cuMemGetInfo(), "cuMemGetInfo")[0])
        module = check(cu.cuModuleLoadData(image), "cuModuleLoadData")
        self._load_functions(module)
        taken = free_before - int(check(cu.cuMemGetInfo(), "cuMemGetInfo")[0])
        if self._memory_changes != changes:
            # Another vGPU thread allocated, freed or loaded meanwhile: the difference is
            # partly (or all) theirs, so it is no measure of this load (issue 30: a 4 GiB
            # scratch allocated meanwhile was charged to the module). Its named variables are.
            log.debug("module load measured while other memory changed: %d bytes not charged", taken)
            taken = 0
        self._memory_changes += 1
        with self._load_lock:
            self._load_taken[int(module)] = max(0, taken)
        return module

    def _load_functions(self, module: Any) -> None:
        """Under lazy loading (CUDA_MODULE_LOADING=LAZY, the default) the driver loads a
        function, and what it uses, at its first launch: load them now (CUDA 12.4+), so the
        memory the module takes is taken, and measured, at the load. Best effort."""
        cu = self._cu
        try:
            count = check(cu.cuModuleGetFunctionCount(module), "cuModuleGetFunctionCount")
            for func in check(cu.cuModuleEnumerateFunctions(count, module), "cuModuleEnumerateFunctions"):
                check(cu.cuFuncLoad(func), "cuFuncLoad")
        except (AttributeError, TypeError, BackendError):  # before CUDA 12.4, or refused
            pass

    # A load that took less than this was the driver's code pages and pools, shared by modules
    # and other allocations of the same moment; more is the module's variables (issue 27).
    LOAD_SLACK = 4 << 20

    def module_loaded_bytes(self, module: Any, image: bytes) -> int:
        """The driver's sizes of the variables the image names (every readable entry's, PTX
        declarations too: cuModuleGetGlobal), or the device memory the load took, whichever is
        larger: an image pilot cannot read (compressed) is charged what the load took."""
        with self._load_lock:
            taken = self._load_taken.pop(int(module), 0)
        seen: dict[int, int] = {}
        try:
            names = variable_names(image)
        except ValueError:  # the driver loaded what pilot's reader cannot read
            names = set()
        for name in names:
            try:
                address, size = self.module_get_global(module, name)
            except BackendError:
                continue
            seen[address] = size
        named = sum(seen.values())
        return max(named, taken if taken >= self.LOAD_SLACK else 0)

    def module_unload(self, module: Any) -> None:
        with self._load_lock:
            self._load_taken.pop(int(module), None)
        check(self._cu.cuModuleUnload(module), "cuModuleUnload")

    def function_get(self, module: Any, name: str) -> FunctionInfo:
        cu = self._cu
        func = check(cu.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
        # Attributes first: under lazy loading (CUDA_MODULE_LOADING=LAZY, the default) they
        # load the function, after which every query below is answered.
        attr = cu.CUfunction_attribute
        max_threads = check(
            cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, func),
            "cuFuncGetAttribute",
        )
        static_shared = check(
            cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, func),
            "cuFuncGetAttribute",
        )
        max_dynamic = check(
            cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, func),
            "cuFuncGetAttribute",
        )
        # No parameter-count API exists: indexes past the last parameter give
        # CUDA_ERROR_INVALID_VALUE. The bound is the 32764-byte parameter limit, so a driver
        # misbehaving cannot loop us forever.
        params: list[tuple[int, int]] = []
        for index in range(32768):
            res = cu.cuFuncGetParamInfo(func, index)
            if res[0]:
                if int(res[0]) == _CU_ERROR_INVALID_VALUE:
                    break
                raise error(res[0], "cuFuncGetParamInfo")
            params.append((int(res[1]), int(res[2])))
        return FunctionInfo(
            handle=func,
            params=params,
            max_threads_per_block=int(max_threads),
            static_shared_bytes=int(static_shared),
            max_dynamic_shared_bytes=int(max_dynamic),
        )

    def module_get_global(self, module: Any, name: str) -> tuple[int, int]:
        """cuModuleGetGlobal: the variable's address and size in this module (a module loaded
        from the client's image, so the memory is that session's)."""
        dptr, size = check(self._cu.cuModuleGetGlobal(module, name.encode()), "cuModuleGetGlobal")
        return int(dptr), int(size)

    def native_fast_functions(self) -> tuple[int, int, int, int] | None:
        """The driver's cuLaunchKernel, cuMemcpyDtoHAsync_v2, cuMemcpyHtoDAsync_v2 and
        cuStreamSynchronize, for the vGPU's fast path (daemon/native/fast_launch.c), which calls them
        with the CUfunction and CUstream values of this backend's handles."""
        try:
            launch, dtoh, htod, sync = _driver_addresses(
                "cuLaunchKernel", "cuMemcpyDtoHAsync_v2", "cuMemcpyHtoDAsync_v2", "cuStreamSynchronize")
        except (OSError, AttributeError) as exc:
            log.warning("no fast path: %s", exc)
            return None
        return (launch, dtoh, htod, sync) if launch and dtoh and htod and sync else None

    def native_wait_functions(self) -> tuple[int, ...] | None:
        """The driver's cuStreamQuery, cuEventCreate, cuEventRecord, cuEventSynchronize,
        cuEventDestroy and cuCtxGetCurrent: the fast path's GPU waits spin within pilotd's spin
        budget and otherwise sleep on a blocking-sync event (pilot_fast_waits)."""
        try:
            addresses = _driver_addresses("cuStreamQuery", "cuEventCreate", "cuEventRecord",
                                          "cuEventSynchronize", "cuEventDestroy_v2", "cuCtxGetCurrent")
        except (OSError, AttributeError) as exc:
            log.warning("GPU waits of the fast path spin as the context says: %s", exc)
            return None
        return addresses if all(addresses) else None

    def native_word_functions(self) -> tuple[int, ...] | None:
        """The driver's cuMemHostRegister_v2, cuMemHostGetDevicePointer_v2, cuMemHostUnregister,
        cuStreamWriteValue32_v2 and cuEventQuery: the fast path's completion words
        (daemon/native/fast_words.c), a synchronization answered before the GPU is done."""
        try:
            addresses = _driver_addresses("cuMemHostRegister_v2", "cuMemHostGetDevicePointer_v2",
                                          "cuMemHostUnregister", "cuStreamWriteValue32_v2",
                                          "cuEventQuery")
        except (OSError, AttributeError) as exc:
            log.warning("no completion words: %s", exc)
            return None
        return addresses if all(addresses) else None

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: Any,
        args: bytes,
    ) -> None:
        """Launch from the packed parameter buffer (kernelParams NULL, `extra` set), so the
        bytes the client packed go to the driver as they are. Accepts a FunctionInfo or its
        handle. Hot path: one reused per-thread _PackedArgs, no other allocation for bytes args.
        """
        if type(function) is FunctionInfo:
            function = function.handle
        extra = self._extra(args) if args else 0  # no call for a kernel without parameters
        gx, gy, gz = grid
        bx, by, bz = block
        try:
            err = self._launch_kernel(
                function, gx, gy, gz, bx, by, bz, shared_bytes, stream, None, extra
            )[0]
        except (OverflowError, TypeError, ValueError) as exc:  # negative or oversized numbers
            # CUDA 13's runtime reports a bad launch shape as cudaErrorInvalidValue (seen natively
            # on the H100), the driver's own code: no remapping.
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"cuLaunchKernel: {exc}") from None
        if err:
            raise error(err, "cuLaunchKernel")

    def _extra(self, args: bytes) -> int:
        """cuLaunchKernel's `extra` for a packed argument buffer (0 for no arguments), in this
        thread's _PackedArgs, which keeps the bytes alive until the thread's next launch."""
        size = len(args)
        if not size:
            return 0  # a kernel without parameters takes no buffer
        tls = self._tls
        try:
            packed = tls.packed
        except AttributeError:
            packed = tls.packed = _PackedArgs()
        packed.buf = args if type(args) is bytes else bytes(args)
        packed.size = size
        return int(packed.extra)

    # ---- limits, stream priorities, function attributes, occupancy, 2D memory ----------------
    # cudaLimit = CUlimit and cudaFuncAttribute = CUfunction_attribute, value for value (CUDA 13.0
    # headers); the driver clamps stream priorities itself.

    def _enum(self, kind: Any, value: int, what: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"no {what} {value}") from None

    def ctx_get_limit(self, limit: int) -> int:
        cu = self._cu
        return int(check(cu.cuCtxGetLimit(self._enum(cu.CUlimit, limit, "limit")), "cuCtxGetLimit"))

    def ctx_set_limit(self, limit: int, value: int) -> None:
        cu = self._cu
        check(cu.cuCtxSetLimit(self._enum(cu.CUlimit, limit, "limit"), value), "cuCtxSetLimit")

    def stream_priority_range(self) -> tuple[int, int]:
        least, greatest = check(self._cu.cuCtxGetStreamPriorityRange(),
                                "cuCtxGetStreamPriorityRange")
        return int(least), int(greatest)

    def stream_priority(self, stream: Any) -> int:
        return int(check(self._cu.cuStreamGetPriority(stream), "cuStreamGetPriority"))

    def function_attributes(self, function: Any) -> list[int]:
        cu = self._cu
        values = []
        for index in range(16):
            try:
                attr = cu.CUfunction_attribute(index)
            except ValueError:  # not in this binding: nothing to report
                values.append(0)
                continue
            res = cu.cuFuncGetAttribute(attr, function)
            values.append(0 if res[0] else int(res[1]))
        return values

    def function_set_attribute(self, function: Any, attr: int, value: int) -> None:
        cu = self._cu
        check(cu.cuFuncSetAttribute(function, self._enum(cu.CUfunction_attribute, attr,
                                                         "function attribute"), value),
              "cuFuncSetAttribute")

    def available_dynamic_smem(self, function: Any, num_blocks: int, block_size: int) -> int:
        return int(check(self._cu.cuOccupancyAvailableDynamicSMemPerBlock(
            function, num_blocks, block_size), "cuOccupancyAvailableDynamicSMemPerBlock"))

    def occupancy(self, function: Any, block_size: int, dynamic_smem: int, flags: int) -> int:
        return int(check(self._cu.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
            function, block_size, dynamic_smem, flags),
            "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"))

    def mem_alloc_pitch(self, width: int, height: int) -> tuple[int, int]:
        """cuMemAllocPitch with 16-byte elements, the widest it takes; on the H100 the pitch is
        the width rounded up to 512 for 4-, 8- and 16-byte elements alike, as cudaMallocPitch's."""
        try:
            ptr, pitch = check(self._cu.cuMemAllocPitch(width, height, 16), "cuMemAllocPitch")
        finally:
            self._memory_changes += 1
        return int(ptr), int(pitch)

    def _copy_2d(self, width: int, height: int, stream: Any, src: tuple[int, int, int],
                 dst: tuple[int, int, int]) -> None:
        """cuMemcpy2DAsync; src and dst are (CUmemorytype, address, pitch)."""
        cu = self._cu
        p = cu.CUDA_MEMCPY2D()
        for side, (kind, address, pitch) in (("src", src), ("dst", dst)):
            setattr(p, side + "MemoryType", cu.CUmemorytype(kind))
            setattr(p, side + ("Host" if kind == _MEMORY_HOST else "Device"), address)
            setattr(p, side + "Pitch", pitch)
        p.WidthInBytes = width
        p.Height = height
        check(cu.cuMemcpy2DAsync(p, stream), "cuMemcpy2DAsync")

    def memcpy_2d_htod(self, dst: int, dpitch: int, src: Any, spitch: int, width: int,
                       height: int, stream: Any) -> None:
        """Like memcpy_htod: a pageable source is staged by the driver before the call returns;
        a registered one is DMA'd later, so the stream is synchronized first."""
        if not width or not height:
            return
        view = _export(src, (height - 1) * spitch + width, writable=False)
        try:
            self._copy_2d(width, height, stream, (_MEMORY_HOST, view.buf, spitch),
                          (_MEMORY_DEVICE, dst, dpitch))
            if self._pinned and self._is_pinned(view.buf, view.len):
                check(self._sync(stream), "cuStreamSynchronize")
        finally:
            _release_buffer(ctypes.byref(view))

    def memcpy_2d_dtoh(self, dst: Any, dpitch: int, src: int, spitch: int, width: int,
                       height: int, stream: Any) -> None:
        if not width or not height:
            return
        view = _export(dst, (height - 1) * dpitch + width, writable=True)
        try:
            self._copy_2d(width, height, stream, (_MEMORY_DEVICE, src, spitch),
                          (_MEMORY_HOST, view.buf, dpitch))
            check(self._sync(stream), "cuStreamSynchronize")
        finally:
            _release_buffer(ctypes.byref(view))

    def memcpy_2d_dtod(self, dst: int, dpitch: int, src: int, spitch: int, width: int,
                       height: int, stream: Any) -> None:
        if width and height:
            self._copy_2d(width, height, stream, (_MEMORY_DEVICE, src, spitch),
                          (_MEMORY_DEVICE, dst, dpitch))

    def memset_2d_d8(self, ptr: int, pitch: int, value: int, width: int, height: int,
                     stream: Any) -> None:
        if width and height:
            check(self._cu.cuMemsetD2D8Async(ptr, pitch, value & 0xFF, width, height, stream),
                  "cuMemsetD2D8Async")

    # ---- CUDA arrays, texture and surface objects (daemon/ops/arrays.py) ---------------------

    def _format(self, desc: ChannelDesc) -> Any:
        """The CUarray_format of a checked channel format (the runtime's cudaChannelFormatDesc
        to the driver's format and channel count, as cudart converts them)."""
        code = {(CHANNEL_UNSIGNED, 8): 0x01, (CHANNEL_UNSIGNED, 16): 0x02,
                (CHANNEL_UNSIGNED, 32): 0x03, (CHANNEL_SIGNED, 8): 0x08,
                (CHANNEL_SIGNED, 16): 0x09, (CHANNEL_SIGNED, 32): 0x0A,
                (CHANNEL_FLOAT, 16): 0x10, (CHANNEL_FLOAT, 32): 0x20}[(desc.f, desc.bits)]
        return self._cu.CUarray_format(code)

    def array_create(self, width: int, height: int, depth: int, desc: ChannelDesc,
                     flags: int) -> Any:
        cu = self._cu
        d = cu.CUDA_ARRAY3D_DESCRIPTOR()
        d.Width, d.Height, d.Depth = width, height, depth
        d.Format = self._format(desc)
        d.NumChannels = desc.channels
        d.Flags = flags  # CUDA_ARRAY3D_LAYERED 1, SURFACE_LDST 2, CUBEMAP 4, TEXTURE_GATHER 8
        handle = check(cu.cuArray3DCreate(d), "cuArray3DCreate")
        return _Array(width, height, depth, desc, handle)

    def array_destroy(self, array: Any, stream: Any) -> None:
        """Zeroed rows at a time from a zeroed block of device memory (at most _ZERO_CHUNK;
        pageable zeros when even that cannot be had: the GPU may be full), then destroyed."""
        cu = self._cu
        row, rows = array.row_bytes, array.rows
        per = max(1, min(rows, _ZERO_CHUNK // row))
        res = cu.cuMemAlloc(row * per)
        block = 0 if res[0] else int(res[1])
        try:
            if block:
                check(cu.cuMemsetD8Async(block, 0, row * per, stream), "cuMemsetD8Async")
                zeros = CopySide("device", ptr=block, pitch=row, rows=per)
            else:
                zeros = CopySide("host", buffer=bytes(row * per), pitch=row, rows=per)
            for z in range(array.slices):
                for y in range(0, rows, per):
                    self.memcpy_3d(CopySide("array", array=array, y=y, z=z), zeros, row,
                                   min(per, rows - y), 1, stream)
            check(self._sync(stream), "cuStreamSynchronize")
        finally:
            if block:
                check(cu.cuMemFree(block), "cuMemFree")
        check(cu.cuArrayDestroy(array.handle), "cuArrayDestroy")

    def memcpy_3d(self, dst: CopySide, src: CopySide, width: int, height: int, depth: int,
                  stream: Any) -> None:
        """cuMemcpy3DAsync. A host source is pageable (staged by the driver before the call
        returns) unless registered, then the stream is synchronized; a host destination always."""
        if not (width and height and depth):
            return
        cu = self._cu
        p = cu.CUDA_MEMCPY3D()
        views = []
        try:
            for name, side in (("src", src), ("dst", dst)):
                if side.kind == "host":
                    view = _export(side.buffer, ((depth - 1) * side.rows + height - 1) * side.pitch
                                   + width, writable=name == "dst")
                    views.append(view)
                    setattr(p, name + "MemoryType", cu.CUmemorytype(_MEMORY_HOST))
                    setattr(p, name + "Host", view.buf)
                elif side.kind == "device":
                    setattr(p, name + "MemoryType", cu.CUmemorytype(_MEMORY_DEVICE))
                    setattr(p, name + "Device", side.ptr)
                else:
                    setattr(p, name + "MemoryType", cu.CUmemorytype(_MEMORY_ARRAY))
                    setattr(p, name + "Array", side.array.handle)
                if side.kind != "array":
                    setattr(p, name + "Pitch", side.pitch)
                    setattr(p, name + "Height", side.rows)
                setattr(p, name + "XInBytes", side.x)
                setattr(p, name + "Y", side.y)
                setattr(p, name + "Z", side.z)
            p.WidthInBytes, p.Height, p.Depth = width, height, depth
            check(cu.cuMemcpy3DAsync(p, stream), "cuMemcpy3DAsync")
            if dst.kind == "host" or (src.kind == "host" and self._pinned and
                                      self._is_pinned(views[0].buf, views[0].len)):
                check(self._sync(stream), "cuStreamSynchronize")
        finally:
            for view in views:
                _release_buffer(ctypes.byref(view))

    def _resource_desc(self, resource: Resource) -> Any:
        cu = self._cu
        rd = cu.CUDA_RESOURCE_DESC()
        rd.resType = cu.CUresourcetype(resource.type)  # the runtime's numbering is the driver's
        if resource.type == RESOURCE_ARRAY:
            rd.res.array.hArray = resource.array.handle
            return rd
        assert resource.desc is not None
        res = rd.res.linear if resource.type == RESOURCE_LINEAR else rd.res.pitch2D
        res.devPtr = resource.ptr
        res.format = self._format(resource.desc)
        res.numChannels = resource.desc.channels
        if resource.type == RESOURCE_LINEAR:
            res.sizeInBytes = resource.size
        else:
            res.width, res.height, res.pitchInBytes = resource.width, resource.height, resource.pitch
        return rd

    def texture_create(self, resource: Resource, texture: TextureDesc,
                       view: ViewDesc | None) -> int:
        """The runtime's cudaTextureDesc as cudart gives it to the driver: element-type reads of
        integer formats are CU_TRSF_READ_AS_INTEGER, normalized coordinates, sRGB, trilinear and
        seamless-cubemap settings are flags."""
        cu = self._cu
        desc = resource.array.desc if resource.type == RESOURCE_ARRAY else resource.desc
        td = cu.CUDA_TEXTURE_DESC()
        td.addressMode = [cu.CUaddress_mode(m) for m in texture.address_mode]
        td.filterMode = cu.CUfilter_mode(texture.filter_mode)
        flags = 0
        if texture.read_mode == 0 and desc is not None and desc.f != CHANNEL_FLOAT:
            flags |= 0x01  # CU_TRSF_READ_AS_INTEGER
        if texture.normalized_coords:
            flags |= 0x02  # CU_TRSF_NORMALIZED_COORDINATES
        if texture.srgb:
            flags |= 0x10  # CU_TRSF_SRGB
        if texture.disable_trilinear_optimization:
            flags |= 0x20  # CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION
        if texture.seamless_cubemap:
            flags |= 0x40  # CU_TRSF_SEAMLESS_CUBEMAP
        td.flags = flags
        td.maxAnisotropy = texture.max_anisotropy
        td.mipmapFilterMode = cu.CUfilter_mode(texture.mipmap_filter_mode)
        td.mipmapLevelBias = texture.mipmap_level_bias
        td.minMipmapLevelClamp = texture.min_mipmap_level_clamp
        td.maxMipmapLevelClamp = texture.max_mipmap_level_clamp
        td.borderColor = list(texture.border_color)
        vd = None
        if view is not None:
            vd = cu.CUDA_RESOURCE_VIEW_DESC()
            vd.format = cu.CUresourceViewFormat(view.format)
            vd.width, vd.height, vd.depth = view.width, view.height, view.depth
            vd.firstMipmapLevel, vd.lastMipmapLevel = view.first_mipmap_level, view.last_mipmap_level
            vd.firstLayer, vd.lastLayer = view.first_layer, view.last_layer
        handle = check(cu.cuTexObjectCreate(self._resource_desc(resource), td, vd),
                       "cuTexObjectCreate")
        return int(handle)

    def texture_destroy(self, texture: int) -> None:
        check(self._cu.cuTexObjectDestroy(self._cu.CUtexObject(texture)), "cuTexObjectDestroy")

    def surface_create(self, array: Any) -> int:
        handle = check(self._cu.cuSurfObjectCreate(
            self._resource_desc(Resource(RESOURCE_ARRAY, array=array))), "cuSurfObjectCreate")
        return int(handle)

    def surface_destroy(self, surface: int) -> None:
        check(self._cu.cuSurfObjectDestroy(self._cu.CUsurfObject(surface)), "cuSurfObjectDestroy")


    # ---- several devices, launches with attributes (devices.py, execution.py) ---------------

    def can_access_peer(self, device: int, peer: int) -> bool:
        cu = self._cu
        return bool(check(cu.cuDeviceCanAccessPeer(self._devices[self._index(device)],
                                                   self._devices[self._index(peer)]),
                          "cuDeviceCanAccessPeer"))

    def enable_peer_access(self, device: int, peer: int) -> None:
        """cuCtxEnablePeerAccess in `device`'s primary context (the vGPU thread's own); every
        tenant of the context shares the result, so "already enabled" is success."""
        cu = self._cu
        with self._context(device):
            res = cu.cuCtxEnablePeerAccess(self._contexts[self._index(peer)], 0)
        if res[0] and int(res[0]) != _CU_ERROR_PEER_ACCESS_ALREADY_ENABLED:
            raise error(res[0], "cuCtxEnablePeerAccess")

    def memcpy_peer(self, dst: int, dst_device: int, src: int, src_device: int, count: int,
                    stream: Any) -> None:
        if count:
            check(self._cu.cuMemcpyPeerAsync(dst, self._contexts[self._index(dst_device)], src,
                                             self._contexts[self._index(src_device)], count, stream),
                  "cuMemcpyPeerAsync")

    def launch_ex(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                  shared_bytes: int, stream: Any, args: bytes, attrs: LaunchAttrs) -> None:
        """cuLaunchKernelEx with the packed buffer in `extra` (as launch()) and the attributes
        as CUlaunchAttribute entries; the driver validates cooperative grids and clusters."""
        cu = self._cu
        if type(function) is FunctionInfo:
            function = function.handle
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = shared_bytes
        cfg.hStream = stream
        ids = cu.CUlaunchAttributeID
        items = []
        if attrs.cooperative:
            a = cu.CUlaunchAttribute()
            a.id = ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            a.value.cooperative = 1
            items.append(a)
        if attrs.cluster is not None:
            a = cu.CUlaunchAttribute()
            a.id = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = attrs.cluster
            items.append(a)
        if attrs.cluster_policy:
            a = cu.CUlaunchAttribute()
            a.id = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
            a.value.clusterSchedulingPolicyPreference = self._enum(
                cu.CUclusterSchedulingPolicy, attrs.cluster_policy, "cluster scheduling policy")
            items.append(a)
        if attrs.priority is not None:
            a = cu.CUlaunchAttribute()
            a.id = ids.CU_LAUNCH_ATTRIBUTE_PRIORITY
            a.value.priority = attrs.priority
            items.append(a)
        cfg.attrs = items
        cfg.numAttrs = len(items)
        extra = self._extra(args)
        try:
            err = cu.cuLaunchKernelEx(cfg, function, None, extra)[0]
        except (OverflowError, TypeError, ValueError) as exc:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"cuLaunchKernelEx: {exc}") from None
        if err:
            raise error(err, "cuLaunchKernelEx")

    # ---- host callbacks (callbacks.py) -------------------------------------------------------

    def map_host(self, address: int, size: int) -> None:
        """Register gate memory: portable (every context) and mapped (streams wait on it)."""
        with self._context(getattr(self._tls, "device", 0)):
            check(self._cu.cuMemHostRegister(address, size,
                                             _HOST_REGISTER_PORTABLE | _HOST_REGISTER_DEVICEMAP),
                  "cuMemHostRegister")

    def host_device_pointer(self, address: int) -> int:
        return int(check(self._cu.cuMemHostGetDevicePointer(address, 0), "cuMemHostGetDevicePointer"))

    def _driver_entry(self, name: str, *argtypes: Any) -> Any:
        """A driver function called through ctypes (CFUNCTYPE: the GIL is released for the call),
        found with cuGetProcAddress so it is the same driver cuda-python loaded."""
        cu = self._cu
        res = cu.cuGetProcAddress(name.encode(), 13000,
                                  cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT)
        if res[0] or not res[1]:
            raise BackendError(CUDA_ERROR_NOT_SUPPORTED, f"cuGetProcAddress({name}) failed")
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(int(res[1]))

    def _gate_entries(self, stream: Any, word: int) -> None:
        """Resolve the entry points and probe cuStreamWaitValue32 once (on a scratch stream,
        with a condition that already holds: `word` is the gate word's current value)."""
        with self._gate_lock:
            if self._launch_host_func is None:
                vp = ctypes.c_void_p
                self._launch_host_func = self._driver_entry("cuLaunchHostFunc", vp, vp, vp)
                self._add_callback = self._driver_entry("cuStreamAddCallback", vp, vp, vp,
                                                        ctypes.c_uint)
            if self._wait_value_ok is None:
                cu = self._cu
                scratch = check(cu.cuStreamCreate(1), "cuStreamCreate")
                try:
                    res = cu.cuStreamWaitValue32(scratch, word[0], word[1],
                                                 cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
                    if res[0] and int(res[0]) != _CU_ERROR_NOT_SUPPORTED:
                        raise error(res[0], "cuStreamWaitValue32")
                    self._wait_value_ok = not res[0]
                    check(self._sync(scratch), "cuStreamSynchronize")
                finally:
                    check(cu.cuStreamDestroy(scratch), "cuStreamDestroy")

    def gate(self, stream: Any, gate: Gate) -> None:
        """pilot_gate_fire as a host function (cuLaunchHostFunc; cuStreamAddCallback for
        cudaStreamAddCallback, whose callback also runs after an error, with the status), then
        cuStreamWaitValue32 on the gate's word. Without stream memory operations the host
        function waits for the word itself (gate.wait = 1), which holds the stream just as well
        but occupies the driver's callback thread meanwhile."""
        slot = _pffi.cast("pilot_gate *", gate.address)
        if self._wait_value_ok is None or self._launch_host_func is None:
            self._gate_entries(stream, (gate.device_address, int(slot.word)))
        if not self._wait_value_ok:
            slot.wait = 1
        handle = int(stream)
        if gate.stream_callback:
            fn = int(_pffi.cast("uintptr_t", _pffi.addressof(_plib, "pilot_gate_fire_status")))
            rc = self._add_callback(handle, fn, gate.address, 0)
            call = "cuStreamAddCallback"
        else:
            fn = int(_pffi.cast("uintptr_t", _pffi.addressof(_plib, "pilot_gate_fire")))
            rc = self._launch_host_func(handle, fn, gate.address)
            call = "cuLaunchHostFunc"
        if rc:
            raise error(self._cu.CUresult(rc), call)
        if self._wait_value_ok:
            cu = self._cu
            res = cu.cuStreamWaitValue32(stream, gate.device_address, gate.target,
                                         cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
            if res[0]:
                # The host function is queued already: it must not be undone (its token would
                # come back after the slot was reused). Make it wait for the word itself.
                slot.wait = 1
                log.error(
                    "cuStreamWaitValue32 failed (%s); this gate holds the callback thread instead",
                    _describe(res[0])[0])

    def kick(self) -> None:
        """The GPU polls the gate words itself: nothing to do."""

    def stream_write_word(self, stream: Any, address: int, value: int) -> None:
        cu = self._cu
        check(cu.cuStreamWriteValue32(stream, address, value,
                                      cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT),
              "cuStreamWriteValue32")

    def stream_wait_word(self, stream: Any, address: int, value: int) -> None:
        cu = self._cu
        check(cu.cuStreamWaitValue32(stream, address, value,
                                     cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ),
              "cuStreamWaitValue32")


    # ---- SM partitions (green contexts; compute shares, resources/shares.py) -----------------

    def _sm_resource(self, device: int) -> Any:
        cu = self._cu
        return check(cu.cuDeviceGetDevResource(self._devices[self._index(device)],
                                               cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                     "cuDeviceGetDevResource")

    def _units(self, device: int) -> tuple[list[Any], Any]:
        """The device's SMs split into as many groups of the smallest partition as it makes
        (deterministic: the same SMs each time), and the SMs left over."""
        res = self._sm_resource(device)
        unit = int(res.sm.minSmPartitionSize) or 8
        groups, count, rest = check(self._cu.cuDevSmResourceSplitByCount(
            max(1, int(res.sm.smCount) // unit), res, 0, unit), "cuDevSmResourceSplitByCount")
        groups = list(groups) if isinstance(groups, (list, tuple)) else [groups]
        return groups[:int(count)], rest

    def sm_layout(self, device: int) -> SmLayout | None:
        """None where the driver has no green contexts (before CUDA 12.4, or a device that
        cannot split its SMs), or with PILOT_SM_SHARES=0: shares are then not enforced.

        Verified on the H100 (bench/RESULTS.md, 2026-11-23): pilot's share check (a 25% tenant
        at 0.243 of its alone throughput, an uncapped one beside it at 0.758) and every
        program of the compare suite, memory-touching kernels, managed memory, callbacks and a
        fault included, identical to native while running in a 64-SM partition. (An earlier
        probe's kernels faulted in green contexts: a bug of the probe, not of the partitions.)
        PILOT_SM_SHARES=0 is the operator's way out should a driver misbehave."""
        if os.environ.get(SM_SHARES_ENV) == "0":
            log.warning("device %d: compute shares are recorded but not enforced (%s=0)",
                        device, SM_SHARES_ENV)
            return None
        try:
            groups, rest = self._units(device)
        except (BackendError, AttributeError) as exc:
            log.warning("device %d cannot be partitioned (%s): compute shares are not enforced",
                        device, exc)
            return None
        if not groups:
            return None
        unit = int(groups[0].sm.smCount)
        return SmLayout(sms=unit * len(groups) + int(rest.sm.smCount), unit=unit,
                        units=len(groups), spare=int(rest.sm.smCount))

    def partition_create(self, device: int, units: tuple[int, ...], spare: bool) -> Any:
        """A green context over the chosen groups (and the leftover SMs), made from a fresh
        split, which gives the same SMs every time. If the driver refuses the leftover SMs in
        the descriptor, the partition goes without them (logged)."""
        groups, rest = self._units(device)
        chosen = [groups[u] for u in units]
        try:
            return self._green(device, [*chosen, rest] if spare and int(rest.sm.smCount) else chosen)
        except BackendError as exc:
            if not spare or not chosen:
                raise
            log.warning("device %d: the %d leftover SMs cannot join a partition (%s)", device,
                        int(rest.sm.smCount), exc)
            return self._green(device, chosen)

    def _green(self, device: int, resources: list[Any]) -> _Partition:
        cu = self._cu
        desc = check(cu.cuDevResourceGenerateDesc(resources, len(resources)),
                     "cuDevResourceGenerateDesc")
        green = check(cu.cuGreenCtxCreate(desc, self._devices[self._index(device)],
                                          cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM),
                      "cuGreenCtxCreate")
        ctx = check(cu.cuCtxFromGreenCtx(green), "cuCtxFromGreenCtx")
        sms = check(cu.cuCtxGetDevResource(ctx, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                    "cuCtxGetDevResource")
        return _Partition(device, green, ctx, int(sms.sm.smCount))

    def partition_destroy(self, partition: Any) -> None:
        check(self._cu.cuGreenCtxDestroy(partition.green), "cuGreenCtxDestroy")

    def use_partition(self, device: int, partition: Any) -> None:
        """cuCtxSetCurrent of the partition's context (about 1 us on the H100), so that the
        session's modules, events and streams are created in it and its launches run in it."""
        ctx = self._contexts[self._index(device)] if partition is None else partition.ctx
        check(self._cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._tls.partition = partition


    # ---- cuDNN (backends/cudnn.py) ----

    def dnn_version(self) -> tuple[int, int]:
        return self._dnn.version()

    def dnn_create(self) -> Any:
        return self._dnn.create(getattr(self._tls, "device", 0))

    def dnn_release(self, handle: Any) -> None:
        self._dnn.release(handle)

    def dnn_desc_create(self, dtype: int) -> Any:
        return self._dnn.desc_create(dtype)

    def dnn_desc_set(self, desc: Any, attr: int, atype: int, count: int,
                     value: bytes | list[Any]) -> None:
        self._dnn.desc_set(desc, attr, atype, count, value)

    def dnn_desc_get(self, desc: Any, attr: int, atype: int, requested: int,
                     descs: list[Any] | None) -> tuple[int, bytes]:
        return self._dnn.desc_get(desc, attr, atype, requested, descs)

    def dnn_desc_finalize(self, desc: Any) -> None:
        self._dnn.desc_finalize(desc)

    def dnn_desc_destroy(self, desc: Any) -> None:
        self._dnn.desc_destroy(desc)

    def dnn_execute(self, handle: Any, plan: Any, uids: list[int], pointers: list[int],
                    workspace: int, stream: Any) -> None:
        self._dnn.execute(handle, plan, uids, pointers, workspace, _stream_ptr(stream))

    def dnn_batchnorm(self, handle: Any, call: Any, stream: Any) -> int:
        return self._dnn.batchnorm(handle, call, None if stream is None else _stream_ptr(stream))

    # ---- CUDA math libraries (backends/cublas.py) ----

    def library_version(self, library: int) -> int:
        return self._libraries.version(library)

    def library_create(self, library: int) -> Any:
        return self._libraries.create(library, getattr(self._tls, "device", 0))

    def library_release(self, handle: Any) -> None:
        if handle.scratch:  # GEMMs still queued may read the pointer arrays in it
            self.stream_synchronize(handle.scratch_stream)
            self.mem_free(handle.scratch[0])
            handle.scratch = None
        self._libraries.release(handle)

    def _own_pointer_arrays(self, handle: Any, arrays: list[tuple[int, ...]], stream: Any) -> list[int]:
        """pilotd's own device copy of the checked pointer arrays, in the handle's scratch (kept
        and reused in stream order; when the handle's stream changed, or the scratch must grow,
        the last stream's calls, which may still read it, are waited for first); the address of
        each array."""
        packed = b"".join(struct.pack(f"<{len(a)}Q", *a) for a in arrays)
        if handle.scratch is not None and (handle.scratch[1] < len(packed) or
                                           _stream_ptr(handle.scratch_stream) != _stream_ptr(stream)):
            self.stream_synchronize(handle.scratch_stream)
            if handle.scratch[1] < len(packed):
                self.mem_free(handle.scratch[0])
                handle.scratch = None
        if handle.scratch is None:
            size = max(len(packed), 4096)
            handle.scratch = (self.mem_alloc(size), size)
        handle.scratch_stream = stream
        self.memcpy_htod(handle.scratch[0], packed, len(packed), stream)
        out, at = [], handle.scratch[0]
        for a in arrays:
            out.append(at)
            at += 8 * len(a)
        return out

    def blas_gemm(self, handle: Any, call: GemmCall, settings: BlasSettings, stream: Any) -> None:
        if call.arrays is not None:
            a, b, c = self._own_pointer_arrays(handle, list(call.arrays), stream)
            call = replace(call, a=a, b=b, c=c)
        self._libraries.gemm(handle, call, settings, _stream_ptr(stream))

    def blaslt_matmul(self, handle: Any, call: LtCall, key: bytes, stream: Any) -> None:
        self._libraries.lt_matmul(handle, call, key, _stream_ptr(stream))

    def blaslt_heuristic(self, handle: Any, call: LtCall, key: bytes, requested: int) -> list[bytes]:
        return self._libraries.lt_heuristic(handle, call, key, requested)

    def fast_library_functions(self) -> dict[int, int]:
        out = {**self._libraries.fast_functions(), **self._dnn.fast_functions()}
        try:
            out[0], out[_plib.PILOT_FAST_GRAPH_LAUNCH] = _driver_addresses("cuMemsetD8Async",
                                                                           "cuGraphLaunch")
        except (OSError, AttributeError):
            pass
        return out

    def fast_library_handle(self, handle: Any) -> int:
        return int(handle.ptr)

    def fast_lt_descriptors(self, handle: Any, key: bytes) -> list[int] | None:
        made = handle.lt_cache.get(b"M" + key)
        return [p for _, p in made[:5]] if made else None

    def fast_lt_evicted(self, handle: Any) -> list[bytes]:
        out, handle.lt_evicted = handle.lt_evicted, []
        return out

    def library_state_reset(self, handle: Any) -> None:
        handle.stream = None
        if hasattr(handle, "modes"):  # a cuBLAS handle's settings too
            handle.workspace = handle.modes = None

    def fast_dnn_plan(self, plan: Any) -> int:
        return int(plan)

    def fast_graph_exec(self, graph_exec: Any) -> int:
        return int(graph_exec)

    def blas_call(self, handle: Any, fn: Any, args: list[int], named: dict[str, int],
                  scalars: list[bytes], settings: BlasSettings, stream: Any,
                  host_result: bool, arrays: dict[str, tuple[int, ...]]) -> bytes | None:
        if arrays:
            args = list(args)
            own = self._own_pointer_arrays(handle, list(arrays.values()), stream)
            for name, address in zip(arrays, own, strict=True):
                args[fn.params.index(name)] = address
        return self._libraries.call(handle, fn, args, scalars, settings, _stream_ptr(stream),
                                    host_result)


def _driver_addresses(*names: str) -> tuple[int, ...]:
    """The addresses of libcuda's functions `names` (0 for one the library exports as NULL),
    for the C paths that call the driver directly. Raises OSError or AttributeError."""
    driver = ctypes.CDLL("libcuda.so.1")
    return tuple(ctypes.cast(getattr(driver, name), ctypes.c_void_p).value or 0 for name in names)


def _stream_ptr(stream: Any) -> int:
    return 0 if stream is None else int(stream)


class _Partition:
    """A green context: `green` (CUgreenCtx), `ctx` (its CUcontext), its SMs."""

    __slots__ = ("ctx", "device", "green", "sm_count")

    def __init__(self, device: int, green: Any, ctx: Any, sm_count: int) -> None:
        self.device, self.green, self.ctx, self.sm_count = device, green, ctx, sm_count


# CUmemorytype (cuda.h): CU_MEMORYTYPE_HOST 1, CU_MEMORYTYPE_DEVICE 2.
_MEMORY_HOST = 1
_MEMORY_DEVICE = 2
_MEMORY_ARRAY = 3
_ZERO_CHUNK = 8 << 20  # the most device memory zeroing a freed array takes


@dataclass(eq=False)
class _Array(ArrayShape):
    """A CUDA array: the driver's CUarray and its shape (zeroing and texture formats need it)."""

    handle: Any = None


__all__ = ["CALL_OVERRIDES", "DRIVER_TO_RUNTIME", "CudaBackend", "check", "error"]
