"""The `sim` backend: a CPU-only stand-in for a GPU, so CI runs the whole path without one.

Simplifications, on purpose:
- Work runs synchronously at enqueue time: every copy, memset and launch has completed when
  the call returns, so streams and events are always complete (queries return True,
  synchronizes return at once). Ordering between streams is therefore trivially respected.
  The one exception is a host-callback gate (callbacks.py): a stream that reaches a closed gate
  is *held*, and what is issued on it afterwards queues up (with copies of its host data) until
  the gate opens and kick() runs it, in order. An event recorded on a held stream is pending
  until its record runs; a stream that waits for a pending event is held too. Synchronizes,
  queries and device-to-host copies see held streams as busy (a synchronize waits for them).
- Kernels run as Python emulations looked up by mangled name (sim_kernels.py); parameter
  layouts come from the image's device ELF (fatbin.py), as the driver would know them.
- A module's `__device__`/`__constant__` variables live in one block of sim memory allocated at
  load time, laid out from the ELF's OBJECT symbols and filled from its initialized sections;
  the block is freed with the module. Emulations find a variable with `k.symbol(name)`.
- Function attributes come from the image (func_attrs.py: registers, static shared memory);
  occupancy is a simple per-SM model (SimBackend.occupancy); limits, stream priorities and
  pitches take the H100's values and rules.
- Device memory is host memory at fake addresses starting at SIM_BASE_ADDRESS. Addresses are
  never reused and a guard gap separates blocks, so use-after-free and off-the-end accesses
  fault instead of landing in a neighbour. New memory reads as zeros.
- All devices share one address space (unified addressing), each with its own capacity.
- Managed memory is where an H100 with UVM would put it, conservatively: its residency is
  tracked per 2 MiB page (UM_PAGE) and device. Pages start populated nowhere; a launch on device
  d makes every page of each managed block its argument words point into resident on d (the
  daemon's footprint rule), and a copy or memset writing managed memory on d makes the pages it
  writes resident there; a page stays where it is when all its bytes are preferred on the host
  and accessed by d. Prefetches move the pages they overlap, whole; reads move nothing; free
  drops them. managed_residency() reports each device's resident bytes and their peak. Advice is
  kept per range of host pages. Nothing is evicted: where an H100 would evict pages to make room,
  the sim's residency goes past the device's capacity.
- CUDA arrays are linear storage in sim memory (rows of width x element size bytes, packed; so
  a freed array's storage goes to the next allocation of its size like any block, and must be
  zeroed), within the device's texture limits (its attributes). Texture and surface objects are
  numbered from 1 as the driver's are; emulations read them through `k.texture(i)` /
  `k.surface(i)` (SimImage: point sampling, address modes, element reads and surface writes,
  sim_kernels.py).
- One lock guards all state, held through emulations too: simple, and the sim is not for speed.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import functools
import itertools
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from pilot.daemon.backends import sim_blas, sim_dnn
from pilot.daemon.backends.base import (
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_INVALID_CLUSTER_SIZE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_PITCH_VALUE,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_SYMBOL,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_MEMORY_ALLOCATION,
    CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    CUDA_ERROR_UNSUPPORTED_LIMIT,
    EVENT_BLOCKING_SYNC,
    EVENT_DISABLE_TIMING,
    EVENT_INTERPROCESS,
    RESOURCE_ARRAY,
    RESOURCE_LINEAR,
    STICKY_ERRORS,
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
)
from pilot.daemon.backends.dnn import BN_SIZE_QUERIES, BatchNormCall
from pilot.daemon.backends.fatbin import (
    KernelInfo,
    elf_arch,
    is_elf,
    is_fatbin,
    kernel_infos_in_image,
    loaded_globals,
    ptx_text,
)
from pilot.daemon.backends.func_attrs import ImageFuncAttrs, image_function_attrs
from pilot.daemon.backends.libraries import BlasSettings, GemmCall, LtCall
from pilot.daemon.backends.linker import sim_link
from pilot.daemon.backends.ptx_preempt import (
    COUNTER_BYTES,
    LOOP_SUFFIX,
    PARAMS,
    SLOT_BYTES,
    SUFFIX,
    TALLY_BYTES,
    abandon,
    count_resumed,
    redo_bytes,
    stamp_retreat,
    start_part,
    take_redo,
)
from pilot.daemon.backends.ptx_preempt import claimed as claimed_blocks
from pilot.daemon.backends.sim_device import H100_ATTRS, h100_like_info
from pilot.daemon.protocol import ffi, lib
from pilot.daemon.sim_kernels import (
    CUDA_ERROR_INVALID_DEVICE_FUNCTION,
    KernelRegistry,
    SimImage,
    SimLaunch,
)

log = logging.getLogger("pilot.backend.sim")

SIM_BASE_ADDRESS = 0x7E00_0000_0000
SIM_LIBRARY_VERSION = 130100  # cuBLAS 13.1.0, as CUDA 13.0's on the H100
SIM_DNN_VERSION, SIM_DNN_CUDART_VERSION = 91900, 13000  # cuDNN 9.19.0 for CUDA 13.0, as on the H100
ALIGNMENT = 512
MANAGED_ALIGNMENT = 2 << 20
PACK_BELOW = 2 << 20  # cudaMallocManaged below this is packed (the H100: a few hundred B to KiB)
PACK_ALIGNMENT = 512
UM_PAGE = 2 << 20  # managed residency is tracked in pages of this size (the driver's big pages)
ADVICE_PAGE = 4096  # advice and prefetch ranges are rounded out to host pages, as the driver does
HOST_LOCATIONS = frozenset({2, 3, 4})  # cudaMemLocationType host, host NUMA, host NUMA current
GUARD_BYTES = ALIGNMENT  # unmapped gap after every block
DEFAULT_TOTAL_MEM = 80 * 1024**3
MAX_BLOCK = (1024, 1024, 64)
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_DYNAMIC_SHARED = 48 * 1024
_MMAP_THRESHOLD = 1 << 20  # larger blocks use anonymous mmap: zero pages cost nothing

STREAM_NON_BLOCKING = 0x1

# Limits, stream priorities, function attributes, occupancy, pitched memory (shim/runtime/misc/api_misc.c),
# with the values an H100 reports (CUDA 13.0, driver 580).
STREAM_PRIORITY_RANGE = (0, -5)  # (least, greatest)
DEFAULT_LIMITS = {  # cudaLimit -> the context's default; 3 (device runtime sync depth) is absent
    0: 1024, 1: 8650752, 2: 8388608, 4: 2048, 5: 64, 6: 9830400,
}
PITCH_ALIGNMENT = 512  # cudaMallocPitch's pitches: width rounded up to 512 (cuMemAllocPitch)
# CUfunction_attribute indexes (pilot_rep_func_attrs.values)
FA_MAX_THREADS, FA_SHARED, FA_CONST, FA_LOCAL, FA_REGS, FA_PTX, FA_BINARY = range(7)
FA_MAX_DYNAMIC_SHARED, FA_CARVEOUT, FA_CLUSTER_MUST_BE_SET = 8, 9, 10
FUNC_ATTR_COUNT = 16
DEFAULT_REGS = 32  # when the image names no register count
SHARED_PER_BLOCK = 48 * 1024  # static + dynamic shared memory without opting in
OCCUPANCY_DISABLE_CACHING_OVERRIDE = 0x1


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass(eq=False)
class _Block:
    base: int
    size: int
    device: int
    data: bytearray | mmap.mmap | memoryview
    managed: _Managed | None = None  # managed memory: advice and residency
    host: int = 0  # mapped host memory: the daemon's address of it (data views it there)


@dataclass(frozen=True)
class _Advice:
    """cudaMemAdvise / cudaMemPrefetchAsync state of one range of a managed block, locations as
    (cudaMemLocationType, id) pairs; type 0 is none."""

    read_mostly: bool = False
    preferred: tuple[int, int] = (0, 0)
    accessed_by: frozenset[int] = frozenset()
    last_prefetch: tuple[int, int] = (0, 0)

    def stays_on_host(self, device: int) -> bool:
        """Preferred on the host and mapped for `device`: its touches read the host's copy."""
        return self.preferred[0] in HOST_LOCATIONS and device in self.accessed_by


