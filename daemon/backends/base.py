"""The device layer the daemon drives: one interface, two implementations.

`cuda` (backend_cuda.py) runs on a real GPU through cuda-python's driver API; `sim`
(backend_sim.py) keeps memory in host RAM and runs kernels through Python emulations, so the
whole path can be tested on machines without a GPU.

Conventions every backend follows:
- Device pointers are plain ints. Streams, events, modules and functions are opaque objects the
  backend hands out; the session layer maps them to the integer handles clients see.
- `None` as a stream means the vGPU's own stream, which the vGPU thread passes explicitly.
- Failures raise BackendError carrying a cudaError_t value (the runtime's numbering, which is what
  the shim returns to the program). Backends never return error codes.
- Calls are made from vGPU threads; `bind_thread(device)` is called once in each before any other
  call, so a backend can make its context current there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# cudaError_t values the daemon produces itself (driver_types.h, CUDA 13).
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_MEMORY_ALLOCATION = 2
CUDA_ERROR_INITIALIZATION = 3
CUDA_ERROR_INVALID_CONFIGURATION = 9
CUDA_ERROR_INVALID_PITCH_VALUE = 12
CUDA_ERROR_INVALID_SYMBOL = 13
CUDA_ERROR_INVALID_CHANNEL_DESCRIPTOR = 20
CUDA_ERROR_INVALID_DEVICE_POINTER = 17
CUDA_ERROR_INVALID_MEMCPY_DIRECTION = 21
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_DEVICE_FUNCTION = 98
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_PTX = 218
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
CUDA_ERROR_UNSUPPORTED_LIMIT = 215
CUDA_ERROR_INVALID_RESOURCE_HANDLE = 400
CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217
CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720
CUDA_ERROR_INVALID_CLUSTER_SIZE = 912
CUDA_ERROR_NOT_FOUND = 500  # cudaErrorSymbolNotFound
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701
CUDA_ERROR_LAUNCH_TIMEOUT = 702
CUDA_ERROR_ASSERT = 710
CUDA_ERROR_HARDWARE_STACK = 714
CUDA_ERROR_ILLEGAL_INSTRUCTION = 715
CUDA_ERROR_MISALIGNED_ADDRESS = 716
CUDA_ERROR_INVALID_ADDRESS_SPACE = 717
CUDA_ERROR_INVALID_PC = 718
CUDA_ERROR_LAUNCH_FAILURE = 719
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900  # a call that waits on a capturing stream
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901  # the capture was ended by an error
CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906  # the legacy stream used while this thread captures
CUDA_ERROR_UNKNOWN = 999
# An MPS client the MPS server ended (after another client's fault, on Hopper one that had work
# running then): the process must end, like after a fault of its own (router/mps.py)
CUDA_ERROR_MPS_CLIENT_TERMINATED = 810
# cudaEvent* flags, the same values as the driver's CU_EVENT_*
EVENT_BLOCKING_SYNC = 0x1
EVENT_DISABLE_TIMING = 0x2
EVENT_INTERPROCESS = 0x4

# cudaMemRangeAttribute values (= CUmem_range_attribute) whose int32 values are device ids (-1
# the CPU, -2 none): preferred location, accessed-by (an array), last prefetch location; and the
# location-id attributes, with the type attribute that says whether their id is a device's.
RANGE_ATTR_DEVICE_IDS = frozenset({2, 3, 4})
RANGE_ATTR_ID_TYPE = {6: 5, 8: 7}
MEM_LOCATION_DEVICE = 1  # cudaMemLocationTypeDevice

# Errors after which CUDA's context is unusable: they stay with the session ("sticky").
STICKY_ERRORS = frozenset({
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_LAUNCH_TIMEOUT,
    CUDA_ERROR_ASSERT,
    CUDA_ERROR_HARDWARE_STACK,
    CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUDA_ERROR_MISALIGNED_ADDRESS,
    CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUDA_ERROR_INVALID_PC,
    CUDA_ERROR_LAUNCH_FAILURE,
    214,  # cudaErrorECCUncorrectable
    CUDA_ERROR_MPS_CLIENT_TERMINATED,
})


class BackendError(Exception):
    """A device call failed; `code` is the cudaError_t the client will see."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(f"cudaError {code}: {message}" if message else f"cudaError {code}")
        self.code = code


