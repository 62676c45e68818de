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
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
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


class SimLaunch:
    """One launch as an emulation sees it: configuration, parameters and device memory."""

    def __init__(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                 shared_bytes: int, params: list[bytes], memory: DeviceMemory,
                 symbols: Mapping[str, tuple[int, int]] | None = None) -> None:
        self.name = name
        self.grid = grid
        self.block = block
        self.shared_bytes = shared_bytes
        self.params = params
        self._memory = memory
        self._symbols = symbols or {}

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
