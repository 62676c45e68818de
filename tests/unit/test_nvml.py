"""GPU readings: the simulated source, the poller's thread (failures, stop), and NvmlSource against a
fake pynvml module (no GPU needed)."""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
import types
from types import SimpleNamespace

import pytest

from pilot.daemon.telemetry.nvml import (
    SIM_GPU_NAME,
    GpuReading,
    NvmlPoller,
    NvmlSource,
    NvmlUnavailable,
    SimSource,
)

GiB = 1 << 30


# --- SimSource --------------------------------------------------------------------------------

def test_sim_source_reads_memory_from_callback() -> None:
    used = {0: 3 * GiB, 1: 0}
    src = SimSource(total=16 * GiB, used=lambda i: used[i])
    before = time.time()
    r0, r1 = src.read(0), src.read(1)
    assert r0 == GpuReading(index=0, name=SIM_GPU_NAME, memory_total=16 * GiB,
                            memory_used=3 * GiB, memory_free=13 * GiB, utilization_gpu=0.0,
                            utilization_memory=0.0, processes=((os.getpid(), 3 * GiB),),
                            timestamp=r0.timestamp)
    assert before <= r0.timestamp <= time.time()
    assert (r1.index, r1.memory_used, r1.memory_free, r1.processes) == (1, 0, 16 * GiB, ())
    used[1] = 20 * GiB  # over the total (an oversubscribed sim): free clamps at 0
    assert (src.read(1).memory_used, src.read(1).memory_free) == (20 * GiB, 0)
    with pytest.raises(ValueError):
        SimSource(total=-1, used=lambda i: 0)


# --- NvmlPoller -------------------------------------------------------------------------------

class FlakySource:
    """GPU 1 fails on the reads listed in `fail_on` (1-based count of its reads)."""

    def __init__(self, fail_on: set[int]) -> None:
        self.inner = SimSource(total=GiB, used=lambda i: i * 1000)
        self.fail_on = fail_on
        self.gpu1_reads = 0
        self.read_event = threading.Event()

    def read(self, index: int) -> GpuReading:
        self.read_event.set()
        if index == 1:
            self.gpu1_reads += 1
            if self.gpu1_reads in self.fail_on:
                raise NvmlUnavailable(f"GPU lost (read {self.gpu1_reads})")
        return self.inner.read(index)

    def close(self) -> None:
        pass


def test_poller_counts_errors_drops_failed_gpu_and_logs_once_per_streak(
        caplog: pytest.LogCaptureFixture) -> None:
    src = FlakySource(fail_on={2, 3, 4, 6})
    poller = NvmlPoller(src, gpus=[0, 1], interval=60)
    caplog.set_level(logging.INFO, logger="pilot.nvml")

    poller.poll()
    assert sorted(poller.latest()) == [0, 1]
    assert poller.latest()[1].memory_used == 1000
    for _ in range(3):  # reads 2, 3, 4 of GPU 1 fail: one streak
        poller.poll()
        assert sorted(poller.latest()) == [0]  # a failed GPU is dropped, not shown stale
    poller.poll()  # read 5 succeeds
    poller.poll()  # read 6 fails: a second streak
    assert (poller.reads_total, poller.errors_total) == (2 * 6 - 4, 4)

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]
    assert "GPU 1" in warnings[0].getMessage() and "read 2" in warnings[0].getMessage()
    assert any("after 3 failed reads" in r.getMessage() for r in caplog.records)


def test_latest_is_a_copy() -> None:
    poller = NvmlPoller(SimSource(total=GiB, used=lambda i: 0), gpus=[0], interval=60)
    poller.poll()
    snapshot = poller.latest()
    snapshot.clear()
    assert list(poller.latest()) == [0]


class ExplodingSource:
    """Fails every other read with an arbitrary exception, not only NvmlUnavailable."""

    def __init__(self) -> None:
        self.n = 0

    def read(self, index: int) -> GpuReading:
        self.n += 1
        if self.n % 2:
            raise ZeroDivisionError("boom")
        return SimSource(total=GiB, used=lambda i: 0).read(index)

    def close(self) -> None:
        pass


def test_poller_thread_survives_failures_and_stop_joins() -> None:
    poller = NvmlPoller(ExplodingSource(), gpus=[0], interval=0.005)
    poller.start()
    with pytest.raises(RuntimeError):
        poller.start()
    threads = [t for t in threading.enumerate() if t.name == "nvml-poller"]
    assert len(threads) == 1 and threads[0].daemon
    deadline = time.monotonic() + 10
    while (poller.reads_total < 5 or poller.errors_total < 5) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert poller.reads_total >= 5 and poller.errors_total >= 5
    assert threads[0].is_alive()

    t0 = time.monotonic()
    assert poller.stop() is True
    assert time.monotonic() - t0 < poller.interval + 1
    assert not threads[0].is_alive()


def test_stop_interrupts_a_long_interval() -> None:
    src = FlakySource(fail_on=set())
    poller = NvmlPoller(src, gpus=[0], interval=30)
    poller.start()
    assert src.read_event.wait(5)  # first poll happens at once, not after one interval
    t0 = time.monotonic()
    assert poller.stop() is True
    assert time.monotonic() - t0 < 1.0


def test_poller_rejects_bad_interval() -> None:
    with pytest.raises(ValueError):
        NvmlPoller(SimSource(total=GiB, used=lambda i: 0), gpus=[0], interval=0)


