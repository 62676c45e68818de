"""GPU readings for monitoring: memory, utilization and processes per GPU, from NVML or simulated.

The daemon's own accounting (what each session allocated) says what pilot handed out; NVML says
what the GPU really holds, including the CUDA context, the allocator's slack and processes that do
not go through pilot. Exporting both is how an operator sees the difference.

Readings are taken by `NvmlPoller` on its own thread (`nvml-poller`), never on a vGPU thread: one
NVML query takes tens of microseconds, and a wedged driver can block one for seconds. Consumers
(the metrics collector, control queries) only read the poller's last snapshot.

GPUs are pilotd's GPU numbers (CUDA ordinals). NVML numbers GPUs in PCI bus order, which CUDA
follows only under CUDA_DEVICE_ORDER=PCI_BUS_ID, so `NvmlSource` finds each GPU by its PCI bus id
(`bus_ids`, from the backend's device attributes), never by taking the CUDA ordinal for an NVML
index.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pilot.daemon.telemetry.thread_names import NamedThread

log = logging.getLogger("pilot.nvml")

SIM_GPU_NAME = "pilot simulated GPU"


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialized, or a query failed (no driver, lost GPU, ...)."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment. Utilizations are percents (0..100) over NVML's last sample period,
    NaN where the device does not report them (MIG instances, some vGPUs)."""

    index: int
    name: str
    memory_total: int
    memory_used: int
    memory_free: int
    utilization_gpu: float
    utilization_memory: float
    processes: tuple[tuple[int, int], ...]  # (pid, used bytes), as NVML lists compute processes
    timestamp: float  # time.time() when read


class GpuSource(Protocol):
    """What the poller reads from: `NvmlSource`, `SimSource`, or a test double."""

    def read(self, index: int) -> GpuReading: ...

    def close(self) -> None: ...


class NvmlSource:
    """Real readings through pynvml.

    NVML is initialized once, here, and shut down once by `close()` (NVML counts init/shutdown
    pairs, so other NVML users in the process are unaffected). Every NVML failure is raised as
    `NvmlUnavailable` so callers need not know pynvml's error classes. `library` replaces the
    pynvml module (tests).
    """

    def __init__(self, library: Any = None, bus_ids: dict[int, str] | None = None) -> None:
        """`bus_ids`: pilotd's GPU number -> PCI bus id; a GPU without one is read by NVML
        index (only right where NVML's order is CUDA's)."""
        self._bus_ids = dict(bus_ids or {})
        if library is None:
            try:
                import pynvml as library
            except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
                raise NvmlUnavailable(f"pynvml is not installed: {e}") from e
        self._nvml = library
        self._not_supported = getattr(library, "NVML_ERROR_NOT_SUPPORTED", 3)
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._closed = False
        try:
            library.nvmlInit()
        except library.NVMLError as e:
            raise NvmlUnavailable(f"NVML initialization failed: {e}") from e

    def device_count(self) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetCount())
        except self._nvml.NVMLError as e:
            raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {e}") from e

    def read(self, index: int) -> GpuReading:
        nvml = self._nvml
        if self._closed:
            raise NvmlUnavailable("NVML source is closed")
        try:
            handle = self._handle(index)
            name = nvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):  # older pynvml releases return bytes
                name = name.decode(errors="replace")
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            util_gpu, util_mem = self._utilization(handle)
            processes = self._processes(handle)
        except nvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML query for GPU {index} failed: {e}") from e
        return GpuReading(
            index=index,
            name=str(name),
            memory_total=int(memory.total),
            memory_used=int(memory.used),
            memory_free=int(memory.free),
            utilization_gpu=util_gpu,
            utilization_memory=util_mem,
            processes=processes,
            timestamp=time.time(),
        )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._handles.clear()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as e:
            log.warning("nvmlShutdown failed: %s", e)

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            bus_id = self._bus_ids.get(index)
            handle = (self._nvml.nvmlDeviceGetHandleByPciBusId(bus_id) if bus_id is not None
                      else self._nvml.nvmlDeviceGetHandleByIndex(index))
            self._handles[index] = handle
        return handle

    def _is_not_supported(self, e: Exception) -> bool:
        return getattr(e, "value", None) == self._not_supported

    def _utilization(self, handle: Any) -> tuple[float, float]:
        try:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        except self._nvml.NVMLError as e:
            if self._is_not_supported(e):
                return math.nan, math.nan
            raise
        return float(rates.gpu), float(rates.memory)

    def _processes(self, handle: Any) -> tuple[tuple[int, int], ...]:
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self._nvml.NVMLError as e:
            if self._is_not_supported(e):
                return ()
            raise
        # usedGpuMemory is None when the driver cannot attribute memory (e.g. Windows WDDM,
        # some containers).
        return tuple((int(p.pid), int(p.usedGpuMemory or 0)) for p in procs)


