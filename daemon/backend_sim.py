"""The `sim` backend: a CPU-only stand-in for a GPU, so CI runs the whole path without one.

Simplifications, on purpose:
- Work runs synchronously at enqueue time: every copy, memset and launch has completed when
  the call returns, so streams and events are always complete (queries return True,
  synchronizes return at once). Ordering between streams is therefore trivially respected.
- Kernels run as Python emulations looked up by mangled name (sim_kernels.py); parameter
  layouts come from the image's device ELF (fatbin.py), as the driver would know them.
- Device memory is host memory at fake addresses starting at SIM_BASE_ADDRESS. Addresses are
  never reused and a guard gap separates blocks, so use-after-free and off-the-end accesses
  fault instead of landing in a neighbour. New memory reads as zeros.
- All devices share one address space (unified addressing), each with its own capacity.
- One lock guards all state, held through emulations too: simple, and the sim is not for speed.
"""

from __future__ import annotations

import bisect
import mmap
import threading
import time
from dataclasses import dataclass
from typing import Any

from pilot.daemon.backend import (
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_MEMORY_ALLOCATION,
    BackendError,
    DeviceInfo,
    FunctionInfo,
)
from pilot.daemon.fatbin import KernelInfo, kernel_infos_in_image
from pilot.daemon.sim_device import h100_like_info
from pilot.daemon.sim_kernels import CUDA_ERROR_INVALID_DEVICE_FUNCTION, KernelRegistry, SimLaunch

SIM_BASE_ADDRESS = 0x7E00_0000_0000
ALIGNMENT = 512
GUARD_BYTES = ALIGNMENT  # unmapped gap after every block
DEFAULT_TOTAL_MEM = 80 * 1024**3
MAX_BLOCK = (1024, 1024, 64)
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_DYNAMIC_SHARED = 48 * 1024
_MMAP_THRESHOLD = 1 << 20  # larger blocks use anonymous mmap: zero pages cost nothing

EVENT_BLOCKING_SYNC = 0x1
EVENT_DISABLE_TIMING = 0x2
EVENT_INTERPROCESS = 0x4
STREAM_NON_BLOCKING = 0x1


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass(eq=False)
class _Block:
    base: int
    size: int
    device: int
    data: bytearray | mmap.mmap


class SimMemory:
    """Allocations of every device in one address space. Not locked: SimBackend guards it."""

    def __init__(self, device_count: int, capacity: int) -> None:
        self.capacity = capacity
        self.used = [0] * device_count
        self._blocks: dict[int, _Block] = {}
        self._bases: list[int] = []  # sorted
        self._next = SIM_BASE_ADDRESS

    def alloc(self, size: int, device: int) -> int:
        if size < 0:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"negative allocation size {size}")
        if size == 0:
            return 0  # cudaMalloc(0) succeeds with NULL
        charged = _align(size)
        if self.used[device] + charged > self.capacity:
            raise BackendError(CUDA_ERROR_MEMORY_ALLOCATION,
                               f"{size} bytes requested, {self.capacity - self.used[device]} free")
        data = mmap.mmap(-1, size) if size >= _MMAP_THRESHOLD else bytearray(size)
        base = self._next
        self._next = base + charged + GUARD_BYTES
        self._blocks[base] = _Block(base, size, device, data)
        bisect.insort(self._bases, base)
        self.used[device] += charged
        return base

    def free(self, ptr: int) -> None:
        if ptr == 0:
            return  # cudaFree(NULL) succeeds
        block = self._blocks.pop(ptr, None)
        if block is None:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"{ptr:#x} is not the base of a live allocation")
        del self._bases[bisect.bisect_left(self._bases, ptr)]
        self.used[block.device] -= _align(block.size)

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


@dataclass(eq=False)
class _Stream:
    flags: int
    priority: int
    alive: bool = True


@dataclass(eq=False)
class _Event:
    flags: int
    recorded_ns: int | None = None
    alive: bool = True


@dataclass(eq=False)
class _Module:
    kernels: dict[str, KernelInfo]
    alive: bool = True