class _Managed:
    """A managed block's advice, by range (segments of byte offsets, rounded out to
    ADVICE_PAGE), and where each of its UM_PAGE pages lives: page i covers
    [i * UM_PAGE, (i + 1) * UM_PAGE) of the block, clipped to its size."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.starts = [0]  # segment k covers [starts[k], starts[k + 1] or size) ...
        self.advice = [_Advice()]  # ... and has advice[k]; neighbours differ
        self.pages = bytearray(-(-size // UM_PAGE))  # 0: on no device (host); d + 1: on device d

    def _rounded(self, lo: int, hi: int) -> tuple[int, int]:
        return lo // ADVICE_PAGE * ADVICE_PAGE, min(self.size, -(-hi // ADVICE_PAGE) * ADVICE_PAGE)

    def _split(self, at: int) -> int:
        """The index of the segment starting at `at`, splitting the one holding it."""
        if at >= self.size:
            return len(self.starts)
        k = bisect.bisect_right(self.starts, at) - 1
        if self.starts[k] != at:
            k += 1
            self.starts.insert(k, at)
            self.advice.insert(k, self.advice[k - 1])
        return k

    def update(self, lo: int, hi: int, change: Callable[[_Advice], _Advice]) -> None:
        """Applies `change` to the advice of [lo, hi) (whole host pages)."""
        lo, hi = self._rounded(lo, hi)
        if lo >= hi:
            return
        first, end = self._split(lo), self._split(hi)
        for k in range(first, end):
            self.advice[k] = change(self.advice[k])
        starts, advice = [0], [self.advice[0]]
        for start, value in zip(self.starts[1:], self.advice[1:], strict=True):
            if value != advice[-1]:
                starts.append(start)
                advice.append(value)
        self.starts, self.advice = starts, advice

    def segments(self, lo: int, hi: int) -> list[tuple[int, int, _Advice]]:
        """(start, end, advice) of the segments overlapping [lo, hi) (at least one byte)."""
        k = bisect.bisect_right(self.starts, lo) - 1
        hi = max(hi, lo + 1)
        found = []
        while k < len(self.starts) and self.starts[k] < hi:
            end = self.starts[k + 1] if k + 1 < len(self.starts) else self.size
            found.append((self.starts[k], end, self.advice[k]))
            k += 1
        return found


class SimMemory:
    """Allocations of every device in one address space. Not locked: SimBackend guards it.

    Like CUDA's allocator, a freed device block is handed out again, contents and all, to the
    next allocation of the same size on its device (up to RECYCLED_BLOCKS blocks are kept); so
    whatever must not leak between tenants has to be cleared by the daemon, as on a GPU."""

    RECYCLED_BLOCKS = 64
    RECYCLED_MAX_BYTES = 64 << 20

    def __init__(self, device_count: int, capacity: int) -> None:
        self.capacity = capacity
        self.used = [0] * device_count
        self.resident = [0] * device_count  # bytes of managed pages on each device
        self.peak = [0] * device_count  # the most `resident` has been
        self._blocks: dict[int, _Block] = {}
        self._bases: list[int] = []  # sorted
        self._next = SIM_BASE_ADDRESS
        self._recycled: list[_Block] = []  # freed device blocks, oldest first
        self._slab = self._slab_end = 0  # where the next small managed allocation is packed

    def alloc(self, size: int, device: int, managed: bool = False, packed: bool = False) -> int:
        """Managed blocks start on a MANAGED_ALIGNMENT boundary, as the driver's do; with
        `packed` (cudaMallocManaged), one below PACK_BELOW is packed PACK_ALIGNMENT bytes apart
        after the previous small one, as the H100's driver does (0x...3a00 addresses)."""
        if size < 0:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"negative allocation size {size}")
        if size == 0:
            return 0  # cudaMalloc(0) succeeds with NULL
        charged = _align(size)
        if self.used[device] + charged > self.capacity:
            raise BackendError(CUDA_ERROR_MEMORY_ALLOCATION,
                               f"{size} bytes requested, {self.capacity - self.used[device]} free")
        reused = None if managed else self._take_recycled(size, device)
        if reused is not None:
            base, data = reused.base, reused.data
        else:
            data = mmap.mmap(-1, size) if size >= _MMAP_THRESHOLD else bytearray(size)
            if managed and packed and size < PACK_BELOW:
                if self._slab + size > self._slab_end:  # a new 2 MiB slab
                    self._slab = -(-self._next // MANAGED_ALIGNMENT) * MANAGED_ALIGNMENT
                    self._slab_end = self._slab + MANAGED_ALIGNMENT
                    self._next = self._slab_end + GUARD_BYTES
                base = self._slab
                self._slab += -(-size // PACK_ALIGNMENT) * PACK_ALIGNMENT
            else:
                base = self._next
                if managed:
                    base = -(-base // MANAGED_ALIGNMENT) * MANAGED_ALIGNMENT
                # The H100's driver places large managed allocations one right after another
                # (three 512 MiB cudaMallocManaged are contiguous): no gap, so that a range
                # spanning two of them is possible here too (a prefetch may not span two).
                self._next = base + charged + (0 if managed else GUARD_BYTES)
        self._blocks[base] = _Block(base, size, device, data, _Managed(size) if managed else None)
        bisect.insort(self._bases, base)
        self.used[device] += charged
        return base

    def _take_recycled(self, size: int, device: int) -> _Block | None:
        for i in range(len(self._recycled) - 1, -1, -1):
            block = self._recycled[i]
            if block.size == size and block.device == device:
                return self._recycled.pop(i)
        return None

    def free(self, ptr: int) -> None:
        if ptr == 0:
            return  # cudaFree(NULL) succeeds
        block = self._blocks.pop(ptr, None)
        if block is not None and block.host:
            self._blocks[ptr] = block
            block = None  # mapped host memory is no allocation
        if block is None:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"{ptr:#x} is not the base of a live allocation")
        del self._bases[bisect.bisect_left(self._bases, ptr)]
        self.used[block.device] -= _align(block.size)
        if block.managed is not None:  # its pages vanish wherever they were
            self._move(block, 0, len(block.managed.pages), 0)
        if block.managed is None and block.size <= self.RECYCLED_MAX_BYTES:  # device memory
            self._recycled.append(block)
            del self._recycled[:-self.RECYCLED_BLOCKS]

    # ---- where managed pages live ----------------------------------------------------------

    def _move(self, block: _Block, first: int, last: int, code: int) -> None:
        """Pages first..last-1 of a managed block to `code` (0: no device, d + 1: device d)."""
        assert block.managed is not None
        pages = block.managed.pages
        run = pages[first:last]
        short = (len(pages) * UM_PAGE - block.size) if last == len(pages) else 0  # last page's lack
        for was in set(run) - {code}:
            moved = run.count(was) * UM_PAGE - (short if run[-1] == was else 0)
            if was:
                self.resident[was - 1] -= moved
            if code:
                self.resident[code - 1] += moved
        if code:
            self.peak[code - 1] = max(self.peak[code - 1], self.resident[code - 1])
        pages[first:last] = bytes((code,)) * (last - first)

    def migrate(self, block: _Block, lo: int, hi: int, device: int | None) -> None:
        """The pages overlapping [lo, hi) of a managed block (offsets) move, whole, to `device`
        (None: the host)."""
        if hi > lo:
            self._move(block, lo // UM_PAGE, -(-hi // UM_PAGE), 0 if device is None else device + 1)

    def touch(self, block: _Block, lo: int, hi: int, device: int) -> None:
        """`device` accessed [lo, hi) of a managed block: the pages overlapping it become
        resident there, whole, except those all of whose bytes are preferred on the host and
        accessed by `device`: they stay where they are (the device maps them)."""
        managed = block.managed
        assert managed is not None
        if hi <= lo:
            return
        first, last = lo // UM_PAGE, -(-hi // UM_PAGE)
        segments = managed.segments(first * UM_PAGE, min(last * UM_PAGE, block.size))
        if not any(advice.stays_on_host(device) for _s, _e, advice in segments):
            self._move(block, first, last, device + 1)
            return
        moves = bytearray(last - first)  # 1: a page with bytes that would migrate
        for start, end, advice in segments:
            if not advice.stays_on_host(device):
                lo_page, hi_page = max(first, start // UM_PAGE), min(last, -(-end // UM_PAGE))
                moves[lo_page - first:hi_page - first] = b"\1" * (hi_page - lo_page)
        page = first
        for flag, run in itertools.groupby(moves):
            n = len(list(run))
            if flag:
                self._move(block, page, page + n, device + 1)
            page += n

    def map_host(self, address: int, size: int, device: int) -> int:
        """A range of the daemon's own host memory made reachable by kernels and copies at a
        device address of its own (the lab H100 reports cudaDevAttrCanUseHostPointerForRegisteredMem
        0: registered memory has a device pointer other than its host address). Not charged
        against the capacity: it is host memory."""
        if size <= 0:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"mapping {size} host bytes")
        base = -(-self._next // mmap.PAGESIZE) * mmap.PAGESIZE
        self._next = base + _align(size) + GUARD_BYTES
        data = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        self._blocks[base] = _Block(base, size, device, data, host=address)
        bisect.insort(self._bases, base)
        return base

    def unmap_host(self, address: int) -> bool:
        for base, block in list(self._blocks.items()):
            if block.host == address:
                del self._blocks[base]
                del self._bases[bisect.bisect_left(self._bases, base)]
                return True
        return False

    def host_alias(self, address: int) -> int | None:
        """The device address of a mapped host address."""
        for block in self._blocks.values():
            if block.host and 0 <= address - block.host < block.size:
                return block.base + address - block.host
        return None

    def block(self, addr: int) -> _Block | None:
        """The live block holding addr."""
        i = bisect.bisect_right(self._bases, addr) - 1
        if i < 0:
            return None
        block = self._blocks[self._bases[i]]
        return block if addr - block.base < block.size else None

    def device_of(self, addr: int) -> int | None:
        block = self.block(addr)
        return block.device if block is not None else None

    def region(self, addr: int, nbytes: int) -> memoryview | None:
        """A writable view of [addr, addr+nbytes) if it lies inside one live block."""
        i = bisect.bisect_right(self._bases, addr) - 1
        if i < 0 or nbytes < 0:
            return None
        block = self._blocks[self._bases[i]]
        start = addr - block.base
        if start + nbytes > block.size:
            return None
        return memoryview(block.data)[start:start + nbytes]


MAX_CLUSTER_PORTABLE, MAX_CLUSTER_NON_PORTABLE = 8, 16  # blocks per cluster on an H100
FA_NON_PORTABLE_CLUSTER = 14


class _Hold:
    """A queue entry that holds its stream back until ready() (a gate, a pending event)."""

    def __init__(self, ready: Callable[[], bool]) -> None:
        self.ready = ready


@dataclass(eq=False)
class _Partition:
    """A simulated SM partition (a green context on CUDA)."""

    device: int
    units: tuple[int, ...]
    sm_count: int
    alive: bool = True


@dataclass(eq=False)
class _Stream:
    flags: int
    priority: int
    partition: _Partition | None = None  # the context it was created in (None: whole GPU)
    alive: bool = True
    # Work issued while the stream is held: callables and _Holds, in order (sim lock held).
    queue: collections.deque = field(default_factory=collections.deque)
    error: BackendError | None = None  # raised by queued work, reported at the next sync
    # While captured (stream_begin_capture): the work issued since, in order, not run.
    capture: list | None = None
    capture_error: BackendError | None = None  # what ended the capture early


@dataclass(eq=False)
class _Graph:
    """Captured work: callables and _Holds, run in order on the launch stream."""

    work: list
    alive: bool = True


@dataclass(eq=False)
class _Event:
    flags: int
    recorded_ns: int | None = None
    alive: bool = True
    issued: int = 0  # records issued
    done: int = 0  # records that ran (fewer while one waits on a held stream)


@dataclass(eq=False)
class _Module:
    kernels: dict[str, KernelInfo]
    partition: _Partition | None = None  # the context it was loaded in
    alive: bool = True
    globals_block: int = 0  # sim memory holding the module's variables, 0 if it has none
    managed_block: int = 0  # managed sim memory holding its __managed__ variables
    globals: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (address, size)
    loaded_bytes: int = 0  # what its variables took (module_loaded_bytes)
    attrs: dict[str, ImageFuncAttrs] = field(default_factory=dict)  # what the image says
    functions: dict[str, Any] = field(default_factory=dict)  # name -> its one _Function


@dataclass(eq=False)
class _Function:
    module: _Module
    info: KernelInfo
    max_threads: int
    attrs: list[int] = field(default_factory=list)  # CUfunction_attribute 0..15 (func_attrs.py)

    @property
    def max_dynamic_shared(self) -> int:
        return self.attrs[FA_MAX_DYNAMIC_SHARED] if self.attrs else MAX_DYNAMIC_SHARED


# Device attributes (cudaDeviceAttr) bounding arrays and textures: the maximum extents by kind
# of array (1D, 2D, 3D, layered 1D/2D: width, height, depth or layers), the alignment of a
# texture's memory and of a pitch2D texture's pitch, and the pitch2D extent.
ARRAY_LIMIT_ATTRS = {"1d": (21,), "2d": (22, 23), "3d": (24, 25, 26), "1d_layered": (42, 43),
                     "2d_layered": (27, 28, 29)}
ATTR_TEXTURE_ALIGNMENT, ATTR_TEXTURE_PITCH_ALIGNMENT = 14, 51
ATTR_TEXTURE_2D_LINEAR = (70, 71)  # cudaDevAttrMaxTexture2DLinearWidth / Height


@dataclass(eq=False)
class _Array(ArrayShape):
    base: int = 0  # its storage in sim memory
    flags: int = 0
    alive: bool = True


@dataclass(eq=False)
class _Object:
    """A texture or surface object."""

    resource: Resource
    texture: TextureDesc | None  # None: a surface
    view: ViewDesc | None = None


class SimBackend:
    """backend.Backend over host memory and Python kernel emulations."""

    name = "sim"

    def __init__(self, kernels: KernelRegistry, device_count: int = 1,
                 total_mem: int = DEFAULT_TOTAL_MEM, info: DeviceInfo | None = None) -> None:
        """`info`, if given, is what every device reports; capacity is `total_mem` regardless."""
        if device_count < 1:
            raise ValueError("the sim needs at least one device")
        self._kernels = kernels
        self._device_count = device_count
        self._infos = [info or h100_like_info(total_mem, i) for i in range(device_count)]
        self._memory = SimMemory(device_count, total_mem)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # held streams ran
        self._held: set[_Stream] = set()
        # Kernels' printf output, written to fd 1 where the driver writes it: at a launch's
        # start and at synchronizations (CUDA Programming Guide, Formatted Output; not at the
        # asynchronous copies pilotd makes, as the H100 showed), so pilotd captures it as on a
        # GPU (vgpu/device_output.py).
        self._printf: list[bytes] = []
        self._library_handles = 0
        self._thread = threading.local()
        self._limit_values: dict[int, dict[int, int]] = {}  # device -> cudaLimit -> value
        self._var_ranges: dict[int, int] = {}  # __managed__ variable address -> size
        self._poisoned = 0  # the sticky error of a kernel fault (_poison), 0 while none
        self._objects: dict[int, _Object] = {}  # texture and surface objects by value
        self._next_object = 1
        self._capturing: dict[int, _Stream] = {}  # thread id -> the stream it captures

    # ---- context-fatal faults ---------------------------------------------------------------

    def _poison(self, exc: BackendError) -> None:
        """A kernel faulted: as on the H100, every later call fails with its error, on every
        device and session of this process, until the process ends (fault_probe.py)."""
        if not self._poisoned:
            log.error("sim: kernel fault (%s): every call now fails with error %d", exc, exc.code)
            self._poisoned = exc.code

    def context_error(self, device: int) -> int:
        self._check_device(device)
        return self._poisoned

    # ---- device ---------------------------------------------------------------------------

    def device_count(self) -> int:
        return self._device_count

    def _check_device(self, device: int) -> int:
        if not 0 <= device < self._device_count:
            raise BackendError(CUDA_ERROR_INVALID_DEVICE, f"no device {device}")
        return device

    def bind_thread(self, device: int) -> None:
        self._thread.device = self._check_device(device)
        self._thread.partition = None

    def _current_device(self) -> int:
        return getattr(self._thread, "device", 0)

    def device_info(self, device: int) -> DeviceInfo:
        return self._infos[self._check_device(device)]

    def mem_get_info(self, device: int) -> tuple[int, int]:
        self._check_device(device)
        with self._lock:
            return self._memory.capacity - self._memory.used[device], self._memory.capacity

    # ---- memory ---------------------------------------------------------------------------

    def mem_alloc(self, size: int) -> int:
        with self._lock:
            return self._memory.alloc(size, self._current_device())

    def mem_free(self, ptr: int) -> None:
        with self._lock:
            self._memory.free(ptr)

    def _device_range(self, addr: int, count: int) -> memoryview:
        region = self._memory.region(addr, count)
        if region is None:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"device range {addr:#x}+{count} is not inside one live allocation")
        return region

    def memcpy_htod(self, dst: int, src: Any, count: int, stream: Any) -> None:
        source = _host_view(src, count, writable=False)
        with self._lock:
            self._check_stream(stream)
            if count:
                self._device_range(dst, count)  # a bad range fails now, held or not
                self._touched(stream, self._current_device(), [(dst, count)])
                self._issue(stream, self._write, dst, source)

    def _write(self, dst: int, data: Any) -> None:
        self._device_range(dst, len(data))[:] = data

    def memcpy_dtoh(self, dst: Any, src: int, count: int, stream: Any) -> None:
        target = _host_view(dst, count, writable=True)
        with self._lock:
            self._check_stream(stream)
            self._wait_idle(stream)
            if count:
                target[:] = self._device_range(src, count)

    def _flush_printf(self) -> None:
        """What kernels printed, to fd 1 as the driver writes it (under the lock)."""
        if self._printf:
            data = b"".join(self._printf)
            self._printf.clear()
            while data:
                data = data[os.write(1, data):]

    def memcpy_dtod(self, dst: int, src: int, count: int, stream: Any) -> None:
        _check_count(count)
        with self._lock:
            self._check_stream(stream)
            if count:
                self._touched(stream, self._current_device(), [(dst, count)])
                self._issue(stream, self._dtod, dst, src, count)

    def _dtod(self, dst: int, src: int, count: int) -> None:
        source = bytes(self._device_range(src, count))  # copy: ranges may overlap
        self._device_range(dst, count)[:] = source

    def memset_d8(self, ptr: int, value: int, count: int, stream: Any) -> None:
        _check_count(count)
        with self._lock:
            self._check_stream(stream)
            if count:
                self._touched(stream, self._current_device(), [(ptr, count)])
                self._issue(stream, self._memset, ptr, value, count)

    def memset_wide(self, ptr: int, value: int, elem_size: int, count: int, stream: Any) -> None:
        _check_count(count * elem_size)
        pattern = (value & ((1 << (8 * elem_size)) - 1)).to_bytes(elem_size, "little")
        with self._lock:
            self._check_stream(stream)
            if count:
                self._touched(stream, self._current_device(), [(ptr, count * elem_size)])
                self._issue(stream, self._fill_rows, ptr, count * elem_size, pattern * count,
                            count * elem_size, 1)

    def _memset(self, ptr: int, value: int, count: int) -> None:
        region = self._device_range(ptr, count)
        chunk = bytes([value & 0xFF]) * min(count, _MMAP_THRESHOLD)
        for start in range(0, count, len(chunk)):
            n = min(len(chunk), count - start)
            region[start:start + n] = chunk[:n]

    # ---- unified memory ---------------------------------------------------------------------

    def mem_alloc_managed(self, size: int, flags: int) -> int:
        if flags not in (1, 2):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"managed flags {flags}")
        with self._lock:
            return self._memory.alloc(size, self._current_device(), managed=True, packed=True)

    def mem_address_range(self, ptr: int) -> tuple[int, int]:
        with self._lock:
            if ptr in self._var_ranges:
                return ptr, self._var_ranges[ptr]
            block = self._memory.block(ptr)
        if block is None:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} is not device memory")
        return block.base, block.size

    def _managed(self, ptr: int, count: int) -> tuple[_Block, _Managed]:
        block = self._memory.block(ptr)
        if block is None or block.managed is None or ptr + count > block.base + block.size:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{ptr:#x}+{count} is not managed memory")
        return block, block.managed

    def _check_location(self, location_type: int, location_id: int) -> tuple[int, int]:
        if location_type == 1:
            self._check_device(location_id)
        elif location_type not in HOST_LOCATIONS:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"location type {location_type}")
        return location_type, location_id

    def mem_advise(self, ptr: int, count: int, advice: int, location_type: int,
                   location_id: int) -> None:
        """Advice applies to the host pages of [ptr, ptr+count) only; it moves nothing."""
        with self._lock:
            block, state = self._managed(ptr, count)
            change: Callable[[_Advice], _Advice]
            if advice in (1, 2):
                change = partial(replace, read_mostly=advice == 1)
            elif advice == 3:
                change = partial(replace, preferred=self._check_location(location_type, location_id))
            elif advice == 4:
                change = partial(replace, preferred=(0, 0))
            elif advice in (5, 6):
                if self._check_location(location_type, location_id)[0] != 1:
                    return
                if advice == 5:
                    def change(a: _Advice) -> _Advice:
                        return replace(a, accessed_by=a.accessed_by | {location_id})
                else:
                    def change(a: _Advice) -> _Advice:
                        return replace(a, accessed_by=a.accessed_by - {location_id})
            else:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"advice {advice}")
            state.update(ptr - block.base, ptr - block.base + count, change)

    def mem_prefetch(self, ptr: int, count: int, location_type: int, location_id: int,
                     flags: int, stream: Any) -> None:
        """The pages overlapping [ptr, ptr+count) move, whole, to the location when the stream
        gets there, whatever the advice says; the range's last prefetch location is what the
        program asked for at once (as cuMemRangeGetAttribute reports it)."""
        with self._lock:
            self._check_stream(stream)
            block, state = self._managed(ptr, count)
            location = self._check_location(location_type, location_id)
            lo = ptr - block.base
            state.update(lo, lo + count, partial(replace, last_prefetch=location))
            device = location_id if location_type == 1 else None
            self._issue(stream, self._migrate, block, lo, lo + count, device)

    def _migrate(self, block: _Block, lo: int, hi: int, device: int | None) -> None:
        if self._memory.block(block.base) is block:  # not freed while the stream was held
            self._memory.migrate(block, lo, hi, device)

    def mem_range_attribute(self, ptr: int, count: int, attribute: int, data_size: int) -> bytes:
        """For the whole range, as the driver answers: a value all its pages share, else read
        mostly 0, locations none (-2, type 0); accessed-by lists the devices every page has."""
        def legacy(location: tuple[int, int]) -> int:  # device id, -1 CPU, -2 none
            return location[1] if location[0] == 1 else -1 if location[0] in HOST_LOCATIONS else -2

        def shared(locations: set[tuple[int, int]]) -> tuple[int, int]:
            return locations.pop() if len(locations) == 1 else (0, 0)

        with self._lock:
            block, state = self._managed(ptr, count)
            advice = [a for _s, _e, a in state.segments(ptr - block.base, ptr - block.base + count)]
        values: list[int]
        if attribute == 1:
            values = [int(all(a.read_mostly for a in advice))]
        elif attribute in (2, 4):
            values = [legacy(shared({a.preferred if attribute == 2 else a.last_prefetch
                                     for a in advice}))]
        elif attribute == 3:
            if data_size % 4 or not data_size:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, "accessed-by size")
            values = sorted(frozenset.intersection(*(a.accessed_by for a in advice)))[: data_size // 4]
            values += [-2] * (data_size // 4 - len(values))
        elif attribute in (5, 6, 7, 8):
            location = shared({a.preferred if attribute in (5, 6) else a.last_prefetch
                               for a in advice})
            values = [location[0] if attribute in (5, 7) else location[1]]
        else:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"range attribute {attribute}")
        if attribute != 3 and data_size != 4:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"attribute {attribute} is 4 bytes")
        return b"".join(v.to_bytes(4, "little", signed=True) for v in values)

    def stream_attach_mem(self, stream: Any, ptr: int, length: int, flags: int) -> None:
        with self._lock:
            self._check_stream(stream)
            self._managed(ptr, max(length, 1))
        if flags not in (1, 2, 4):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"attach flags {flags}")

    def managed_residency(self, device: int) -> tuple[int, int]:
        """(resident, peak) bytes of managed pages on `device`: a page is resident on at most one
        device, from the first touch there (a launch pointing into its block, a copy or memset
        writing it, a prefetch) until it moves (prefetch, a touch elsewhere) or is freed."""
        self._check_device(device)
        with self._lock:
            return self._memory.resident[device], self._memory.peak[device]

    def _touched(self, stream: Any, device: int, spans: list[tuple[int, int]]) -> None:
        """`device` writes (or a kernel there reaches) the spans (address, bytes) next on
        `stream`: the managed pages among them become resident there (SimMemory.touch)."""
        found = []
        for addr, count in spans:
            block = self._memory.block(addr)
            if block is not None and block.managed is not None and count > 0:
                lo = addr - block.base
                found.append((block, lo, min(lo + count, block.size)))
        if found:
            self._issue(stream, self._touch, device, found)

    def _touch(self, device: int, found: list[tuple[_Block, int, int]]) -> None:
        for block, lo, hi in found:
            if self._memory.block(block.base) is block:  # not freed while the stream was held
                self._memory.touch(block, lo, hi, device)

    def host_register(self, address: int, size: int) -> None:
        """Nothing to pin: the sim copies with the CPU."""

    def host_unregister(self, address: int) -> None:
        """Nothing was pinned; a mapped range (map_host) is no longer reachable by kernels."""
        with self._lock:
            self._memory.unmap_host(address)

    def memcpy_htod_async(self, dst: int, src: int, count: int, stream: Any) -> None:
        """The bytes are read when the stream runs the copy (now, or when a gate opens)."""
        _check_count(count)
        with self._lock:
            self._check_stream(stream)
            if count:
                self._device_range(dst, count)
                self._touched(stream, self._current_device(), [(dst, count)])
                self._issue(stream, self._htod_from, dst, src, count)

    def _htod_from(self, dst: int, src: int, count: int) -> None:
        self._device_range(dst, count)[:] = ctypes.string_at(src, count)

    def memcpy_dtoh_async(self, dst: int, src: int, count: int, stream: Any) -> None:
        _check_count(count)
        with self._lock:
            self._check_stream(stream)
            if count:
                self._device_range(src, count)
                self._issue(stream, self._dtoh_to, dst, src, count)

    def _dtoh_to(self, dst: int, src: int, count: int) -> None:
        ctypes.memmove(dst, bytes(self._device_range(src, count)), count)

    # ---- streams held back by gates (sim lock held) --------------------------------------

    def _issue(self, stream: Any, fn: Callable[..., None], *args: Any) -> None:
        """fn(*args) now, or in order once the held stream gets there (host views copied); on
        a capturing stream, into its capture."""
        if stream is not None and (stream.queue or stream.capture is not None):
            work = partial(fn, *(bytes(a) if isinstance(a, memoryview) else a for a in args))
            if stream.capture is not None:
                stream.capture.append(work)
            else:
                stream.queue.append(work)
        else:
            fn(*args)

    def _hold(self, stream: Any, ready: Callable[[], bool]) -> None:
        """Hold `stream` back until ready() (checked now, and whenever kick() runs)."""
        if stream is not None and stream.capture is not None:
            stream.capture.append(_Hold(ready))
            return
        if stream is None or (not stream.queue and ready()):
            return
        stream.queue.append(_Hold(ready))
        self._held.add(stream)

    def _wait_idle(self, stream: Any) -> None:
        """Block until nothing holds `stream` back (a gate opens from another thread). A
        capturing stream cannot be waited for: the capture fails, as on a GPU."""
        if stream is not None and stream.capture is not None:
            self._break_capture(stream, BackendError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                                                     "a wait on a capturing stream"))
        if stream is not None and stream.queue:
            self._cond.wait_for(lambda: not stream.queue)

    def _pump(self) -> None:
        """Run what held streams may run now, until nothing moves."""
        moved = True
        while moved:
            moved = False
            for stream in list(self._held):
                q = stream.queue
                while q:
                    head = q[0]
                    if isinstance(head, _Hold):
                        if not head.ready():
                            break
                        q.popleft()
                    else:
                        q.popleft()
                        try:
                            head()
                        except BackendError as exc:
                            stream.error = stream.error or exc
                            if exc.code in STICKY_ERRORS:
                                self._poison(exc)
                    moved = True
                if not q:
                    self._held.discard(stream)
        self._cond.notify_all()

    def kick(self) -> None:
        with self._lock:
            self._pump()

    def gate(self, stream: Any, gate: Gate) -> None:
        """The gate's host function, then a hold until its word reaches the target: the same
        C code (daemon/native/gates.c) the driver runs on a GPU."""
        ptr = ffi.cast("pilot_gate *", gate.address)
        target = gate.target  # as cuStreamWaitValue32 takes it: the slot may be re-armed later
        with self._lock:
            self._check_stream(stream)
            if gate.stream_callback:
                self._issue(stream, lib.pilot_gate_fire_status, ffi.NULL, 0, ptr)
            else:
                self._issue(stream, lib.pilot_gate_fire, ptr)
            self._hold(stream, lambda: (int(ptr.word) - target) & 0xFFFFFFFF < 0x80000000)

    def stream_write_value32(self, stream: Any, address: int, value: int) -> list[bool]:
        """cuStreamWriteValue32 into mapped host memory (map_host; the fast path's completion
        words): written when the stream gets there, as on a GPU. Returns a marker, [True] once
        written (the event the native path records behind the write)."""
        written = [False]
        with self._lock:
            self._check_stream(stream)
            block = self._memory.block(address)
            if block is None or not block.host or address % 4 or address + 4 > block.base + block.size:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{address:#x} is no mapped host word")
            self._issue(stream, self._write_value32, block, address - block.base, value, written)
        return written

    @staticmethod
    def _write_value32(block: Any, offset: int, value: int, written: list[bool]) -> None:
        block.data[offset:offset + 4] = value.to_bytes(4, "little")
        written[0] = True

    def stream_write_word(self, stream: Any, address: int, value: int) -> None:
        with self._lock:
            self._check_stream(stream)
            self._device_range(address, 4)  # a bad address fails now
            self._issue(stream, self._write_word, address, value)

    def _write_word(self, address: int, value: int) -> None:
        self._device_range(address, 4)[:] = value.to_bytes(4, "little")
        self._pump()  # a stream waiting on the word may go on

    def stream_wait_word(self, stream: Any, address: int, value: int) -> None:
        with self._lock:
            self._check_stream(stream)
            self._device_range(address, 4)
            self._hold(stream, lambda: int.from_bytes(self._device_range(address, 4), "little") == value)

    def map_host(self, address: int, size: int) -> None:
        """Nothing to pin; kernels and copies reach the range at a device address of its own."""
        with self._lock:
            self._memory.map_host(address, size, self._current_device())

    def host_device_pointer(self, address: int) -> int:
        with self._lock:
            alias = self._memory.host_alias(address)
        if alias is None:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{address:#x} is no mapped host memory")
        return alias

    def _raise_stream_error(self, stream: Any) -> None:
        if stream is not None and stream.error is not None:
            exc, stream.error = stream.error, None
            raise exc

    # ---- streams and events ---------------------------------------------------------------

    def _check_stream(self, stream: Any) -> None:
        if stream is not None and not (isinstance(stream, _Stream) and stream.alive):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad stream {stream!r}")
        if stream is None and self._capturing:
            captured = self._capturing.get(threading.get_ident())
            if captured is not None:  # thread-local capture mode: the legacy stream is implicit
                self._break_capture(captured, BackendError(
                    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "the legacy stream during a capture"))

    def _break_capture(self, stream: _Stream, exc: BackendError) -> None:
        """An operation a capture cannot hold: the capture is invalidated and the call fails."""
        stream.capture_error = stream.capture_error or exc
        raise exc

    # ---- graphs ----

    def stream_begin_capture(self, stream: Any) -> None:
        with self._lock:
            self._check_stream(stream)
            if stream is None:
                raise BackendError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "capture of the legacy stream")
            if stream.capture is not None or threading.get_ident() in self._capturing:
                raise BackendError(CUDA_ERROR_ILLEGAL_STATE, "already capturing")
            stream.capture, stream.capture_error = [], None
            self._capturing[threading.get_ident()] = stream

    def stream_end_capture(self, stream: Any) -> Any:
        with self._lock:
            self._check_stream(stream)
            if stream is None or stream.capture is None:
                raise BackendError(CUDA_ERROR_ILLEGAL_STATE, "the stream is not capturing")
            work, failed = stream.capture, stream.capture_error
            stream.capture = stream.capture_error = None
            self._capturing.pop(threading.get_ident(), None)
            if failed is not None:
                raise BackendError(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, f"capture invalidated: {failed}")
            return _Graph(work)

    def graph_instantiate(self, graph: Any) -> tuple[Any, int]:
        if not (isinstance(graph, _Graph) and graph.alive):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad graph {graph!r}")
        graph.alive = False
        return _Graph(list(graph.work)), len(graph.work)

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        with self._lock:
            if not (isinstance(graph_exec, _Graph) and graph_exec.alive):
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad executable graph {graph_exec!r}")
            self._check_stream(stream)
            for work in graph_exec.work:
                if isinstance(work, _Hold):
                    self._hold(stream, work.ready)
                else:
                    self._issue(stream, work)
            if self._held:
                self._pump()

    def graph_exec_destroy(self, graph_exec: Any) -> None:
        if not (isinstance(graph_exec, _Graph) and graph_exec.alive):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad executable graph {graph_exec!r}")
        graph_exec.alive = False

    def fast_graph_exec(self, graph_exec: Any) -> int:
        return id(graph_exec)

    def _event(self, event: Any) -> _Event:
        if not (isinstance(event, _Event) and event.alive):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad event {event!r}")
        return event

    def stream_create(self, flags: int, priority: int) -> Any:
        if flags & ~STREAM_NON_BLOCKING:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad stream flags {flags:#x}")
        least, greatest = STREAM_PRIORITY_RANGE
        return _Stream(flags, min(least, max(greatest, priority)))  # clamped, as CUDA does

    def partition_stream_create(self, partition: Any, flags: int, priority: int) -> Any:
        if not (isinstance(partition, _Partition) and partition.alive):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad partition {partition!r}")
        stream = self.stream_create(flags, priority)
        stream.partition = partition
        return stream

    def stream_destroy(self, stream: Any) -> None:
        with self._lock:
            if stream is None:
                raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, "cannot destroy stream 0")
            self._check_stream(stream)
            stream.alive = False

    def stream_synchronize(self, stream: Any) -> None:
        with self._lock:
            self._check_stream(stream)
            self._wait_idle(stream)
            self._flush_printf()
            self._raise_stream_error(stream)

    def stream_query(self, stream: Any) -> bool:
        with self._lock:
            self._check_stream(stream)
            if stream is not None and stream.capture is not None:
                self._break_capture(stream, BackendError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                                                         "a query of a capturing stream"))
            return stream is None or not stream.queue

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        with self._lock:
            self._check_stream(stream)
            ev = self._event(event)
            target = ev.issued  # the record it waits for: the last one issued so far
            self._hold(stream, lambda: ev.done >= target)

    def event_create(self, flags: int) -> Any:
        known = EVENT_BLOCKING_SYNC | EVENT_DISABLE_TIMING | EVENT_INTERPROCESS
        if flags & ~known or (flags & EVENT_INTERPROCESS and not flags & EVENT_DISABLE_TIMING):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad event flags {flags:#x}")
        return _Event(flags)

    def event_destroy(self, event: Any) -> None:
        with self._lock:
            self._event(event).alive = False

    def event_record(self, event: Any, stream: Any) -> None:
        with self._lock:
            self._check_stream(stream)
            ev = self._event(event)
            ev.issued += 1
            self._issue(stream, self._recorded, ev, ev.issued)

    @staticmethod
    def _recorded(ev: _Event, generation: int) -> None:
        ev.recorded_ns = time.perf_counter_ns()
        ev.done = max(ev.done, generation)

    def event_synchronize(self, event: Any) -> None:
        with self._lock:
            ev = self._event(event)
            target = ev.issued
            self._cond.wait_for(lambda: ev.done >= target)
            self._flush_printf()

    def event_query(self, event: Any) -> bool:
        with self._lock:
            ev = self._event(event)
            return ev.done >= ev.issued

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        with self._lock:
            first, last = self._event(start), self._event(end)
            for ev in (first, last):
                if ev.done < ev.issued:
                    raise BackendError(CUDA_ERROR_NOT_READY, "event not completed yet")
                if ev.flags & EVENT_DISABLE_TIMING:
                    raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE,
                                       "event created with cudaEventDisableTiming")
                if ev.recorded_ns is None:
                    raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, "event never recorded")
            assert first.recorded_ns is not None and last.recorded_ns is not None
            return (last.recorded_ns - first.recorded_ns) / 1e6

    # ---- execution ------------------------------------------------------------------------

    def link(self, inputs: list[Any], options: list[tuple[int, int]]) -> tuple[bytes, str]:
        return sim_link(inputs)

    def module_load(self, image: bytes) -> Any:
        try:
            kernels = kernel_infos_in_image(image)
            layout = loaded_globals(image, H100_ATTRS[75] * 10 + H100_ATTRS[76])  # the driver's choice
        except ValueError as exc:
            # The driver's answers for an image it cannot use: PTX its JIT rejects, or any other
            # bytes (a broken fatbin or cubin, or what is neither).
            ptx = not is_elf(image) and not is_fatbin(image) and ptx_text(image) is not None
            raise BackendError(CUDA_ERROR_INVALID_PTX if ptx else CUDA_ERROR_INVALID_IMAGE,
                               f"cannot read image: {exc}") from exc
        if is_elf(image):
            # A cubin runs on its own SM major at the same or a later minor, as on the GPU.
            arch, sm = elf_arch(image), H100_ATTRS[75] * 10 + H100_ATTRS[76]
            if arch // 10 != sm // 10 or arch % 10 > sm % 10:
                raise BackendError(CUDA_ERROR_NO_BINARY_FOR_GPU,
                                   f"a cubin for sm_{arch} cannot run on this sm_{sm} device")
        module = _Module(kernels, getattr(self._thread, "partition", None),
                         attrs=image_function_attrs(image))
        module.loaded_bytes = layout.size
        if layout.size:
            with self._lock:
                base = self._memory.alloc(layout.size, self._current_device())
                block = self._device_range(base, layout.size)
                block[:] = bytes(layout.size)  # the loader zeroes what has no initializer
                for offset, data in layout.init:
                    block[offset:offset + len(data)] = data
            module.globals_block = base
            module.globals = {name: (base + offset, size)
                              for name, (offset, size) in layout.variables.items()}
            if layout.managed:
                module.managed_block = self._place_managed(module, layout.managed)
        return module

    def module_loaded_bytes(self, module: Any, image: bytes) -> int:
        return self._module(module).loaded_bytes

    def _place_managed(self, module: _Module, names: frozenset[str]) -> int:
        """Moves the module's __managed__ variables into a managed block of their own (the driver
        puts them in managed memory), initial values included."""
        spans = [(name, *module.globals[name]) for name in sorted(names)]
        layout, offset = {}, 0
        for name, _addr, size in spans:
            offset = -(-offset // 8) * 8
            layout[name] = offset
            offset += size
        with self._lock:
            base = self._memory.alloc(max(offset, 1), self._current_device(), managed=True)
            block = self._device_range(base, max(offset, 1))
            for name, addr, size in spans:
                block[layout[name]:layout[name] + size] = self._device_range(addr, size)
                module.globals[name] = (base + layout[name], size)
                # Like the driver (seen on the H100), each variable is an address range of its
                # own, so several share a page.
                self._var_ranges[base + layout[name]] = size
        return base

    def _module(self, module: Any) -> _Module:
        if not (isinstance(module, _Module) and module.alive):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad module {module!r}")
        return module

    def module_unload(self, module: Any) -> None:
        with self._lock:
            mod = self._module(module)
            mod.alive = False
            if mod.globals_block:
                self._memory.free(mod.globals_block)
                mod.globals_block = 0
            if mod.managed_block:
                self._memory.free(mod.managed_block)
                mod.managed_block = 0
                for address, _size in mod.globals.values():
                    self._var_ranges.pop(address, None)

    def module_get_global(self, module: Any, name: str) -> tuple[int, int]:
        with self._lock:
            found = self._module(module).globals.get(name)
        if found is None:
            raise BackendError(CUDA_ERROR_INVALID_SYMBOL, f"variable {name} is not in the module")
        return found

    def function_get(self, module: Any, name: str) -> FunctionInfo:
        with self._lock:
            mod = self._module(module)
            info = mod.kernels.get(name)
            if info is None:
                raise BackendError(CUDA_ERROR_INVALID_DEVICE_FUNCTION,
                                   f"kernel {name} is not in the module")
            handle = mod.functions.get(name)
            if handle is None:  # one per kernel, so attributes set through it stay
                max_threads = min(info.max_threads or MAX_BLOCK_THREADS, MAX_BLOCK_THREADS)
                handle = mod.functions[name] = _Function(
                    mod, info, max_threads, _initial_attrs(max_threads, mod.attrs.get(name)))
            return FunctionInfo(handle=handle, params=list(info.params),
                                max_threads_per_block=handle.max_threads,
                                static_shared_bytes=handle.attrs[FA_SHARED],
                                max_dynamic_shared_bytes=handle.max_dynamic_shared)

    def native_fast_functions(self) -> tuple[int, int, int] | None:
        """None: the vGPU's fast path calls back into `launch` and the copies (vgpu/fast.py)."""
        return None

    # ---- CUDA math libraries (sim_blas.py) ----

    def library_version(self, library: int) -> int:
        return SIM_LIBRARY_VERSION

    def library_create(self, library: int) -> Any:
        with self._lock:
            self._library_handles += 1
            return ("sim", library, self._library_handles)

    def library_release(self, handle: Any) -> None:
        pass

    def _region(self, addr: int, count: int) -> memoryview:
        return self._device_range(addr, count)

    def blas_gemm(self, handle: Any, call: GemmCall, settings: BlasSettings, stream: Any) -> None:
        with self._lock:
            self._check_stream(stream)
            self._flush_printf()
            self._issue(stream, sim_blas.gemm, self._region, call, settings.pointer_mode)

    def fast_library_functions(self) -> dict[int, int]:
        return {}  # the fast path calls back (vgpu/fast.py)

    def fast_library_handle(self, handle: Any) -> int:
        return int(handle[2]) if isinstance(handle, tuple) else id(handle)  # cuBLAS's, cuDNN's

    def fast_lt_descriptors(self, handle: Any, key: bytes) -> list[int] | None:
        return [1, 2, 3, 4, 5]  # none are made: the callback runs the matmul from the records

    def fast_lt_evicted(self, handle: Any) -> list[bytes]:
        return []

    def library_state_reset(self, handle: Any) -> None:
        pass

    def fast_dnn_plan(self, plan: Any) -> int:
        return 1  # the callback runs the plan pilotd's number names

    def blaslt_matmul(self, handle: Any, call: LtCall, key: bytes, stream: Any) -> None:
        with self._lock:
            self._check_stream(stream)
            self._flush_printf()
            self._issue(stream, sim_blas.lt_matmul, self._region, call)

    def blaslt_heuristic(self, handle: Any, call: LtCall, key: bytes, requested: int) -> list[bytes]:
        return sim_blas.lt_heuristic(call, requested)

    def blas_call(self, handle: Any, fn: Any, args: list[int], named: dict[str, int],
                  scalars: list[bytes], settings: BlasSettings, stream: Any,
                  host_result: bool, arrays: dict[str, tuple[int, ...]]) -> bytes | None:
        device = settings.pointer_mode == 1
        with self._lock:
            self._check_stream(stream)
            self._flush_printf()
            if not host_result:
                self._issue(stream, sim_blas.generic, self._region, fn, named, scalars, device,
                            arrays)
                return None
            self._wait_idle(stream)  # the host waits for the result, as natively
            return sim_blas.generic(self._region, fn, named, scalars, device, arrays)

    # ---- cuDNN (sim_dnn.py) ----

    def dnn_version(self) -> tuple[int, int]:
        """The H100's cuDNN unless PILOT_SIM_CUDNN_VERSION names another 9.x (major*10000 +
        minor*100 + patch): PyTorch refuses a cuDNN older than the one it was built with, so a
        test running a newer PyTorch against the sim says which one it expects."""
        wanted = os.environ.get("PILOT_SIM_CUDNN_VERSION", "")
        version = int(wanted) if wanted.isdigit() and 90000 <= int(wanted) < 100000 \
            else SIM_DNN_VERSION
        return version, SIM_DNN_CUDART_VERSION

    def dnn_create(self) -> Any:
        return sim_dnn.Handle(self._current_device())

    def dnn_release(self, handle: Any) -> None:
        if not isinstance(handle, sim_dnn.Handle):
            sim_dnn.check_handle(handle)  # raises
        handle.alive = False  # its plans still run with a live handle, as in cuDNN

    def dnn_desc_create(self, dtype: int) -> Any:
        return sim_dnn.Descriptor(dtype)

    def dnn_desc_set(self, desc: Any, attr: int, atype: int, count: int,
                     value: bytes | list[Any]) -> None:
        with self._lock:
            sim_dnn.set_attribute(desc, attr, atype, count, value)

    def dnn_desc_get(self, desc: Any, attr: int, atype: int, requested: int,
                     descs: list[Any] | None) -> tuple[int, bytes]:
        with self._lock:
            return sim_dnn.get_attribute(desc, attr, atype, requested, descs)

    def dnn_desc_finalize(self, desc: Any) -> None:
        with self._lock:
            sim_dnn.finalize(desc)

    def dnn_desc_destroy(self, desc: Any) -> None:
        with self._lock:
            sim_dnn.destroy(desc)

    def dnn_execute(self, handle: Any, plan: Any, uids: list[int], pointers: list[int],
                    workspace: int, stream: Any) -> None:
        with self._lock:
            sim_dnn.check_handle(handle)
            op = sim_dnn.plan_op(plan)
            bound = sim_dnn.bind(op, uids, pointers)
            self._check_stream(stream)
            for tensor, ptr in bound.values():
                self._region(ptr, tensor.span())  # a bad range fails now, held or not
            self._flush_printf()
            self._issue(stream, sim_dnn.execute, self._region, op, bound)

    def dnn_batchnorm(self, handle: Any, call: BatchNormCall, stream: Any) -> int:
        with self._lock:
            sim_dnn.check_handle(handle)
            if call.fn in BN_SIZE_QUERIES:
                return 0  # the sim needs no workspace or reserve space
            buffers = sim_dnn.check_batchnorm(call)
            self._check_stream(stream)
            for ptr, tensor in buffers:
                self._region(ptr, tensor.span())
            self._flush_printf()
            self._issue(stream, sim_dnn.batchnorm, self._region, call)
            return 0

    def launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, stream: Any, args: bytes) -> None:
        name = getattr(getattr(function, "info", None), "name", "")
        run = self._run_variant if name.endswith((SUFFIX, LOOP_SUFFIX)) else self._kernels.run
        self._launch(function, grid, block, shared_bytes, stream, args, run)

    # A test's stand-in for a retreat that comes while a variant runs: when the stream reaches a
    # launch whose retreat word is set, its blocks still make this many claims first.
    claims_before_retreat = 0
    # And a loop-level variant's blocks (LOOP_SUFFIX) then abandon this many of the logical
    # blocks they ran last (one per persistent block at most): those ran, as far as the sim
    # knows, whole (what an idempotent kernel's run to any point leaves behind is then what
    # its run again makes), and go on the slot's redo list for the rest.
    abandons_on_retreat = 0

    def _run_variant(self, launch: SimLaunch) -> None:
        """A preemptible variant (ptx_preempt.py) as a GPU runs it, for the emulation of its
        kernel: the first wave, then claims from its counter until the grid is done or, with
        its retreat word or its second one (`sflag`) set when the stream gets there,
        `claims_before_retreat` claims. An
        emulation that runs only whole grids (not `sim_kernels.blockwise`) sees the retreat too
        late: all of the rest runs (a GPU may do that as well)."""
        ours = launch.params[-len(PARAMS):]
        ctl, flag = (int.from_bytes(p, "little") for p in ours[:2])
        total, gx, gy, gz, chunk, first = (int.from_bytes(p, "little") for p in ours[2:8])
        tally, sflag, redo, part = (int.from_bytes(p, "little") for p in ours[8:12])
        loop = launch.name.endswith(LOOP_SUFFIX)
        base = launch.name.removesuffix(LOOP_SUFFIX if loop else SUFFIX)
        fn = self._kernels.get(base)
        counter = struct.unpack("<I", self._device_range(ctl, COUNTER_BYTES))[0]
        # both words are read only with flag (a launch without one is a last part: it never
        # retreats)
        retreat = bool(flag) and any(struct.unpack("<I", self._device_range(w, 4))[0] != 0
                                     for w in (flag, sflag) if w)
        if fn is not None and not getattr(fn, "blockwise", False):
            retreat = False
        wave, claimed, after = claimed_blocks(counter, total, retreat, first, chunk,
                                              self.claims_before_retreat if retreat else None)
        self._device_range(ctl, COUNTER_BYTES)[:] = struct.pack("<I", after)
        # as the variant does (ptx_preempt.py): block 0 of each part zeroes the next part's
        # count and accounts the retreat of the part before; a later part's claims count their
        # blocks; a block that retreats stamps its part's readings
        # the slot's and the tally's views, taken once (a launch without a tally has neither)
        views = (self._device_range(ctl, SLOT_BYTES), self._device_range(tally, TALLY_BYTES)) \
            if tally else None
        if views is not None:
            start_part(*views, part)
        again: list[int] = []  # a later part's blocks from the redo list
        if loop and redo and part:
            made = struct.unpack("<I", self._device_range(redo, 4))[0]
            again = [b for r in take_redo(self._device_range(redo, redo_bytes(made))) for b in r]
        ran = [*wave, *claimed]
        abandoned = ran[-min(self.abandons_on_retreat, launch.grid[0]):] \
            if loop and redo and flag and retreat and self.abandons_on_retreat else []
        if abandoned:  # the list holds a launch's persistent blocks' entries
            made = struct.unpack("<I", self._device_range(redo, 4))[0]
            listed = self._device_range(redo, redo_bytes(made + len(abandoned)))
            for b in abandoned:
                abandon(listed, views[1] if views is not None else None, b, 1)
        if views is not None and part:
            count_resumed(*views, part, len(claimed) + len(again))
        if views is not None and retreat:
            stamp_retreat(views[0], time.monotonic_ns(), part)
        launch.name, launch.grid, launch.params = base, (gx, gy, gz), launch.params[:-len(PARAMS)]
        if again:
            launch.blocks = [*again, *claimed]
        elif wave.stop >= claimed.start:
            launch.blocks = range(0, max(wave.stop, claimed.stop))
        else:
            launch.blocks = [*wave, *claimed]
        if gx * gy * gz != total:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{launch.name}: a variant's grid "
                               f"{(gx, gy, gz)} is not its total {total}")
        if not launch.blocks:
            return  # nothing left: the blocks claim nothing and leave
        if fn is not None and not getattr(fn, "blockwise", False) and launch.blocks != range(total):
            raise BackendError(CUDA_ERROR_NOT_SUPPORTED, f"sim kernel {base} runs only whole grids "
                               "(not @blockwise), not part of one")
        self._kernels.run(launch)

    def _launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                shared_bytes: int, stream: Any, args: bytes, run: Callable[[SimLaunch], None]) -> None:
        with self._lock:
            if not isinstance(function, _Function):
                raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad function {function!r}")
            self._module(function.module)
            self._check_stream(stream)
            self._check_context(function.module, stream)
            _check_launch_config(grid, block, shared_bytes, function.max_threads,
                                 function.max_dynamic_shared)
            layout = function.info.params
            need = max((off + size for off, size in layout), default=0)
            if len(args) < need:
                raise BackendError(CUDA_ERROR_INVALID_VALUE,
                                   f"{function.info.name} takes {need} bytes of arguments, "
                                   f"got {len(args)}")
            params = [bytes(args[off:off + size]) for off, size in layout]
            self._flush_printf()  # the driver prints what earlier kernels printed
            launch = SimLaunch(function.info.name, (grid[0], grid[1], grid[2]),
                               (block[0], block[1], block[2]), shared_bytes, params, self._memory,
                               symbols=function.module.globals, images=self._image,
                               printf=self._printf.append)
            self._touched(stream, self._current_device(), self._pointed_blocks(layout, args))
            try:
                self._issue(stream, run, launch)
            except BackendError as exc:
                if exc.code not in STICKY_ERRORS:
                    raise
                self._poison(exc)  # the launch itself succeeds: the GPU reports faults later

    def _pointed_blocks(self, layout: list[tuple[int, int]], args: bytes) -> list[tuple[int, int]]:
        """(base, size) of the managed blocks that the launch's 8-byte-aligned argument words
        point into, in parameters of 8 bytes or more: the daemon's footprint rule
        (scheduling/launch.py). The kernel is taken to reach all of each such block."""
        found: dict[int, int] = {}
        for offset, size in layout:
            for at in range(-(-offset // 8) * 8, offset + size - 7, 8):
                block = self._memory.block(int.from_bytes(args[at:at + 8], "little"))
                if block is not None and block.managed is not None:
                    found[block.base] = block.size
        return list(found.items())

    def launch_ex(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                  shared_bytes: int, stream: Any, args: bytes, attrs: LaunchAttrs) -> None:
        """What an H100 refuses at the launch: a cooperative grid larger than what fits on the
        device at once (occupancy x SMs), clusters that do not tile the grid or exceed 8 blocks
        (16 with the non-portable attribute). Priorities only order work: nothing to emulate."""
        with self._lock:
            fn = self._function(function)
            if attrs.cooperative:
                threads = block[0] * block[1] * block[2]
                per_sm = self.occupancy(function, threads, shared_bytes, 0) if threads <= 1024 else 0
                sms = self._sms(stream)
                if grid[0] * grid[1] * grid[2] > per_sm * sms:
                    raise BackendError(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                                       f"{grid} blocks of {threads} threads: at most "
                                       f"{per_sm} per SM x {sms} SMs co-resident")
            if attrs.cluster is not None:
                cluster = attrs.cluster
                most = MAX_CLUSTER_NON_PORTABLE if fn.attrs[FA_NON_PORTABLE_CLUSTER] else MAX_CLUSTER_PORTABLE
                size = cluster[0] * cluster[1] * cluster[2]
                if not size or size > most or any(g % c for g, c in zip(grid, cluster, strict=True)):
                    raise BackendError(CUDA_ERROR_INVALID_CLUSTER_SIZE,
                                       f"cluster {cluster} for grid {grid} (at most {most} blocks)")
            self.launch(function, grid, block, shared_bytes, stream, args)

    # ---- several devices --------------------------------------------------------------------

    def can_access_peer(self, device: int, peer: int) -> bool:
        """Every simulated GPU reaches every other (one address space, like NVLink peers)."""
        self._check_device(device)
        self._check_device(peer)
        return device != peer

    def enable_peer_access(self, device: int, peer: int) -> None:
        if not self.can_access_peer(device, peer):
            raise BackendError(CUDA_ERROR_INVALID_DEVICE, f"device {device} cannot reach {peer}")

    def memcpy_peer(self, dst: int, dst_device: int, src: int, src_device: int, count: int,
                    stream: Any) -> None:
        _check_count(count)
        self._check_device(dst_device)
        self._check_device(src_device)
        with self._lock:
            self._check_stream(stream)
            for addr, device in ((dst, dst_device), (src, src_device)):
                self._device_range(addr, count)
                if count and self._memory.device_of(addr) != device:
                    raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{addr:#x} is not on device {device}")
            if count:
                self._touched(stream, dst_device, [(dst, count)])
                self._issue(stream, self._dtod, dst, src, count)

    # ---- limits, stream priorities, function attributes, occupancy, 2D memory -------------

    def _limits(self) -> dict[int, int]:
        return self._limit_values.setdefault(self._current_device(), dict(DEFAULT_LIMITS))

    def ctx_get_limit(self, limit: int) -> int:
        with self._lock:
            value = self._limits().get(limit)
        if value is None:
            raise BackendError(CUDA_ERROR_UNSUPPORTED_LIMIT, f"no limit {limit}")
        return value

    def ctx_set_limit(self, limit: int, value: int) -> None:
        with self._lock:
            limits = self._limits()
            if limit not in limits:
                raise BackendError(CUDA_ERROR_UNSUPPORTED_LIMIT, f"no limit {limit}")
            if value < 0:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"limit {limit}: {value}")
            limits[limit] = -(-value // 16) * 16 if limit == 0 else value  # stacks: 16-byte units

    def stream_priority_range(self) -> tuple[int, int]:
        return STREAM_PRIORITY_RANGE

    def stream_priority(self, stream: Any) -> int:
        with self._lock:
            self._check_stream(stream)
            return stream.priority if stream is not None else 0

    def _check_context(self, module: _Module, stream: Any) -> None:
        """A kernel whose module was loaded in another context than its stream's: on the H100
        (a primary-context module on a green-context stream) the launch returned success and
        the kernel faulted with cudaErrorIllegalAddress, fatal to the context (which of the
        mix-ups that run tried are safe is open: bench/RESULTS.md). The sim fails it the same
        way, at the launch, so a daemon path that mixes contexts shows in CI."""
        stream_part = stream.partition if isinstance(stream, _Stream) else None
        if module.partition is not stream_part:
            raise BackendError(CUDA_ERROR_ILLEGAL_ADDRESS,
                               "kernel of a module loaded in another context than its stream's")

    def _sms(self, stream: Any) -> int:
        """The SMs a launch on `stream` may use: its partition's, else the device's."""
        part = stream.partition if isinstance(stream, _Stream) else None
        if part is not None:
            return part.sm_count
        return int(self._infos[self._current_device()].attrs.get(16, 132))

    # ---- SM partitions (compute shares) -----------------------------------------------------
    # The H100's geometry (tests/gpu/green_probe.py): 132 SMs, partitions of 8-SM units, 15 of
    # them, 12 SMs in none. Kernels take no time here, so a share shows in what the sim can
    # check: the SM count a session is told, cooperative grids, and contexts not mixed.

    def sm_layout(self, device: int) -> SmLayout | None:
        sms = int(self._infos[self._check_device(device)].attrs.get(16, 132))
        unit = 8
        units = min(sms // unit, max(1, (sms - 12) // unit))  # the H100 keeps 12 SMs apart
        return SmLayout(sms=sms, unit=unit, units=units, spare=sms - units * unit)

    def partition_create(self, device: int, units: tuple[int, ...], spare: bool) -> Any:
        layout = self.sm_layout(device)
        assert layout is not None
        if (not units and not spare) or any(not 0 <= u < layout.units for u in units) or \
                len(set(units)) != len(units):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad partition units {units}")
        return _Partition(device, tuple(units), len(units) * layout.unit + (layout.spare if spare else 0))

    def partition_destroy(self, partition: Any) -> None:
        if not (isinstance(partition, _Partition) and partition.alive):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad partition {partition!r}")
        partition.alive = False

    def use_partition(self, device: int, partition: Any) -> None:
        self._check_device(device)
        if partition is not None and not (isinstance(partition, _Partition) and partition.alive
                                          and partition.device == device):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad partition {partition!r}")
        self._thread.partition = partition

    def _function(self, function: Any) -> _Function:
        if not isinstance(function, _Function):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad function {function!r}")
        self._module(function.module)
        return function

    def function_attributes(self, function: Any) -> list[int]:
        with self._lock:
            return list(self._function(function).attrs)

    def function_set_attribute(self, function: Any, attr: int, value: int) -> None:
        """What the H100 accepts: dynamic shared memory up to the opt-in maximum less the
        static part, carveouts -1..100, the cluster attributes 11-15; 10 is read-only."""
        with self._lock:
            fn = self._function(function)
            attrs = self._infos[self._current_device()].attrs
            if attr == FA_MAX_DYNAMIC_SHARED:
                ok = 0 <= value <= attrs.get(97, 232448) - fn.attrs[FA_SHARED]
            elif attr == FA_CARVEOUT:
                ok = -1 <= value <= 100
            else:
                ok = 11 <= attr <= 15
            if not ok:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"function attribute {attr} = {value}")
            fn.attrs[attr] = value

    def available_dynamic_smem(self, function: Any, num_blocks: int, block_size: int) -> int:
        """The occupancy model below solved for shared memory: the most dynamic shared memory
        per block with which `num_blocks` blocks fit on an SM (0 when threads, block slots or
        registers already keep them off it), at most the opt-in limit per block."""
        if num_blocks <= 0 or block_size <= 0:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{num_blocks} blocks of {block_size} threads")
        if self.occupancy(function, block_size, 0, 0) < num_blocks:
            return 0
        with self._lock:
            static = self._function(function).attrs[FA_SHARED]
            attrs = self._infos[self._current_device()].attrs
        per_block = attrs.get(81, 233472) // num_blocks - static - attrs.get(111, 1024)
        return max(0, min(per_block, attrs.get(97, 232448) - static))

    def occupancy(self, function: Any, block_size: int, dynamic_smem: int, flags: int) -> int:
        """A simple model of one SM: blocks are limited by the SM's threads, block slots,
        registers (allocated per warp in units of 256) and shared memory (static + dynamic +
        the 1 KiB reserved per block). It gives the H100's answers where one resource clearly
        binds (threads, block slots); the driver's choice of shared-memory carveout is not
        modelled, so answers bound by shared memory can be higher than the driver's."""
        with self._lock:
            fn = self._function(function)
            attrs = self._infos[self._current_device()].attrs
        if block_size <= 0 or flags & ~OCCUPANCY_DISABLE_CACHING_OVERRIDE or dynamic_smem < 0:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"occupancy of {block_size} threads, flags {flags:#x}")
        if block_size > attrs.get(1, MAX_BLOCK_THREADS) or dynamic_smem > fn.max_dynamic_shared:
            return 0
        warps = -(-block_size // 32)
        regs_per_warp = -(-(fn.attrs[FA_REGS] or DEFAULT_REGS) * 32 // 256) * 256
        smem = fn.attrs[FA_SHARED] + dynamic_smem + attrs.get(111, 1024)
        return max(0, min(attrs.get(106, 32),
                          attrs.get(39, 2048) // (warps * 32),
                          attrs.get(82, 65536) // (regs_per_warp * warps),
                          attrs.get(81, 233472) // smem))

    def mem_alloc_pitch(self, width: int, height: int) -> tuple[int, int]:
        pitch = -(-width // PITCH_ALIGNMENT) * PITCH_ALIGNMENT
        return self.mem_alloc(pitch * height), pitch

    def _rows(self, addr: int, pitch: int, width: int, height: int) -> list[memoryview]:
        if height > 1 and width > pitch:
            raise BackendError(CUDA_ERROR_INVALID_PITCH_VALUE, f"width {width} > pitch {pitch}")
        return [self._device_range(addr + r * pitch, width) for r in range(height)]

    def memcpy_2d_htod(self, dst: int, dpitch: int, src: Any, spitch: int, width: int,
                       height: int, stream: Any) -> None:
        if not width or not height:
            return
        source = _host_view(src, (height - 1) * spitch + width, writable=False)
        with self._lock:
            self._check_stream(stream)
            self._rows(dst, dpitch, width, height)  # a bad range fails now, held or not
            self._touched(stream, self._current_device(), _row_spans(dst, dpitch, width, height))
            self._issue(stream, self._write_rows, dst, dpitch, source, spitch, width, height)

    def _write_rows(self, dst: int, dpitch: int, source: Any, spitch: int, width: int,
                    height: int) -> None:
        for r, row in enumerate(self._rows(dst, dpitch, width, height)):
            row[:] = source[r * spitch:r * spitch + width]

    def memcpy_2d_dtoh(self, dst: Any, dpitch: int, src: int, spitch: int, width: int,
                       height: int, stream: Any) -> None:
        if not width or not height:
            return
        target = _host_view(dst, (height - 1) * dpitch + width, writable=True)
        with self._lock:
            self._check_stream(stream)
            self._wait_idle(stream)
            for r, row in enumerate(self._rows(src, spitch, width, height)):
                target[r * dpitch:r * dpitch + width] = row

    def memcpy_2d_dtod(self, dst: int, dpitch: int, src: int, spitch: int, width: int,
                       height: int, stream: Any) -> None:
        if not width or not height:
            return
        with self._lock:
            self._check_stream(stream)
            self._touched(stream, self._current_device(), _row_spans(dst, dpitch, width, height))
            self._issue(stream, self._dtod_rows, dst, dpitch, src, spitch, width, height)

    def _dtod_rows(self, dst: int, dpitch: int, src: int, spitch: int, width: int,
                   height: int) -> None:
        rows = [bytes(row) for row in self._rows(src, spitch, width, height)]  # may overlap
        for row, data in zip(self._rows(dst, dpitch, width, height), rows, strict=True):
            row[:] = data

    def memset_2d_d8(self, ptr: int, pitch: int, value: int, width: int, height: int,
                     stream: Any) -> None:
        if not width or not height:
            return
        fill = bytes([value & 0xFF]) * width
        with self._lock:
            self._check_stream(stream)
            self._touched(stream, self._current_device(), _row_spans(ptr, pitch, width, height))
            self._issue(stream, self._fill_rows, ptr, pitch, fill, width, height)

    def _fill_rows(self, ptr: int, pitch: int, fill: bytes, width: int, height: int) -> None:
        for row in self._rows(ptr, pitch, width, height):
            row[:] = fill

    # ---- CUDA arrays, texture and surface objects (daemon/ops/arrays.py) ---------------------

    def array_create(self, width: int, height: int, depth: int, desc: ChannelDesc,
                     flags: int) -> Any:
        desc.check()
        if flags & 1:  # layered: depth counts layers
            kind, extent = ("2d_layered", (width, height, depth)) if height else \
                ("1d_layered", (width, depth))
        else:
            kind, extent = ("3d", (width, height, depth)) if depth else \
                ("2d", (width, height)) if height else ("1d", (width,))
        attrs = self._infos[self._current_device()].attrs
        limits = [attrs.get(a, 0) for a in ARRAY_LIMIT_ATTRS[kind]]
        if not width or any(n > m for n, m in zip(extent, limits, strict=True)):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"array extent {width}x{height}x{depth}")
        with self._lock:
            array = _Array(width, height, depth, desc, flags=flags)
            array.base = self._memory.alloc(array.size, self._current_device())
            return array

    def _array(self, array: Any) -> _Array:
        if not isinstance(array, _Array) or not array.alive:
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad array {array!r}")
        return array

    def array_destroy(self, array: Any, stream: Any) -> None:
        with self._lock:
            self._check_stream(stream)
            self._wait_idle(stream)
            a = self._array(array)
            self._memset(a.base, 0, a.size)
            self._memory.free(a.base)
            a.alive = False

    def _box_rows(self, side: CopySide, width: int, height: int, depth: int,
                  host: memoryview | None) -> list[memoryview]:
        """The box's rows on one side, slice after slice."""
        if side.kind == "host":
            assert host is not None
            return [host[(z * side.rows + y) * side.pitch:][:width]
                    for z in range(depth) for y in range(height)]
        if side.kind == "array":
            a = self._array(side.array)
            pitch, rows, base = a.row_bytes, a.rows, a.base
            if (side.x + width > a.row_bytes or side.y + height > a.rows
                    or side.z + depth > a.slices):
                raise BackendError(CUDA_ERROR_INVALID_VALUE, "copy outside the array")
        else:
            pitch, rows, base = side.pitch, side.rows, side.ptr
        return [self._device_range(base + ((side.z + z) * rows + side.y + y) * pitch + side.x,
                                   width)
                for z in range(depth) for y in range(height)]

    def memcpy_3d(self, dst: CopySide, src: CopySide, width: int, height: int, depth: int,
                  stream: Any) -> None:
        if not (width and height and depth):
            return
        host_size = ((depth - 1) * height + height - 1) * width + width
        with self._lock:
            self._check_stream(stream)
            if dst.kind == "host":
                target = _host_view(dst.buffer, host_size, writable=True)
                self._wait_idle(stream)
                rows = self._box_rows(src, width, height, depth, None)
                for row, out in zip(rows, self._box_rows(dst, width, height, depth, target),
                                    strict=True):
                    out[:] = row
                return
            source = (_host_view(src.buffer, host_size, writable=False) if src.kind == "host"
                      else None)
            self._box_rows(dst, width, height, depth, None)  # a bad range fails now
            self._box_rows(src, width, height, depth, source)
            if dst.kind == "device":
                self._touched(stream, self._current_device(),
                              [(dst.ptr + ((dst.z + z) * dst.rows + dst.y + y) * dst.pitch + dst.x,
                                width) for z in range(depth) for y in range(height)])
            self._issue(stream, self._copy_box, dst, src, width, height, depth, source)

    def _copy_box(self, dst: CopySide, src: CopySide, width: int, height: int, depth: int,
                  source: Any) -> None:
        view = memoryview(source).cast("B") if source is not None else None
        rows = [bytes(r) for r in self._box_rows(src, width, height, depth, view)]  # may overlap
        for out, data in zip(self._box_rows(dst, width, height, depth, None), rows, strict=True):
            out[:] = data

    def _new_object(self, obj: _Object) -> int:
        handle = self._next_object
        self._next_object += 1
        self._objects[handle] = obj
        return handle

    def texture_create(self, resource: Resource, texture: TextureDesc,
                       view: ViewDesc | None) -> int:
        with self._lock:
            if resource.type == RESOURCE_ARRAY:
                self._array(resource.array)
            else:
                self._check_texture_memory(resource)
            return self._new_object(_Object(resource, texture, view))

    def _check_texture_memory(self, r: Resource) -> None:
        """What cuTexObjectCreate requires of linear and pitch2D memory: inside one allocation,
        the pointer aligned to the texture alignment, a pitch2D's pitch to the pitch alignment
        and its extent within the device's linear 2D limits (cudaErrorInvalidValue)."""
        assert r.desc is not None
        attrs = self._infos[self._current_device()].attrs
        if r.ptr % attrs.get(ATTR_TEXTURE_ALIGNMENT, 1):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"texture memory at {r.ptr:#x} unaligned")
        if r.type == RESOURCE_LINEAR:
            self._device_range(r.ptr, max(r.size, 1))
            return
        max_w, max_h = (attrs.get(a, 0) for a in ATTR_TEXTURE_2D_LINEAR)
        if (r.pitch % attrs.get(ATTR_TEXTURE_PITCH_ALIGNMENT, 1) or r.width > max_w
                or r.height > max_h):
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"pitch2D texture {r.width}x{r.height}, pitch {r.pitch}")
        self._device_range(r.ptr, (r.height - 1) * r.pitch + r.width * r.desc.element_size)

    def _destroy_object(self, handle: int, surface: bool) -> None:
        with self._lock:
            obj = self._objects.get(handle)
            if obj is None or (obj.texture is None) != surface:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"no such object {handle}")
            del self._objects[handle]

    def texture_destroy(self, texture: int) -> None:
        self._destroy_object(texture, surface=False)

    def surface_create(self, array: Any) -> int:
        with self._lock:
            a = self._array(array)
            if not a.flags & 2:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, "array without cudaArraySurfaceLoadStore")
            return self._new_object(_Object(Resource(RESOURCE_ARRAY, array=a), None))

    def surface_destroy(self, surface: int) -> None:
        self._destroy_object(surface, surface=True)

    def _image(self, handle: int, surface: bool) -> SimImage | None:
        """What an emulation's k.texture(i) / k.surface(i) reads (sim lock held: launches run
        under it)."""
        obj = self._objects.get(handle)
        if obj is None or (obj.texture is None) != surface:
            return None
        r = obj.resource
        if r.type == RESOURCE_ARRAY:
            a = r.array
            if not a.alive:
                return None
            desc, width, height, depth = a.desc, a.width, a.rows, a.slices
            pitch, base = a.row_bytes, a.base
        elif r.type == RESOURCE_LINEAR:
            assert r.desc is not None
            desc, width, height, depth = r.desc, r.size // r.desc.element_size, 1, 1
            pitch, base = r.size, r.ptr
        else:
            assert r.desc is not None
            desc, width, height, depth, pitch, base = r.desc, r.width, r.height, 1, r.pitch, r.ptr
        data = self._memory.region(base, (depth * height - 1) * pitch + width * desc.element_size)
        if data is None:
            return None
        tex = obj.texture or TextureDesc()
        return SimImage(data, width, height, depth, pitch, desc.channels, desc.bits, desc.f,
                        tex.address_mode, tex.filter_mode, tex.read_mode,
                        bool(tex.normalized_coords), tex.border_color,
                        linear=r.type == RESOURCE_LINEAR)


def _initial_attrs(max_threads: int, image: ImageFuncAttrs | None) -> list[int]:
    """cuFuncGetAttribute's answers before any cudaFuncSetAttribute, from the image."""
    image = image or ImageFuncAttrs()
    attrs = [0] * FUNC_ATTR_COUNT
    attrs[FA_MAX_THREADS] = max_threads
    attrs[FA_SHARED] = image.static_shared_bytes
    attrs[FA_LOCAL] = image.local_bytes
    attrs[FA_REGS] = image.num_regs or DEFAULT_REGS
    attrs[FA_PTX] = image.ptx_version
    attrs[FA_BINARY] = image.binary_version
    attrs[FA_MAX_DYNAMIC_SHARED] = max(0, SHARED_PER_BLOCK - image.static_shared_bytes)
    attrs[FA_CARVEOUT] = -1  # cudaSharedmemCarveoutDefault
    return attrs


def _row_spans(addr: int, pitch: int, width: int, height: int) -> list[tuple[int, int]]:
    """(address, bytes) of each row of a 2D range."""
    return [(addr + r * pitch, width) for r in range(height)]


def _check_count(count: int) -> None:
    if count < 0:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"negative byte count {count}")


def _host_view(buf: Any, count: int, writable: bool) -> memoryview:
    """The first `count` bytes of a host buffer as a flat byte view."""
    _check_count(count)
    try:
        view = memoryview(buf).cast("B")
    except (TypeError, ValueError) as exc:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"unusable host buffer: {exc}") from exc
    if len(view) < count:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"host buffer holds {len(view)} bytes, {count} needed")
    if writable and view.readonly:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "host buffer is read-only")
    return view[:count]


