"""Python emulations of device kernels for the sim backend, registered by mangled name.

The sim backend cannot run SASS, so tests supply a Python function per kernel they launch:

    @sim_kernel("_Z4vaddPKfS0_Pfi")
    def vadd(k: SimLaunch) -> None:
        a, b, c, n = k.ptr(0), k.ptr(1), k.ptr(2), k.i32(3)
        ...

Emulations live in a KernelRegistry. `load_kernel_file(path)` runs a Python file with every
`@sim_kernel` in it registering into the registry being loaded, so `pilotd --sim-kernels FILE`
(repeatable) and tests get their own registry and no state leaks between them. A `@sim_kernel`
executed outside a load (a module imported the ordinary way) lands in `default_registry`.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import math
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from pilot.daemon.backends.base import (
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_LAUNCH_FAILURE,
    BackendError,
)

log = logging.getLogger(__name__)

CUDA_ERROR_INVALID_DEVICE_FUNCTION = 98  # cudaErrorInvalidDeviceFunction

SimFn = Callable[["SimLaunch"], None]


class DeviceMemory(Protocol):
    """What an emulation may touch: the backend's simulated device memory."""

    def region(self, addr: int, nbytes: int) -> memoryview | None:
        """A writable view of [addr, addr+nbytes) if it lies inside one live allocation."""
        ...


_CHANNEL_FORMATS = {(0, 8): "b", (0, 16): "h", (0, 32): "i", (1, 8): "B", (1, 16): "H",
                    (1, 32): "I", (2, 16): "e", (2, 32): "f"}
ADDRESS_WRAP, ADDRESS_CLAMP, ADDRESS_MIRROR, ADDRESS_BORDER = 0, 1, 2, 3


class SimImage:
    """What a texture or surface object reads (the sim backend builds one per k.texture(i) /
    k.surface(i)): `height` rows of `width` elements, `pitch` bytes apart, `depth` slices of
    `height` rows, over `data`. Texture fetches emulate point sampling (floor of the coordinate,
    after scaling normalized ones) with CUDA's address modes; linear filtering and the
    normalized-float read mode are not emulated (they raise, failing the launch)."""

    def __init__(self, data: memoryview, width: int, height: int, depth: int, pitch: int,
                 channels: int, bits: int, kind: int, address_mode: tuple[int, ...] = (0, 0, 0),
                 filter_mode: int = 0, read_mode: int = 0, normalized: bool = False,
                 border: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0), linear: bool = False) -> None:
        self.data = data
        self.width, self.height, self.depth, self.pitch = width, height, depth, pitch
        self.channels, self.bits, self.kind = channels, bits, kind
        self.elem = channels * bits // 8
        self.fmt = "<" + _CHANNEL_FORMATS[(kind, bits)] * channels
        self.address_mode = tuple(address_mode)
        self.filter_mode, self.read_mode = filter_mode, read_mode
        self.normalized, self.border, self.linear = normalized, tuple(border), linear

    def element(self, x: int, y: int = 0, z: int = 0) -> tuple:
        """The element at integer coordinates (inside the image)."""
        off = (z * self.height + y) * self.pitch + x * self.elem
        return struct.unpack_from(self.fmt, self.data, off)

    def _index(self, c: float, size: int, mode: int) -> int | None:
        """The texel a point-sampled coordinate lands on; None for the border."""
        if self.normalized:
            if mode == ADDRESS_WRAP:
                c = c - math.floor(c)
            elif mode == ADDRESS_MIRROR:
                period = c - 2 * math.floor(c / 2)
                c = 2 - period if period > 1 else period
            c *= size
        i = math.floor(c)
        if 0 <= i < size:
            return i
        if mode == ADDRESS_BORDER:
            return None
        return min(max(i, 0), size - 1)  # clamp (wrap and mirror without normalized: clamp)

    def fetch(self, x: float, y: float = 0.5, z: float = 0.5) -> tuple:
        """tex1D/tex2D/tex3D with point filtering and cudaReadModeElementType."""
        if self.filter_mode != 0 or self.read_mode != 0:
            raise NotImplementedError("the sim emulates point sampling of element types only")
        coords = []
        for c, size, mode in ((x, self.width, self.address_mode[0]),
                              (y, self.height, self.address_mode[1]),
                              (z, self.depth, self.address_mode[2])):
            i = self._index(c, size, mode)
            if i is None:
                return tuple(self.border[:self.channels]) if self.kind == 2 else (0,) * self.channels
            coords.append(i)
        return self.element(*coords)

    def fetch_index(self, i: int) -> tuple:
        """tex1Dfetch over linear memory: an integer index, zeros outside."""
        if not 0 <= i < self.width:
            return (0,) * self.channels
        return self.element(i)

    def write(self, values: tuple, x_bytes: int, y: int = 0, z: int = 0) -> None:
        """surf1Dwrite/surf2Dwrite/surf3Dwrite with cudaBoundaryModeTrap: x in bytes; outside
        the image or misaligned faults like the kernel would."""
        if (x_bytes % self.elem or not 0 <= x_bytes < self.width * self.elem
                or not 0 <= y < self.height or not 0 <= z < self.depth):
            raise BackendError(CUDA_ERROR_ILLEGAL_ADDRESS, f"surface write at ({x_bytes}, {y}, {z})")
        struct.pack_into(self.fmt, self.data, (z * self.height + y) * self.pitch + x_bytes, *values)