@dataclass
class DeviceInfo:
    name: str
    uuid: bytes  # 16 bytes
    total_mem: int
    driver_version: int
    attrs: dict[int, int] = field(default_factory=dict)  # cudaDeviceAttr -> value


def format_uuid(raw: bytes) -> str:
    """CUDA's 16 UUID bytes as nvidia-smi prints them."""
    h = bytes(raw[:16]).ljust(16, b"\0").hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def format_pci_bus_id(domain: int, bus: int, device: int) -> str:
    """A PCI bus id in NVML's form (nvmlPciInfo_t.busId): 8-digit domain, bus, device, function 0."""
    return f"{domain & 0xFFFFFFFF:08X}:{bus & 0xFF:02X}:{device & 0xFF:02X}.0"


def pci_bus_id_of(info: DeviceInfo) -> str:
    """A device's PCI bus id from its attributes (cudaDevAttrPciDomainId, PciBusId, PciDeviceId)."""
    a = info.attrs
    return format_pci_bus_id(a.get(50, 0), a.get(33, 0), a.get(34, 0))


@dataclass
class FunctionInfo:
    handle: Any
    params: list[tuple[int, int]]  # (offset, size) per parameter, in order
    max_threads_per_block: int
    static_shared_bytes: int
    max_dynamic_shared_bytes: int
    arg_bytes: int = field(init=False)  # size of the packed argument buffer
    name: str = ""  # the kernel's (mangled) name, for policies and logs
    module_handle: int = 0  # the session's handle of its module (cuModuleUnload forgets it)

    def __post_init__(self) -> None:
        self.arg_bytes = max((off + size for off, size in self.params), default=0)


@dataclass(frozen=True)
class LaunchAttrs:
    """What cudaLaunchKernelExC's attributes ask of one launch (execution.py)."""

    cooperative: bool = False
    cluster: tuple[int, int, int] | None = None  # cluster dimensions
    cluster_policy: int = 0  # cudaClusterSchedulingPolicy (0: default)
    priority: int | None = None


@dataclass(frozen=True)
class SmLayout:
    """How a device's SMs can be partitioned (compute shares, resources/shares.py). A partition
    is a set of `units`, each `unit` SMs (the device's smallest partition and its step: 8 on an
    H100, whose 132 SMs split into 15 units and 12 SMs in none); the `spare` SMs in no unit only
    ever belong to the partition of everyone uncapped."""

    sms: int
    unit: int
    units: int
    spare: int


@dataclass(frozen=True)
class Gate:
    """One host-callback gate (callbacks.py): a `pilot_gate` (daemon/native/gates.h) in pinned host
    memory. The stream runs pilot_gate_fire on it, then waits until its word reaches target."""

    address: int  # host address of the pilot_gate
    device_address: int  # its word's address as the stream's device sees it
    target: int
    stream_callback: bool  # cudaStreamAddCallback: the host function also gets the status


# CUDA arrays, texture and surface objects (daemon/ops/arrays.py). Channel formats use the
# runtime's numbering (cudaChannelFormatKind: 0 signed, 1 unsigned, 2 float).
CHANNEL_SIGNED, CHANNEL_UNSIGNED, CHANNEL_FLOAT = 0, 1, 2
ARRAY_LAYERED, ARRAY_SURFACE_LOAD_STORE, ARRAY_CUBEMAP, ARRAY_TEXTURE_GATHER = 1, 2, 4, 8
ARRAY_FLAGS = ARRAY_LAYERED | ARRAY_SURFACE_LOAD_STORE | ARRAY_CUBEMAP | ARRAY_TEXTURE_GATHER
RESOURCE_ARRAY, RESOURCE_LINEAR, RESOURCE_PITCH2D = 0, 2, 3  # cudaResourceType


@dataclass(frozen=True)
class ChannelDesc:
    """struct cudaChannelFormatDesc: bits of each channel and the kind. pilot carries the plain
    formats: 1, 2 or 4 channels of equal width, 8/16/32-bit signed or unsigned integers, 16-bit
    (half) or 32-bit floats."""

    x: int
    y: int
    z: int
    w: int
    f: int

    @property
    def channels(self) -> int:
        return sum(1 for bits in (self.x, self.y, self.z, self.w) if bits)

    @property
    def bits(self) -> int:
        return self.x

    @property
    def element_size(self) -> int:
        return self.channels * self.x // 8

    def check(self) -> None:
        """cudaErrorInvalidChannelDescriptor for a format CUDA has no array format for."""
        widths = (self.x, self.y, self.z, self.w)
        n = self.channels
        ok = (n in (1, 2, 4) and all(widths[i] == self.x for i in range(n))
              and not any(widths[n:])
              and (self.x in (8, 16, 32) if self.f in (CHANNEL_SIGNED, CHANNEL_UNSIGNED)
                   else self.x in (16, 32) if self.f == CHANNEL_FLOAT else False))
        if not ok:
            raise BackendError(CUDA_ERROR_INVALID_CHANNEL_DESCRIPTOR,
                               f"channel format {widths} kind {self.f}")