def _check_launch_config(grid: tuple[int, int, int], block: tuple[int, int, int],
                         shared_bytes: int, max_threads: int,
                         max_dynamic: int = MAX_DYNAMIC_SHARED) -> None:
    """Limits an H100 enforces: cudaErrorInvalidValue for what no kernel could run (CUDA 13's
    runtime reports bad shapes so, seen natively), and the same past this kernel's own
    __launch_bounds__ (also seen natively on the H100)."""
    def bad(why: str) -> BackendError:
        return BackendError(CUDA_ERROR_INVALID_VALUE,
                            f"grid {tuple(grid)} block {tuple(block)} shared {shared_bytes}: {why}")

    if len(grid) != 3 or len(block) != 3:
        raise bad("grid and block need three dimensions")
    if min(*grid, *block) < 1:
        raise bad("every dimension must be at least 1")
    if any(b > m for b, m in zip(block, MAX_BLOCK, strict=True)):
        raise bad(f"block dimensions exceed {MAX_BLOCK}")
    threads = block[0] * block[1] * block[2]
    if threads > MAX_BLOCK_THREADS:
        raise bad(f"{threads} threads per block exceed {MAX_BLOCK_THREADS}")
    if any(g > m for g, m in zip(grid, MAX_GRID, strict=True)):
        raise bad(f"grid dimensions exceed {MAX_GRID}")
    if not 0 <= shared_bytes <= max_dynamic:
        raise bad(f"dynamic shared memory outside 0..{max_dynamic}")
    if threads > max_threads:
        raise bad(f"{threads} threads per block exceed the kernel's limit {max_threads}")


# Calls that still work after a fault, as on the H100 (device queries, making a context current);
# every other public call fails with the fault's error (_guarded).
_UNPOISONED = frozenset({"device_count", "device_info", "bind_thread", "context_error", "kick"})


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def guarded(self: SimBackend, *args: Any, **kwargs: Any) -> Any:
        if self._poisoned:
            raise BackendError(self._poisoned, "the context was corrupted by an earlier kernel "
                                               "fault; every call fails until pilotd restarts")
        return fn(self, *args, **kwargs)
    return guarded


for _name, _fn in list(vars(SimBackend).items()):
    if not _name.startswith("_") and callable(_fn) and _name not in _UNPOISONED:
        setattr(SimBackend, _name, _guarded(_fn))