class SimLaunch:
    """One launch as an emulation sees it: configuration, parameters and device memory."""

    def __init__(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                 shared_bytes: int, params: list[bytes], memory: DeviceMemory,
                 symbols: Mapping[str, tuple[int, int]] | None = None,
                 images: Callable[[int, bool], SimImage | None] | None = None,
                 printf: Callable[[bytes], None] | None = None) -> None:
        self.name = name
        self.grid = grid
        self.block = block
        self.shared_bytes = shared_bytes
        self.params = params
        self._memory = memory
        self._symbols = symbols or {}
        self._images = images
        self._printf = printf
        # A preemptible variant (SimBackend._run_variant): the logical blocks it runs now.
        self.blocks: Sequence[int] | None = None

    def logical_blocks(self) -> Sequence[int]:
        """The logical blocks this launch runs (a @blockwise emulation runs only these): all of
        the grid's, or those a preemptible launch claimed."""
        gx, gy, gz = self.grid
        return self.blocks if self.blocks is not None else range(gx * gy * gz)

    def ctaid(self, index: int) -> tuple[int, int, int]:
        """blockIdx of a logical block: x fastest, as the hardware numbers them."""
        gx, gy, _ = self.grid
        return index % gx, index // gx % gy, index // gx // gy

    def printf(self, text: str) -> None:
        """What the kernel's printf calls print, in the order the GPU would (the emulation says
        it): into the printf FIFO, written out when the driver would flush it."""
        if self._printf is not None:
            self._printf(text.encode())

    # texture and surface objects
    def _image(self, i: int, surface: bool) -> SimImage:
        handle = self.arg(i, "<Q")[0]
        image = self._images(handle, surface) if self._images is not None else None
        if image is None:
            raise BackendError(CUDA_ERROR_ILLEGAL_ADDRESS,
                               f"{self.name}: parameter {i} ({handle:#x}) is no live "
                               f"{'surface' if surface else 'texture'} object")
        return image

    def texture(self, i: int) -> SimImage:
        """The texture object passed as parameter i."""
        return self._image(i, False)

    def surface(self, i: int) -> SimImage:
        """The surface object passed as parameter i."""
        return self._image(i, True)

    # module variables
    def _variable(self, name: str) -> tuple[int, int]:
        found = self._symbols.get(name)
        if found is None:
            # A static variable of an -rdc build: `__nv_static_<len>__<hashes>_<file>_<name>`.
            statics = [v for n, v in self._symbols.items()
                       if n.startswith("__nv_static_") and n.endswith("_" + name)]
            if len(statics) == 1:
                found = statics[0]
        if found is None:
            raise BackendError(CUDA_ERROR_LAUNCH_FAILURE,
                               f"{self.name}: no variable {name} (or one static variable of "
                               "that name) in the kernel's module")
        return found

    def symbol(self, name: str) -> int:
        """Device address of the kernel's module's `__device__`/`__constant__` variable `name`:
        its ELF symbol name (`_ZN2ns5valueE` for `ns::value`), or for a static variable its
        source name, which -rdc builds prefix (`__nv_static_..._hidden`)."""
        return self._variable(name)[0]

    def symbol_view(self, name: str) -> memoryview:
        """Writable view of the whole variable `name` (named as for symbol())."""
        return self.view(*self._variable(name))

    # device memory
    def view(self, addr: int, nbytes: int) -> memoryview:
        """Writable view of device memory; a range outside every live allocation faults like
        the kernel would (cudaErrorIllegalAddress)."""
        if nbytes == 0:
            return memoryview(bytearray())
        region = self._memory.region(addr, nbytes) if nbytes > 0 else None
        if region is None:
            raise BackendError(CUDA_ERROR_ILLEGAL_ADDRESS,
                               f"{self.name}: access to {nbytes} bytes at {addr:#x} is outside "
                               "every live allocation")
        return region

    def read(self, addr: int, nbytes: int) -> bytes:
        return bytes(self.view(addr, nbytes))

    def write(self, addr: int, data: bytes | bytearray | memoryview) -> None:
        src = memoryview(data).cast("B")
        self.view(addr, len(src))[:] = src

    # parameters
    def arg(self, i: int, fmt: str) -> tuple:
        """struct.unpack(fmt, params[i]); spell padding out ('<i4xd') for structs."""
        if not 0 <= i < len(self.params):
            raise IndexError(f"{self.name} has {len(self.params)} parameters, asked for #{i}")
        return struct.unpack(fmt, self.params[i])

    def ptr(self, i: int) -> int:
        return self.arg(i, "<Q")[0]

    def i8(self, i: int) -> int:
        return self.arg(i, "<b")[0]

    def i16(self, i: int) -> int:
        return self.arg(i, "<h")[0]

    def i32(self, i: int) -> int:
        return self.arg(i, "<i")[0]

    def u32(self, i: int) -> int:
        return self.arg(i, "<I")[0]

    def f32(self, i: int) -> float:
        return self.arg(i, "<f")[0]

    def f64(self, i: int) -> float:
        return self.arg(i, "<d")[0]