@dataclass
class ArrayShape:
    """An array's extent as created (0: that dimension absent) and its element format."""

    width: int
    height: int
    depth: int
    desc: ChannelDesc

    @property
    def row_bytes(self) -> int:
        return self.width * self.desc.element_size

    @property
    def rows(self) -> int:
        return max(self.height, 1)

    @property
    def slices(self) -> int:
        return max(self.depth, 1)

    @property
    def size(self) -> int:
        return self.row_bytes * self.rows * self.slices


@dataclass
class CopySide:
    """One side of a 3D copy (Backend.memcpy_3d). `kind` "host": `buffer` (buffer protocol)
    holds the box's rows packed, `pitch` bytes apart, `rows` rows a slice; "device": linear
    memory at `ptr`, `pitch` bytes a row, `rows` rows a slice, the box starting at byte x of
    row y of slice z; "array": `array` (a backend array), the box at byte x, row y, slice z."""

    kind: str
    ptr: int = 0
    buffer: Any = None
    array: Any = None
    pitch: int = 0
    rows: int = 0
    x: int = 0
    y: int = 0
    z: int = 0


@dataclass(frozen=True)
class Resource:
    """What a texture or surface object reads (struct cudaResourceDesc): `array` (a backend
    array) for RESOURCE_ARRAY; `ptr` and `size` for RESOURCE_LINEAR; `ptr`, `width`, `height`,
    `pitch` for RESOURCE_PITCH2D, with `desc` their element format."""

    type: int
    array: Any = None
    ptr: int = 0
    size: int = 0
    width: int = 0
    height: int = 0
    pitch: int = 0
    desc: ChannelDesc | None = None


@dataclass(frozen=True)
class TextureDesc:
    """struct cudaTextureDesc (runtime numbering: cudaAddressModeWrap 0, Clamp 1, Mirror 2,
    Border 3; cudaFilterModePoint 0, Linear 1; cudaReadModeElementType 0, NormalizedFloat 1)."""

    address_mode: tuple[int, int, int] = (0, 0, 0)
    filter_mode: int = 0
    read_mode: int = 0
    srgb: int = 0
    border_color: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    normalized_coords: int = 0
    max_anisotropy: int = 0
    mipmap_filter_mode: int = 0
    mipmap_level_bias: float = 0.0
    min_mipmap_level_clamp: float = 0.0
    max_mipmap_level_clamp: float = 0.0
    disable_trilinear_optimization: int = 0
    seamless_cubemap: int = 0


@dataclass(frozen=True)
class ViewDesc:
    """struct cudaResourceViewDesc."""

    format: int = 0
    width: int = 0
    height: int = 0
    depth: int = 0
    first_mipmap_level: int = 0
    last_mipmap_level: int = 0
    first_layer: int = 0
    last_layer: int = 0