@dataclass(eq=False)
class _Function:
    module: _Module
    info: KernelInfo
    max_threads: int


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
        self._thread = threading.local()

    # ---- device ---------------------------------------------------------------------------

    def device_count(self) -> int:
        return self._device_count

    def _check_device(self, device: int) -> int:
        if not 0 <= device < self._device_count:
            raise BackendError(CUDA_ERROR_INVALID_DEVICE, f"no device {device}")
        return device

    def bind_thread(self, device: int) -> None:
        self._thread.device = self._check_device(device)

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
                self._device_range(dst, count)[:] = source

    def memcpy_dtoh(self, dst: Any, src: int, count: int, stream: Any) -> None:
        target = _host_view(dst, count, writable=True)
        with self._lock:
            self._check_stream(stream)
            if count:
                target[:] = self._device_range(src, count)

    def memcpy_dtod(self, dst: int, src: int, count: int, stream: Any) -> None:
        _check_count(count)
        with self._lock:
            self._check_stream(stream)
            if count:
                source = bytes(self._device_range(src, count))  # copy: ranges may overlap
                self._device_range(dst, count)[:] = source

    def memset_d8(self, ptr: int, value: int, count: int, stream: Any) -> None:
        _check_count(count)
        with self._lock:
            self._check_stream(stream)
            if count:
                region = self._device_range(ptr, count)
                chunk = bytes([value & 0xFF]) * min(count, _MMAP_THRESHOLD)
                for start in range(0, count, len(chunk)):
                    n = min(len(chunk), count - start)
                    region[start:start + n] = chunk[:n]

    def host_register(self, address: int, size: int) -> None:
        """Nothing to pin: the sim copies with the CPU."""

    def host_unregister(self, address: int) -> None:
        """Nothing was pinned."""

    # ---- streams and events ---------------------------------------------------------------

    def _check_stream(self, stream: Any) -> None:
        if stream is not None and not (isinstance(stream, _Stream) and stream.alive):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad stream {stream!r}")

    def _event(self, event: Any) -> _Event:
        if not (isinstance(event, _Event) and event.alive):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad event {event!r}")
        return event

    def stream_create(self, flags: int, priority: int) -> Any:
        if flags & ~STREAM_NON_BLOCKING:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"bad stream flags {flags:#x}")
        return _Stream(flags, priority)

    def stream_destroy(self, stream: Any) -> None:
        with self._lock:
            if stream is None:
                raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, "cannot destroy stream 0")
            self._check_stream(stream)
            stream.alive = False

    def stream_synchronize(self, stream: Any) -> None:
        with self._lock:
            self._check_stream(stream)

    def stream_query(self, stream: Any) -> bool:
        with self._lock:
            self._check_stream(stream)
            return True

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        with self._lock:
            self._check_stream(stream)
            self._event(event)

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
            self._event(event).recorded_ns = time.perf_counter_ns()

    def event_synchronize(self, event: Any) -> None:
        with self._lock:
            self._event(event)

    def event_query(self, event: Any) -> bool:
        with self._lock:
            self._event(event)
            return True

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        with self._lock:
            first, last = self._event(start), self._event(end)
            for ev in (first, last):
                if ev.flags & EVENT_DISABLE_TIMING:
                    raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE,
                                       "event created with cudaEventDisableTiming")
                if ev.recorded_ns is None:
                    raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, "event never recorded")
            assert first.recorded_ns is not None and last.recorded_ns is not None
            return (last.recorded_ns - first.recorded_ns) / 1e6

    # ---- execution ------------------------------------------------------------------------

    def module_load(self, image: bytes) -> Any:
        try:
            kernels = kernel_infos_in_image(image)
        except ValueError as exc:
            raise BackendError(CUDA_ERROR_INVALID_IMAGE, f"cannot read image: {exc}") from exc
        return _Module(kernels)

    def _module(self, module: Any) -> _Module:
        if not (isinstance(module, _Module) and module.alive):
            raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad module {module!r}")
        return module

    def module_unload(self, module: Any) -> None:
        with self._lock:
            self._module(module).alive = False

    def function_get(self, module: Any, name: str) -> FunctionInfo:
        with self._lock:
            mod = self._module(module)
            info = mod.kernels.get(name)
            if info is None:
                raise BackendError(CUDA_ERROR_INVALID_DEVICE_FUNCTION,
                                   f"kernel {name} is not in the module")
            max_threads = min(info.max_threads or MAX_BLOCK_THREADS, MAX_BLOCK_THREADS)
            handle = _Function(mod, info, max_threads)
            return FunctionInfo(handle=handle, params=list(info.params),
                                max_threads_per_block=max_threads, static_shared_bytes=0,
                                max_dynamic_shared_bytes=MAX_DYNAMIC_SHARED)

    def launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, stream: Any, args: bytes) -> None:
        with self._lock:
            if not isinstance(function, _Function):
                raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"bad function {function!r}")
            self._module(function.module)
            self._check_stream(stream)
            _check_launch_config(grid, block, shared_bytes, function.max_threads)
            layout = function.info.params
            need = max((off + size for off, size in layout), default=0)
            if len(args) < need:
                raise BackendError(CUDA_ERROR_INVALID_VALUE,
                                   f"{function.info.name} takes {need} bytes of arguments, "
                                   f"got {len(args)}")
            params = [bytes(args[off:off + size]) for off, size in layout]
            launch = SimLaunch(function.info.name, (grid[0], grid[1], grid[2]),
                               (block[0], block[1], block[2]), shared_bytes, params, self._memory)
            self._kernels.run(launch)


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
                         shared_bytes: int, max_threads: int) -> None:
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
    if not 0 <= shared_bytes <= MAX_DYNAMIC_SHARED:
        raise bad(f"dynamic shared memory outside 0..{MAX_DYNAMIC_SHARED}")
    if threads > max_threads:
        raise bad(f"{threads} threads per block exceed the kernel's limit {max_threads}")