class KernelRegistry:
    """Kernel name -> emulation."""

    def __init__(self) -> None:
        self._kernels: dict[str, SimFn] = {}
        self._lock = threading.Lock()
        self._missing: set[str] = set()  # kernels launched without an emulation (warned once each)

    def register(self, name: str, fn: SimFn) -> None:
        with self._lock:
            old = self._kernels.get(name)
            if old is not None and old is not fn:
                raise ValueError(f"sim kernel {name} registered twice "
                                 f"({_describe(old)} and {_describe(fn)})")
            self._kernels[name] = fn

    def kernel(self, name: str) -> Callable[[SimFn], SimFn]:
        """Decorator registering into this registry."""
        def decorate(fn: SimFn) -> SimFn:
            self.register(name, fn)
            return fn
        return decorate

    def get(self, name: str) -> SimFn | None:
        with self._lock:
            return self._kernels.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._kernels)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._kernels

    def __len__(self) -> int:
        with self._lock:
            return len(self._kernels)

    def load_file(self, path: str | Path) -> None:
        load_kernel_file(path, self)

    def run(self, launch: SimLaunch) -> None:
        """Run the emulation for `launch.name`. A missing one is cudaErrorInvalidDeviceFunction;
        one that raises anything but BackendError faults like a kernel (cudaErrorLaunchFailure,
        sticky)."""
        fn = self.get(launch.name)
        if fn is None:
            self._warn_missing(launch.name)
            raise BackendError(CUDA_ERROR_INVALID_DEVICE_FUNCTION,
                               f"no sim emulation registered for kernel {launch.name}")
        try:
            fn(launch)
        except BackendError:
            raise
        except Exception as exc:
            log.exception("sim kernel %s (%s) crashed", launch.name, _describe(fn))
            raise BackendError(CUDA_ERROR_LAUNCH_FAILURE,
                               f"sim kernel {launch.name} raised {exc!r}") from exc


    def _warn_missing(self, name: str) -> None:
        """Say once per kernel, at warning level, that it has no emulation: the program only sees
        cudaErrorInvalidDeviceFunction later, at a synchronizing call, without the name."""
        with self._lock:
            if name in self._missing:
                return
            self._missing.add(name)
            known = len(self._kernels)
        log.warning("sim: kernel %s has no emulation (%d registered): its launches fail with "
                    "cudaErrorInvalidDeviceFunction; give pilotd --sim-kernels FILE with a "
                    "@kernel(%r) function", name, known, name)


def _describe(fn: SimFn) -> str:
    code = getattr(fn, "__code__", None)
    where = f" at {code.co_filename}:{code.co_firstlineno}" if code else ""
    return f"{getattr(fn, '__qualname__', fn)!s}{where}"


default_registry = KernelRegistry()

# Registries that files being loaded register into; the innermost load wins.
_loading: list[KernelRegistry] = []
_load_lock = threading.RLock()
_module_ids = itertools.count()


def sim_kernel(name: str) -> Callable[[SimFn], SimFn]:
    """Register an emulation for kernel `name` (mangled) in the registry being loaded."""
    def decorate(fn: SimFn) -> SimFn:
        (_loading[-1] if _loading else default_registry).register(name, fn)
        return fn
    return decorate


def blockwise(fn: SimFn) -> SimFn:
    """Mark an emulation that runs only `k.logical_blocks()`: it can run part of a grid, as a
    preemptible variant does (SimBackend._run_variant)."""
    fn.blockwise = True  # type: ignore[attr-defined]
    return fn


def load_kernel_file(path: str | Path, registry: KernelRegistry | None = None) -> KernelRegistry:
    """Run the Python file at `path`, collecting its @sim_kernel emulations into `registry`
    (a new one if None), which is returned. Errors name the file."""
    path = Path(path)
    registry = KernelRegistry() if registry is None else registry
    module_name = f"pilot_sim_kernels_{next(_module_ids)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load sim kernels from {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    with _load_lock:
        _loading.append(registry)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up here
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ImportError(f"cannot load sim kernels from {path}: {exc!r}") from exc
        finally:
            _loading.pop()
    return registry


def load_kernel_files(paths: Iterable[str | Path]) -> KernelRegistry:
    """One registry holding the emulations of every file (pilotd --sim-kernels, repeated)."""
    registry = KernelRegistry()
    for path in paths:
        load_kernel_file(path, registry)
    return registry