class Backend(Protocol):
    name: str

    # device
    def device_count(self) -> int: ...
    def bind_thread(self, device: int) -> None: ...
    def device_info(self, device: int) -> DeviceInfo: ...
    def mem_get_info(self, device: int) -> tuple[int, int]: ...
    def context_error(self, device: int) -> int:
        """0 while `device`'s context works, else the sticky error that corrupted it (any
        thread; cheap: the fault watch calls it every few milliseconds)."""
        ...

    # memory
    def mem_alloc(self, size: int) -> int: ...
    def mem_free(self, ptr: int) -> None: ...
    def memcpy_htod(self, dst: int, src: Any, count: int, stream: Any) -> None:
        """Copy `count` bytes from a host buffer (buffer protocol). Returns once `src` may be
        reused (the driver staged it); the device write may still be pending on `stream`."""
    def memcpy_dtoh(self, dst: Any, src: int, count: int, stream: Any) -> None:
        """Copy into a writable host buffer; returns when the bytes are there."""
    def memcpy_dtod(self, dst: int, src: int, count: int, stream: Any) -> None: ...
    def memset_d8(self, ptr: int, value: int, count: int, stream: Any) -> None: ...
    def memset_wide(self, ptr: int, value: int, elem_size: int, count: int, stream: Any) -> None:
        """cuMemsetD16/D32Async: `count` elements of `elem_size` (2 or 4) bytes."""
    def host_register(self, address: int, size: int) -> None:
        """Pin a host range of the daemon (staging shared memory) for DMA."""
    def host_unregister(self, address: int) -> None:
        """Unpin a range pinned by host_register or map_host."""
    def memcpy_htod_async(self, dst: int, src: int, count: int, stream: Any) -> None:
        """Copy from host address `src`, inside a range pinned by map_host, in stream order:
        returns at once; the bytes are read when the stream gets there (pilot.daemon.ops.host_memory)."""
    def memcpy_dtoh_async(self, dst: int, src: int, count: int, stream: Any) -> None:
        """Copy to host address `dst`, inside a range pinned by map_host, in stream order."""

    # streams and events
    def stream_create(self, flags: int, priority: int) -> Any: ...
    def stream_destroy(self, stream: Any) -> None: ...
    def stream_synchronize(self, stream: Any) -> None: ...
    def stream_query(self, stream: Any) -> bool: ...
    def stream_wait_event(self, stream: Any, event: Any) -> None: ...
    def event_create(self, flags: int) -> Any: ...
    def event_destroy(self, event: Any) -> None: ...
    def event_record(self, event: Any, stream: Any) -> None: ...
    def event_synchronize(self, event: Any) -> None: ...
    def event_query(self, event: Any) -> bool: ...
    def event_elapsed_ms(self, start: Any, end: Any) -> float: ...

    # execution
    def link(self, inputs: list[Any], options: list[tuple[int, int]]) -> tuple[bytes, str]:
        """The driver's linker (backends/linker.py): LinkInputs and plain-valued CUjit_options
        in, (cubin, info log) out; BackendError(code, error log) when it fails."""
    def module_load(self, image: bytes) -> Any: ...
    def module_unload(self, module: Any) -> None: ...
    def module_loaded_bytes(self, module: Any, image: bytes) -> int:
        """Device memory the loaded module's variables take, as the driver tells after the
        load (not what pilot's reader of `image` expects): what a module load is charged."""
    def function_get(self, module: Any, name: str) -> FunctionInfo: ...
    def module_get_global(self, module: Any, name: str) -> tuple[int, int]:
        """(device address, size) of the module's `__device__`/`__constant__` variable `name`
        (its exact ELF symbol name); cudaErrorInvalidSymbol if the module has none."""
    def native_fast_functions(self) -> tuple[int, int, int] | None:
        """The addresses of the driver's cuLaunchKernel, cuMemcpyDtoHAsync_v2 and
        cuMemcpyHtoDAsync_v2 for the vGPU's fast path (daemon/native/fast_launch.c), taking this
        backend's function and stream handles as their values; None: the backend has none (the
        sim is called back instead)."""

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: Any,
        args: bytes,
    ) -> None: ...

    # limits, stream priorities, function attributes, occupancy, 2D memory (shim/runtime/misc/api_misc.c)
    def ctx_get_limit(self, limit: int) -> int:
        """cuCtxGetLimit in the calling thread's context (cudaLimit numbering);
        cudaErrorUnsupportedLimit for a limit the device does not have."""
    def ctx_set_limit(self, limit: int, value: int) -> None:
        """cuCtxSetLimit; the driver may round the value (read it back with ctx_get_limit)."""
    def stream_priority_range(self) -> tuple[int, int]:
        """(least, greatest) stream priority of the calling thread's device: (0, -5) on an H100.
        stream_create clamps priorities into this range."""
    def stream_priority(self, stream: Any) -> int: ...

    # CUDA graphs (ops/graphs.py): pilotd captures the work of a program's graph on one of the
    # session's streams and instantiates it. Capture is per thread (the vGPU's): other threads'
    # calls go on; a call that waits on the capturing stream fails the capture, as on a GPU.
    def stream_begin_capture(self, stream: Any) -> None: ...
    def stream_end_capture(self, stream: Any) -> Any:
        """The captured graph; BackendError if the capture was invalidated (a call that waited
        on the stream, an unsupported operation), the capture ended either way."""
    def graph_instantiate(self, graph: Any) -> tuple[Any, int]:
        """(the executable graph, its node count); the graph itself is destroyed."""
    def graph_launch(self, graph_exec: Any, stream: Any) -> None: ...
    def graph_exec_destroy(self, graph_exec: Any) -> None:
        """Safe while a launch of it runs: the driver frees it when that ends."""
    def function_attributes(self, function: Any) -> list[int]:
        """cuFuncGetAttribute for every CUfunction_attribute 0..15, 0 where none is reported."""
    def function_set_attribute(self, function: Any, attr: int, value: int) -> None:
        """cuFuncSetAttribute; cudaErrorInvalidValue for a value or attribute CUDA refuses."""
    def available_dynamic_smem(self, function: Any, num_blocks: int, block_size: int) -> int:
        """cuOccupancyAvailableDynamicSMemPerBlock: the most dynamic shared memory per block
        that lets `num_blocks` blocks of `block_size` threads reside on one SM."""
    def occupancy(self, function: Any, block_size: int, dynamic_smem: int, flags: int) -> int:
        """cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags."""
    def mem_alloc_pitch(self, width: int, height: int) -> tuple[int, int]:
        """(pointer, pitch) of `height` rows of at least `width` bytes (cuMemAllocPitch); the
        allocation is pitch * height bytes and freed with mem_free."""
    def memcpy_2d_htod(self, dst: int, dpitch: int, src: Any, spitch: int, width: int,
                       height: int, stream: Any) -> None:
        """Rows from a host buffer (buffer protocol); returns once `src` may be reused."""
    def memcpy_2d_dtoh(self, dst: Any, dpitch: int, src: int, spitch: int, width: int,
                       height: int, stream: Any) -> None:
        """Rows into a writable host buffer; returns when the bytes are there."""
    def memcpy_2d_dtod(self, dst: int, dpitch: int, src: int, spitch: int, width: int,
                       height: int, stream: Any) -> None: ...
    def memset_2d_d8(self, ptr: int, pitch: int, value: int, width: int, height: int,
                     stream: Any) -> None: ...

    # CUDA arrays, texture and surface objects (daemon/ops/arrays.py). The daemon has checked
    # the format (ChannelDesc.check), the flags, every copy's bounds and each resource's range.
    def array_create(self, width: int, height: int, depth: int, desc: ChannelDesc,
                     flags: int) -> Any:
        """A CUDA array (cuArray3DCreate): width elements, height rows (0: 1D), depth slices
        (0: 1D or 2D) or layers (ARRAY_LAYERED)."""
    def array_destroy(self, array: Any, stream: Any) -> None:
        """Zero the array on `stream` and wait for it (the next tenant's allocation may get its
        memory), then free it."""
    def memcpy_3d(self, dst: CopySide, src: CopySide, width: int, height: int, depth: int,
                  stream: Any) -> None:
        """A box of width bytes x height rows x depth slices (cuMemcpy3DAsync). Returns once a
        host source may be reused; a host destination holds the bytes on return."""
    def texture_create(self, resource: Resource, texture: TextureDesc,
                       view: ViewDesc | None) -> int:
        """cuTexObjectCreate: the object's value, which kernels use."""
    def texture_destroy(self, texture: int) -> None: ...
    def surface_create(self, array: Any) -> int:
        """cuSurfObjectCreate over an array made with ARRAY_SURFACE_LOAD_STORE."""
    def surface_destroy(self, surface: int) -> None: ...

    # unified memory (daemon/managed.py). Advice, location types and range attributes use the
    # runtime's numbering, which is the driver's (cudaMemoryAdvise = CUmem_advise, ...); device
    # locations are the backend's device indexes.
    def mem_alloc_managed(self, size: int, flags: int) -> int:
        """cuMemAllocManaged (flags: 1 attach global, 2 attach host); page-aligned."""
    def mem_address_range(self, ptr: int) -> tuple[int, int]:
        """(base, size) of the allocation holding ptr (cuMemGetAddressRange)."""
    def mem_advise(self, ptr: int, count: int, advice: int, location_type: int,
                   location_id: int) -> None: ...
    def mem_prefetch(self, ptr: int, count: int, location_type: int, location_id: int,
                     flags: int, stream: Any) -> None: ...
    def mem_range_attribute(self, ptr: int, count: int, attribute: int, data_size: int) -> bytes:
        """cuMemRangeGetAttribute's value, `data_size` bytes (int32 values, native order)."""
    def stream_attach_mem(self, stream: Any, ptr: int, length: int, flags: int) -> None: ...
    def managed_residency(self, device: int) -> tuple[int, int] | None:
        """(resident, peak) bytes of managed memory on `device` as the backend measures them;
        None when it cannot."""

    # several devices, launches with attributes, host callbacks (devices.py, execution.py,
    # callbacks.py). Device numbers are backend indexes, as in device_info.
    def can_access_peer(self, device: int, peer: int) -> bool: ...
    def enable_peer_access(self, device: int, peer: int) -> None:
        """Let kernels in `device`'s context reach `peer`'s memory; enabling twice is fine."""
    def memcpy_peer(self, dst: int, dst_device: int, src: int, src_device: int, count: int,
                    stream: Any) -> None: ...
    def launch_ex(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                  shared_bytes: int, stream: Any, args: bytes, attrs: LaunchAttrs) -> None:
        """launch() with attributes; cooperative and cluster launches fail here, at once, when
        the device cannot run them (cudaErrorCooperativeLaunchTooLarge...)."""
    def map_host(self, address: int, size: int) -> None:
        """Pin a host range of the daemon for every device, mapped: kernels reach it and streams
        can wait on it (gates, pinned host memory); host_unregister undoes it."""
    def host_device_pointer(self, address: int) -> int:
        """A mapped host address as the calling thread's device sees it (the address itself
        only where the device can use host pointers of registered memory)."""
    def gate(self, stream: Any, gate: Gate) -> None:
        """Enqueue on `stream` pilot_gate_fire(gate) (the stream reached it), then a wait that
        holds back later work until the gate's word reaches its target."""
    def kick(self) -> None:
        """A gate was opened from the host (the sim runs what the gate held back)."""
    def stream_write_word(self, stream: Any, address: int, value: int) -> None:
        """cuStreamWriteValue32: the u32 at device address `address` becomes `value` when
        `stream` gets there (the preemption words, scheduling/preempt.py)."""
        raise BackendError(CUDA_ERROR_NOT_SUPPORTED, "stream memory operations")
    def stream_wait_word(self, stream: Any, address: int, value: int) -> None:
        """cuStreamWaitValue32 (EQ): later work on `stream` waits until the u32 at device
        address `address` equals `value`."""
        raise BackendError(CUDA_ERROR_NOT_SUPPORTED, "stream memory operations")

    # CUDA math libraries (backends/libraries.py; cublas.py on a GPU, sim_blas.py on the sim).
    # Handles are the backend's objects, lent to one program handle at a time; library failures
    # raise LibraryError (a BackendError carrying the library's status).
    def library_version(self, library: int) -> int:
        """major*10000 + minor*100 + patch of cuBLAS or cuBLASLt as pilotd runs it."""
    def library_create(self, library: int) -> Any:
        """A handle of the library on the calling vGPU thread's device."""
    def library_release(self, handle: Any) -> None:
        """The program's handle is gone: the backend may keep the handle for the next one."""
    def blas_gemm(self, handle: Any, call: Any, settings: Any, stream: Any) -> None:
        """Issue the GemmCall on `stream` with the handle's BlasSettings (ranges checked)."""
    def blaslt_matmul(self, handle: Any, call: Any, key: bytes, stream: Any) -> None:
        """Issue the LtCall on `stream`; `key` (its attribute records) may cache descriptors."""
    def blaslt_heuristic(self, handle: Any, call: Any, key: bytes, requested: int) -> list[bytes]:
        """Up to `requested` cublasLtMatmulHeuristicResult_t (96 bytes each) for the call."""
    # The vGPU's fast path for library calls (daemon/native/fast_library.c, vgpu/fast.py).
    def fast_library_functions(self) -> dict[int, int]:
        """Addresses of the functions fast_library.c calls, by enum pilot_fast_libfn, for what is
        loaded now (libcuda's memset; cuBLAS and cuBLASLt once a handle was made); {} for a
        backend that is called back instead (the sim)."""
    def fast_library_handle(self, handle: Any) -> int:
        """The library's own handle value behind a backend handle of cuBLAS, cuBLASLt or cuDNN
        (nonzero)."""
    def fast_lt_descriptors(self, handle: Any, key: bytes) -> list[int] | None:
        """The five descriptors (matmul, A, B, C, D) blaslt_matmul made for `key`, or None."""
    def fast_lt_evicted(self, handle: Any) -> list[bytes]:
        """Keys whose descriptors were destroyed since the last call (taken)."""
    def library_state_reset(self, handle: Any) -> None:
        """C used the handle: apply every setting again at the next call."""
    def fast_dnn_plan(self, plan: Any) -> int:
        """cuDNN's own value of an execution plan (a backend descriptor) for the fast path."""
    def fast_graph_exec(self, graph_exec: Any) -> int:
        """The driver's value of an executable graph (CUgraphExec) for the fast path."""

    # cuDNN (backends/dnn.py; cudnn.py on a GPU, sim_dnn.py on the sim). Handles and
    # descriptors are the backend's objects; failures raise DnnError (the cudnnStatus_t).
    def dnn_version(self) -> tuple[int, int]:
        """(cudnnGetVersion(), cudnnGetCudartVersion()) of cuDNN as pilotd runs it."""
    def dnn_create(self) -> Any:
        """A cudnnHandle_t on the calling vGPU thread's device."""
    def dnn_release(self, handle: Any) -> None:
        """The program's handle is gone (the backend may keep it for the next one)."""
    def dnn_desc_create(self, dtype: int) -> Any:
        """cudnnBackendCreateDescriptor(dtype)."""
    def dnn_desc_set(self, desc: Any, attr: int, atype: int, count: int,
                     value: bytes | list[Any]) -> None:
        """cudnnBackendSetAttribute: `value` is the elements' bytes, or for
        CUDNN_TYPE_BACKEND_DESCRIPTOR / CUDNN_TYPE_HANDLE a list of the backend's descriptors /
        handles."""
    def dnn_desc_get(self, desc: Any, attr: int, atype: int, requested: int,
                     descs: list[Any] | None) -> tuple[int, bytes]:
        """cudnnBackendGetAttribute: (element count, the elements' bytes); for
        CUDNN_TYPE_BACKEND_DESCRIPTOR the results fill `descs` (the caller's, created with the
        right type) and the bytes are empty."""
    def dnn_desc_finalize(self, desc: Any) -> None:
        """cudnnBackendFinalize."""
    def dnn_desc_destroy(self, desc: Any) -> None:
        """cudnnBackendDestroyDescriptor."""
    def dnn_execute(self, handle: Any, plan: Any, uids: list[int], pointers: list[int],
                    workspace: int, stream: Any) -> None:
        """cudnnBackendExecute of a finalized execution plan with a variant pack of these
        tensors (ranges checked by the ops layer) on `stream`."""
    def dnn_batchnorm(self, handle: Any, call: Any, stream: Any) -> int:
        """Issue the BatchNormCall on `stream`; a size query (BN_SIZE_QUERIES) returns the size
        and issues nothing."""

    # SM partitions (compute shares, resources/shares.py). A partition is an execution context
    # confined to some SMs (a green context on CUDA). What a thread creates while a partition is
    # current (modules, events, memory) is that partition's; streams are the exception:
    # stream_create always makes a whole-GPU stream (the daemon's own: coherence, eviction),
    # partition_stream_create a session's stream in its partition. pilotd keeps a session's
    # module, streams and current context all in its partition: a whole-GPU module's kernel
    # launched on a partition's stream faulted on the H100 (cudaErrorIllegalAddress, fatal to
    # every context of the device; bench/RESULTS.md), and the sim refuses that mix the same way.
    def sm_layout(self, device: int) -> SmLayout | None:
        """The device's partition geometry; None where it cannot be partitioned."""
    def partition_create(self, device: int, units: tuple[int, ...], spare: bool) -> Any:
        """A partition of the given units (indexes below SmLayout.units), plus the spare SMs if
        `spare`; the object has `sm_count`."""
    def partition_stream_create(self, partition: Any, flags: int, priority: int) -> Any:
        """A stream of `partition`: kernels launched on it run on the partition's SMs."""
    def partition_destroy(self, partition: Any) -> None:
        """Destroy a partition nothing uses any more (its streams and modules are gone)."""
    def use_partition(self, device: int, partition: Any) -> None:
        """Make `partition` (None: the device's whole-GPU context) current on the calling
        thread; a bound vGPU thread calls it before working for a session of another one."""