class SimSource:
    """Readings for the sim backend, which has no GPU: memory comes from the daemon's accounting
    (`used(index)`: the bytes its sessions hold on that GPU), utilization is 0, and the only
    process is the daemon itself, as on a real GPU where pilotd owns the one CUDA context."""

    def __init__(self, total: int, used: Callable[[int], int]) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self._used = used
        self._pid = os.getpid()

    def read(self, index: int) -> GpuReading:
        used = max(0, int(self._used(index)))
        return GpuReading(
            index=index,
            name=SIM_GPU_NAME,
            memory_total=self.total,
            memory_used=used,
            memory_free=max(0, self.total - used),
            utilization_gpu=0.0,
            utilization_memory=0.0,
            processes=((self._pid, used),) if used else (),
            timestamp=time.time(),
        )

    def close(self) -> None:
        pass


class NvmlPoller:
    """Reads every GPU each `interval` seconds on a daemon thread named `nvml-poller`.

    `latest()` holds the readings of the last poll that succeeded for each GPU; a GPU whose read
    fails is dropped from it until it reads again, so exporters show "unknown" rather than a stale
    value. Failures are counted (`errors_total`) and logged once per streak per GPU (a GPU that
    fails every second must not flood the log); the thread survives any exception from the source.
    `reads_total` counts successful reads.
    """

    def __init__(self, source: GpuSource, gpus: Sequence[int], interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.source = source
        self.gpus = list(gpus)
        self.interval = interval
        self.reads_total = 0
        self.errors_total = 0
        self._latest: dict[int, GpuReading] = {}
        self._failing: dict[int, int] = {}  # gpu -> length of its current failure streak
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("poller already started")
        self._thread = NamedThread(target=self._run, name="nvml-poller", daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Stops the thread; returns whether it ended within interval + 1 s (a read blocked in
        the driver can outlast that; the thread is a daemon thread and ends with the process)."""
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(self.interval + 1.0)
        return not thread.is_alive()

    def latest(self) -> dict[int, GpuReading]:
        with self._lock:
            return dict(self._latest)

    def poll(self) -> None:
        """One round over every GPU (the thread calls this; tests may call it directly)."""
        for gpu in self.gpus:
            try:
                reading = self.source.read(gpu)
            except Exception as e:
                self._failed(gpu, e)
                continue
            with self._lock:
                self._latest[gpu] = reading
                self.reads_total += 1
                streak = self._failing.pop(gpu, 0)
            if streak:
                log.info("GPU %d reads again after %d failed reads", gpu, streak)

    def _failed(self, gpu: int, e: Exception) -> None:
        with self._lock:
            self._latest.pop(gpu, None)
            self.errors_total += 1
            streak = self._failing[gpu] = self._failing.get(gpu, 0) + 1
        if streak == 1:
            log.warning("reading GPU %d failed (%s: %s); retrying every %gs, logged once until "
                        "it recovers", gpu, type(e).__name__, e, self.interval)
        else:
            log.debug("reading GPU %d failed again (%d in a row): %s", gpu, streak, e)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # poll() catches read errors; this guards against anything else
                log.exception("NVML poll failed")
            self._stop.wait(self.interval)