# --- NvmlSource against a fake pynvml ---------------------------------------------------------

class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_pynvml(**overrides: object) -> types.ModuleType:
    """The subset of pynvml that NvmlSource uses; records calls in `calls`."""
    mod = types.ModuleType("pynvml")
    calls: list[str] = []
    handles = {0: "h0", 1: "h1"}

    def get_handle(i: int) -> str:
        calls.append(f"handle {i}")
        if i not in handles:
            raise FakeNvmlError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return handles[i]

    ns = {
        "NVMLError": FakeNvmlError,
        "NVML_ERROR_NOT_SUPPORTED": 3,
        "calls": calls,
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": get_handle,
        "nvmlDeviceGetName": lambda h: {"h0": "NVIDIA H100 80GB HBM3", "h1": b"NVIDIA H200"}[h],
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=80 * GiB, used=5 * GiB,
                                                             free=75 * GiB),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=42, memory=7),
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            SimpleNamespace(pid=1234, usedGpuMemory=4 * GiB),
            SimpleNamespace(pid=99, usedGpuMemory=None),  # driver could not attribute memory
        ],
    }
    ns.update(overrides)
    for name, value in ns.items():
        setattr(mod, name, value)
    return mod


def test_nvml_source_reads_through_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    src = NvmlSource()  # imports "pynvml": the fake
    assert fake.calls == ["init"]
    r = src.read(0)
    assert (r.index, r.name, r.memory_total, r.memory_used, r.memory_free) == (
        0, "NVIDIA H100 80GB HBM3", 80 * GiB, 5 * GiB, 75 * GiB)
    assert (r.utilization_gpu, r.utilization_memory) == (42.0, 7.0)
    assert r.processes == ((1234, 4 * GiB), (99, 0))
    assert src.read(1).name == "NVIDIA H200"  # bytes from older pynvml are decoded
    src.read(0)
    assert fake.calls.count("handle 0") == 1  # handles are looked up once
    assert fake.calls.count("init") == 1
    assert src.device_count() == 2

    with pytest.raises(NvmlUnavailable, match="GPU 7"):
        src.read(7)
    src.close()
    src.close()
    assert fake.calls.count("shutdown") == 1
    with pytest.raises(NvmlUnavailable):
        src.read(0)


def test_nvml_source_not_supported_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_supported(h: str) -> None:
        raise FakeNvmlError(3)

    src = NvmlSource(fake_pynvml(nvmlDeviceGetUtilizationRates=not_supported,
                                 nvmlDeviceGetComputeRunningProcesses=not_supported))
    r = src.read(0)
    assert math.isnan(r.utilization_gpu) and math.isnan(r.utilization_memory)
    assert r.processes == ()
    assert r.memory_used == 5 * GiB


def test_nvml_errors_become_nvml_unavailable() -> None:
    def gpu_lost(h: str) -> None:
        raise FakeNvmlError(15)  # NVML_ERROR_GPU_IS_LOST

    def no_library() -> None:
        raise FakeNvmlError(12)  # NVML_ERROR_LIBRARY_NOT_FOUND

    with pytest.raises(NvmlUnavailable, match="initialization"):
        NvmlSource(fake_pynvml(nvmlInit=no_library))
    src = NvmlSource(fake_pynvml(nvmlDeviceGetMemoryInfo=gpu_lost))
    with pytest.raises(NvmlUnavailable) as info:
        src.read(0)
    assert isinstance(info.value.__cause__, FakeNvmlError)
    src = NvmlSource(fake_pynvml(nvmlDeviceGetUtilizationRates=gpu_lost))
    with pytest.raises(NvmlUnavailable):
        src.read(0)  # only NOT_SUPPORTED is tolerated on the optional queries


def test_real_pynvml_reads_or_reports_unavailable() -> None:
    """On a machine without a driver NvmlSource must fail with NvmlUnavailable (what pilotd
    catches to fall back), and with one it must read GPU 0."""
    try:
        src = NvmlSource()
    except NvmlUnavailable:
        return
    try:
        r = src.read(0)
        assert r.memory_total > 0 and r.memory_used + r.memory_free <= r.memory_total
    finally:
        src.close()


def test_nvml_source_finds_gpus_by_pci_bus_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML numbers GPUs in PCI order, CUDA (FASTEST_FIRST) may not: pilotd's GPU 0 on bus 0x23
    is NVML's device 1 here, and must be read as that, not as NVML index 0."""
    by_bus = {"00000000:1B:00.0": "h0", "00000000:23:00.0": "h1"}

    def get_by_bus(bus_id: str) -> str:
        if bus_id not in by_bus:
            raise FakeNvmlError(6)  # NVML_ERROR_NOT_FOUND
        return by_bus[bus_id]

    fake = fake_pynvml(nvmlDeviceGetHandleByPciBusId=get_by_bus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    src = NvmlSource(bus_ids={0: "00000000:23:00.0", 1: "00000000:1B:00.0", 2: "00000000:99:00.0"})
    assert (src.read(0).index, src.read(0).name) == (0, "NVIDIA H200")
    assert src.read(1).name == "NVIDIA H100 80GB HBM3"
    assert not any(c.startswith("handle") for c in fake.calls)  # never by index
    with pytest.raises(NvmlUnavailable, match="GPU 2"):
        src.read(2)
    src.close()
