"""Metrics counters, the scrape-time collector, the /metrics exporter, and the Grafana dashboard's
queries against the names actually exported."""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
import timeit
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pilot.daemon.telemetry.metrics import (
    LABELED_COUNTERS,
    LATENCY_BUCKETS,
    Metrics,
    PilotCollector,
    parse_address,
    start_exporter,
)
from pilot.daemon.telemetry.nvml import GpuReading

GiB = 1 << 30
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"


def reading(index: int, used: int, total: int = 80 * GiB, util: float = 50.0,
            util_mem: float = 25.0) -> GpuReading:
    return GpuReading(index=index, name="NVIDIA H100", memory_total=total, memory_used=used,
                      memory_free=total - used, utilization_gpu=util, utilization_memory=util_mem,
                      processes=((4242, used),), timestamp=time.time())


def fake_state() -> dict[str, Any]:
    return {
        "sessions": [
            {"session": 1, "tenant": "alice", "pid": 100, "gpu": 0, "device_bytes": 1 * GiB,
             "managed_bytes": 0},
            {"session": 2, "tenant": "alice", "pid": 101, "gpu": 0, "device_bytes": 2 * GiB,
             "managed_bytes": 5 * GiB},
            {"session": 3, "tenant": "bob", "pid": 102, "gpu": 1, "device_bytes": 4 * GiB,
             "managed_bytes": 0},
        ],
        "gpus": [
            {"index": 0, "capacity": 40 * GiB, "draining": False, "reading": reading(0, 10 * GiB),
             "residency": {"resident": 3 * GiB, "peak_resident": 4 * GiB, "room": 38 * GiB,
                           "movable": 5 * GiB, "advised_to_host": 1 * GiB}},
            {"index": 1, "capacity": 80 * GiB, "draining": True,
             "reading": reading(1, 6 * GiB, util=math.nan, util_mem=math.nan)},
            {"index": 2, "capacity": 80 * GiB, "draining": False, "reading": None,
             "name": "NVIDIA H100", "uuid": "GPU-ea0ce21c-5c12-3b9e-069b-eb51ddc95d91",
             "pci_bus_id": "00000000:33:00.0"},
        ],
        "quotas": {
            "alice": {"0": {"hard": 8 * GiB, "provisioned": 2 * GiB}},
            "bob": {"all": {"hard": None, "provisioned": 1 * GiB}},
        },
        "vgpus": [{"index": 0, "gpu": 0, "sessions": 2}, {"index": 1, "gpu": 1, "sessions": 1}],
        "shares": {0: {"sms": 132, "unit": 8, "held": {"alice": 33}},
                   1: {"sms": None, "unit": None, "held": {}}},
        "connections": {"admitted": 7, "refused": 4200, "limit": 16384, "per_uid": 320,
                        "endpoint_refused": 12},
        "ipc": {"memory_exports": 3, "grants": 5, "kept_bytes": 2 * GiB, "event_exports": 1},
    }


def registry_for(metrics: Metrics, state: Any = fake_state, poller: Any = None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(PilotCollector(metrics, state, poller=poller))
    return registry


# --- Metrics counters -------------------------------------------------------------------------

def test_calls_kernels_copies_and_policy_counters() -> None:
    m = Metrics()
    for _ in range(3):
        m.call("cudaMalloc")
    m.call("cudaLaunchKernel", 4e-6)
    m.kernels_launched()
    m.kernels_launched(4)
    m.bytes_copied("h2d", 100)
    m.bytes_copied("h2d", 23)
    m.bytes_copied("d2d", 7)
    with pytest.raises(ValueError, match="direction"):
        m.bytes_copied("h2h", 1)
    m.admission_wait("alice")
    m.throttle("alice")
    m.throttle("alice")
    m.advise("bob")
    m.preemption("bob")
    m.quota_rejection("carol")

    r = registry_for(m)
    v = r.get_sample_value
    assert v("pilot_calls_total", {"function": "cudaMalloc"}) == 3
    assert v("pilot_calls_total", {"function": "cudaLaunchKernel"}) == 1
    assert v("pilot_kernels_launched_total") == 5
    assert [v("pilot_copied_bytes_total", {"direction": d}) for d in ("h2d", "d2h", "d2d")] == [
        123, 0, 7]
    assert v("pilot_admission_waits_total", {"tenant": "alice"}) == 1
    assert v("pilot_throttles_total", {"tenant": "alice"}) == 2
    assert v("pilot_advises_total", {"tenant": "bob"}) == 1
    assert v("pilot_preemptions_total", {"tenant": "bob"}) == 1
    assert v("pilot_quota_rejections_total", {"tenant": "carol"}) == 1
    assert v("pilot_throttles_total", {"tenant": "bob"}) is None
    # Calls without a latency count as calls but are not observations.
    assert v("pilot_call_latency_seconds_count", {"function": "cudaMalloc"}) is None
    assert v("pilot_call_latency_seconds_count", {"function": "cudaLaunchKernel"}) == 1


def test_latency_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    m = Metrics()
    observations = [0.0, 1e-6, 1.1e-6, 3e-6, 3e-6, 2.5e-4, 0.3, 10.0, 11.0, 1e3]
    for s in observations:
        m.call("cudaMemcpy", s)
    r = registry_for(m)

    def bucket(le: str) -> float | None:
        return r.get_sample_value("pilot_call_latency_seconds_bucket",
                                  {"function": "cudaMemcpy", "le": le})

    # An observation equal to a bound falls in that bound's bucket (Prometheus "le").
    expected = {"1e-06": 2, "2.5e-06": 3, "5e-06": 5, "0.0001": 5, "0.00025": 6, "0.25": 6,
                "0.5": 7, "10.0": 8, "+Inf": 10}
    for le, n in expected.items():
        assert bucket(le) == n, le
    values = [bucket(le) for le in [*map(_go, LATENCY_BUCKETS), "+Inf"]]
    assert None not in values and values == sorted(values)  # every bucket present, cumulative
    assert r.get_sample_value("pilot_call_latency_seconds_count", {"function": "cudaMemcpy"}) == 10
    total = r.get_sample_value("pilot_call_latency_seconds_sum", {"function": "cudaMemcpy"})
    assert total == pytest.approx(sum(observations))
    assert LATENCY_BUCKETS[0] == 1e-6 and LATENCY_BUCKETS[-1] == 10.0
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS))


def _go(bound: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(bound)


def test_counts_are_exact_across_threads_and_outlive_them() -> None:
    m = Metrics()
    n, threads = 20000, 4
    start = threading.Barrier(threads)

    def work() -> None:
        start.wait()
        for _ in range(n):
            m.call("cudaLaunchKernel", 2e-6)
            m.kernels_launched()
            m.bytes_copied("d2h", 2)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    m.call("cudaLaunchKernel")  # this thread's own shard adds to the dead threads' ones
    snap = m.snapshot()
    assert snap.calls["cudaLaunchKernel"].calls == n * threads + 1
    assert snap.calls["cudaLaunchKernel"].observed == n * threads
    assert snap.kernels == n * threads
    assert snap.copied["d2h"] == 2 * n * threads


def test_call_cost_printout() -> None:
    """Cost of Metrics.call on this machine, printed for the record (never asserted: timing
    depends on the host). Run with -s to see it."""
    m = Metrics()
    m.call("cudaMemcpy")
    n = 200_000
    for label, stmt in (("call(f)", "m.call('cudaMemcpy')"),
                        ("call(f, seconds)", "m.call('cudaMemcpy', 3.2e-6)"),
                        ("kernels_launched()", "m.kernels_launched()")):
        best = min(timeit.repeat(stmt, globals={"m": m}, number=n, repeat=3))
        print(f"Metrics.{label}: {best / n * 1e9:.0f} ns")


# --- PilotCollector: gauges from the state snapshot -------------------------------------------

def test_state_gauges() -> None:
    v = registry_for(Metrics()).get_sample_value
    assert [v("pilot_sessions", {"gpu": g}) for g in "012"] == [2, 1, 0]
    assert v("pilot_vgpu_sessions", {"gpu": "0", "vgpu": "0"}) == 2
    assert v("pilot_tenant_sessions", {"tenant": "alice", "gpu": "0"}) == 2
    assert v("pilot_tenant_device_memory_bytes", {"tenant": "alice", "gpu": "0"}) == 3 * GiB
    assert v("pilot_tenant_managed_memory_bytes", {"tenant": "alice", "gpu": "0"}) == 5 * GiB
    assert v("pilot_tenant_device_memory_bytes", {"tenant": "bob", "gpu": "1"}) == 4 * GiB
    assert v("pilot_tenant_device_memory_bytes", {"tenant": "bob", "gpu": "0"}) is None
    q = {"tenant": "alice", "gpu": "0"}
    assert v("pilot_tenant_quota_bytes", {**q, "kind": "hard"}) == 8 * GiB
    assert v("pilot_tenant_quota_bytes", {**q, "kind": "provisioned"}) == 2 * GiB
    assert v("pilot_tenant_quota_bytes", {"tenant": "bob", "gpu": "all", "kind": "hard"}) is None
    assert v("pilot_tenant_quota_bytes",
             {"tenant": "bob", "gpu": "all", "kind": "provisioned"}) == GiB

    assert v("pilot_gpu_memory_used_bytes", {"gpu": "0"}) == 10 * GiB
    assert v("pilot_gpu_memory_free_bytes", {"gpu": "0"}) == 70 * GiB
    assert v("pilot_gpu_memory_total_bytes", {"gpu": "0"}) == 80 * GiB
    assert v("pilot_gpu_utilization_ratio", {"gpu": "0"}) == 0.5
    assert v("pilot_gpu_memory_utilization_ratio", {"gpu": "0"}) == 0.25
    assert v("pilot_gpu_utilization_ratio", {"gpu": "1"}) is None  # NaN: not reported
    assert v("pilot_gpu_info", {"gpu": "0", "name": "NVIDIA H100", "uuid": "", "pci_bus_id": ""}) == 1
    # the identity comes from the daemon, so a GPU without an NVML reading has it too
    assert v("pilot_gpu_info", {"gpu": "2", "name": "NVIDIA H100", "pci_bus_id": "00000000:33:00.0",
                                "uuid": "GPU-ea0ce21c-5c12-3b9e-069b-eb51ddc95d91"}) == 1
    assert [v("pilot_gpu_capacity_bytes", {"gpu": g}) for g in "012"] == [40 * GiB, 80 * GiB,
                                                                          80 * GiB]
    assert [v("pilot_gpu_draining", {"gpu": g}) for g in "012"] == [0, 1, 0]
    assert v("pilot_gpu_memory_used_bytes", {"gpu": "2"}) is None  # no reading: unknown, not 0
    assert v("pilot_tenant_sm_share_ratio", {"tenant": "alice", "gpu": "0"}) == 0.25
    assert v("pilot_tenant_sm_share_ratio", {"tenant": "bob", "gpu": "1"}) is None


def test_connection_gauges() -> None:
    """How near the main and control sockets' limits pilotd is, and what its acceptor refused."""
    v = registry_for(Metrics()).get_sample_value
    assert v("pilot_connections", {"limit": "16384"}) == 7
    assert v("pilot_connections_refused_total") == 4200
    assert v("pilot_endpoint_connections_refused_total") == 12
    without = {k: x for k, x in fake_state().items() if k != "connections"}
    assert registry_for(Metrics(), lambda: without).get_sample_value("pilot_connections",
                                                                     {"limit": "16384"}) is None


def test_cuda_ipc_gauges() -> None:
    """Exports, opens, and memory kept for importers (resources/ipc.py counts)."""
    v = registry_for(Metrics()).get_sample_value
    assert v("pilot_ipc_exports", {"kind": "memory"}) == 3 and v("pilot_ipc_exports", {"kind": "event"}) == 1
    assert v("pilot_ipc_grants") == 5 and v("pilot_ipc_kept_bytes") == 2 * GiB


def test_preemption_is_exported_when_on() -> None:
    """[priority] preempt's report (scheduling/preempt.py describe) as counters and gauges."""
    state = fake_state()
    assert registry_for(Metrics()).get_sample_value("pilot_preempt_raises_total", {"gpu": "0"}) is None
    state["preemption"] = {
        "chunk": 1, "modules": 2, "modules_without_variants": [], "preemptible_kernels": 3,
        "kernels_not_preemptible": {"k": "uses module variables"}, "jit_modules": 2,
        "jit_seconds": 0.25,
        "tenants": {"bob": {"preempted": 4, "blocks_deferred": 900}},
        "choices": {"chunk 8": 2, "original": 1},
        "retreat_spread": [1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        "policy_preemptions": 5, "policy_resumes": 4,
        "drain": [0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        "gpus": {"0": {"usable": True, "armed": 1, "raised": 0, "raises": 10, "clears": 9,
                       "failed_writes": 0, "forced_clears": 2}, "1": {"usable": False}}}
    v = registry_for(Metrics(), lambda: state).get_sample_value
    assert v("pilot_preempt_raises_total", {"gpu": "0"}) == 10
    assert v("pilot_preempt_clears_total", {"gpu": "0", "why": "idle"}) == 7
    assert v("pilot_preempt_clears_total", {"gpu": "0", "why": "forced"}) == 2
    assert v("pilot_preempt_raises_total", {"gpu": "1"}) is None
    assert v("pilot_preemptible_kernels", {"state": "preemptible"}) == 3
    assert v("pilot_preemptible_kernels", {"state": "refused"}) == 1
    assert v("pilot_ptx_jit_seconds_total") == 0.25
    assert v("pilot_preemptions_total", {"tenant": "bob"}) == 4
    assert v("pilot_preempt_blocks_deferred_total", {"tenant": "bob"}) == 900
    # the GPU's log2 buckets of microseconds, cumulative: 1 below 1.024 us, 3 below 32.8 us
    assert v("pilot_preempt_retreat_seconds_bucket", {"le": "1.024e-06"}) == 1
    assert v("pilot_preempt_retreat_seconds_bucket", {"le": "3.2768e-05"}) == 3
    assert v("pilot_preempt_retreat_seconds_bucket", {"le": "+Inf"}) == 4
    assert v("pilot_preempt_retreat_seconds_count") == 4
    assert v("pilot_preempt_choices", {"choice": "chunk 8"}) == 2
    assert v("pilot_preempt_choices", {"choice": "original"}) == 1
    # a policy's preemptions (Controls.preempt) and their drain times, in the same buckets
    assert v("pilot_policy_preemptions_total", {"what": "preempt"}) == 5
    assert v("pilot_policy_preemptions_total", {"what": "resume"}) == 4
    assert v("pilot_policy_preempt_drain_seconds_bucket", {"le": "3.2768e-05"}) == 1
    assert v("pilot_policy_preempt_drain_seconds_bucket", {"le": "6.5536e-05"}) == 4
    assert v("pilot_policy_preempt_drain_seconds_count") == 5


def test_the_spin_budget_is_exported() -> None:
    """The process's spin budget: its limit, and the waits that spun or slept."""
    from pilot.daemon.protocol import lib
    v = registry_for(Metrics()).get_sample_value
    spun, slept = v("pilot_spin_waits_total", {"outcome": "spun"}), v("pilot_spin_waits_total",
                                                                       {"outcome": "slept"})
    lib.pilot_spin_set_limit(1)
    try:
        assert lib.pilot_spin_take() == 1
        assert lib.pilot_spin_take() == 0
        lib.pilot_spin_give(lib.PILOT_SPIN_TOKEN)
        v = registry_for(Metrics()).get_sample_value
        assert v("pilot_spin_limit") == 1
        assert v("pilot_spin_waits_total", {"outcome": "spun"}) == spun + 1
        assert v("pilot_spin_waits_total", {"outcome": "slept"}) == slept + 1
    finally:
        lib.pilot_spin_set_limit(0)


def test_connections_in_the_daemons_snapshot() -> None:
    """The acceptor's counts reach the snapshot the collector reads (router/server.py)."""
    from pilot.daemon.router.admission import Admission, Peer
    admission = Admission(total=2, per_uid=1)
    assert admission.admit(Peer(uid=5, gid=5, pid=1, start_time=None))
    assert not admission.admit(Peer(uid=5, gid=5, pid=2, start_time=None))  # past per_uid
    assert (admission.connections(), admission.connections(5), admission.refused) == (1, 1, 1)


def test_salus_gauges() -> None:
    def state() -> dict[str, Any]:
        jobs = [{"session": 1, "running": True, "held": ""},
                {"session": 2, "running": False, "held": "fifo: another job's turn"},
                {"session": 3, "running": False, "held": "no lane fits"}]
        return {**fake_state(), "salus": {"scheduler": "fifo", "gpus": {"0": {
            "capacity": 12 * GiB, "used": 9 * GiB, "persistent": 2 * GiB, "lane_bytes": 7 * GiB,
            "lanes": [{"lane": 1}], "queue": [3], "jobs": jobs}}}}
    v = registry_for(Metrics(), state).get_sample_value
    assert v("pilot_salus_lanes", {"gpu": "0"}) == 1
    assert v("pilot_salus_memory_bytes", {"gpu": "0", "part": "persistent"}) == 2 * GiB
    assert v("pilot_salus_memory_bytes", {"gpu": "0", "part": "lanes"}) == 7 * GiB
    assert v("pilot_salus_memory_bytes", {"gpu": "0", "part": "capacity"}) == 12 * GiB
    assert [v("pilot_salus_jobs", {"gpu": "0", "state": s}) for s in ("running", "held", "queued")] \
        == [1, 1, 1]
    assert registry_for(Metrics()).get_sample_value("pilot_salus_lanes", {"gpu": "0"}) is None


def test_no_pid_or_session_labels() -> None:
    for family in registry_for(Metrics()).collect():
        for sample in family.samples:
            assert not {"pid", "session"} & set(sample.labels), sample


def test_tenant_names_only_when_the_operator_opts_in() -> None:
    """Issue 27 (9): the endpoint is open to every local user, so by default no tenant's name,
    sessions or memory are told apart; series are summed under tenant="all"."""
    m = Metrics()
    m.bytes_copied("h2d", 100, tenant="alice")
    m.bytes_copied("h2d", 50, tenant="bob")
    registry = CollectorRegistry()
    registry.register(PilotCollector(m, fake_state, tenant_labels=False))
    tenants = {s.labels["tenant"] for f in registry.collect() for s in f.samples if "tenant" in s.labels}
    assert tenants == {"all"}
    v = registry.get_sample_value
    assert v("pilot_tenant_device_memory_bytes", {"tenant": "all", "gpu": "0"}) == 3 * GiB
    assert v("pilot_tenant_sessions", {"tenant": "all", "gpu": "0"}) == 2
    assert v("pilot_tenant_copied_bytes_total", {"tenant": "all", "direction": "h2d"}) == 150


def test_state_failure_still_exports_counters(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> dict[str, Any]:
        raise KeyError("sessions")

    m = Metrics()
    m.kernels_launched(2)
    r = registry_for(m, state=broken)
    with caplog.at_level(logging.ERROR, logger="pilot.metrics"):
        assert r.get_sample_value("pilot_kernels_launched_total") == 2
    assert r.get_sample_value("pilot_sessions", {"gpu": "0"}) is None
    assert "state snapshot failed" in caplog.text


def test_registering_does_not_call_state() -> None:
    def not_yet() -> dict[str, Any]:
        raise AssertionError("state() called at registration")

    registry = CollectorRegistry(auto_describe=True)
    registry.register(PilotCollector(Metrics(), not_yet))
    with pytest.raises(ValueError, match="Duplicated"):  # describe() names the families
        registry.register(PilotCollector(Metrics(), not_yet))


def test_poller_counters() -> None:
    r = registry_for(Metrics(), poller=SimpleNamespace(reads_total=7, errors_total=2))
    assert r.get_sample_value("pilot_nvml_reads_total") == 7
    assert r.get_sample_value("pilot_nvml_errors_total") == 2


# --- exporter ---------------------------------------------------------------------------------

def test_exporter_serves_text_format_on_port_0() -> None:
    m = Metrics()
    m.call("cudaMalloc", 2e-6)
    exporter = start_exporter("127.0.0.1:0", PilotCollector(m, fake_state))
    try:
        assert exporter.port > 0
        assert any(t.name == "exporter" and t.daemon for t in threading.enumerate())
        with urllib.request.urlopen(exporter.url, timeout=10) as resp:
            content_type = resp.headers["Content-Type"]
            body = resp.read().decode()
        assert content_type.startswith("text/plain") and "version=0.0.4" in content_type
        families = {f.name: f for f in text_string_to_metric_families(body)}
        assert families["pilot_call_latency_seconds"].type == "histogram"
        assert families["pilot_calls"].type == "counter"  # the parser strips _total
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in families.values() for s in f.samples}
        assert samples[("pilot_calls_total", (("function", "cudaMalloc"),))] == 1
        assert samples[("pilot_tenant_device_memory_bytes",
                        (("gpu", "0"), ("tenant", "alice")))] == 3 * GiB
        assert "process_resident_memory_bytes" in families
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(exporter.url.replace("/metrics", "/nope"), timeout=10)
        assert info.value.code == 404
    finally:
        exporter.stop()
    exporter.stop()  # idempotent
    assert not any(t.name == "exporter" for t in threading.enumerate())
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(exporter.url, timeout=2)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_address(":0") == ("", 0)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    for bad in ("9400", "host:x", "host:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


# --- Grafana dashboard ------------------------------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                   "unless", "bool", "offset"}
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression refers to; enough PromQL for dashboard queries."""
    expr = re.sub(r"\$\{?\w+\}?", "X", expr)  # Grafana variables
    labels: set[str] = set()
    for group in GROUPING.findall(expr):
        labels |= {w.strip() for w in group.split(",") if w.strip()}
    for matchers in MATCHERS.findall(expr):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = MATCHERS.sub("", GROUPING.sub("", expr))
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][\w:]*", expr):
        if m.start() and (expr[m.start() - 1].isdigit() or expr[m.start() - 1] == "."):
            continue  # the exponent of a number such as 1e-6
        if expr[m.end():].lstrip().startswith("(") or m.group() in PROMQL_KEYWORDS:
            continue  # a function or a keyword
        names.add(m.group())
    return names, labels


def test_promql_names_extractor() -> None:
    names, labels = promql_names(
        'histogram_quantile(0.99, sum by (function, le) (rate(pilot_x_bucket{a=~"$v",b="c"}'
        '[$__rate_interval]))) / on (gpu) group_left max(pilot_y) * 1e-6 + 2.5')
    assert names == {"pilot_x_bucket", "pilot_y"}
    assert labels == {"function", "le", "a", "b", "gpu"}


def exported_series() -> dict[str, set[str]]:
    """Every sample name the collector produces (with all counters touched) -> its labels."""
    m = Metrics()
    m.call("cudaMemcpy", 1e-5)
    m.kernels_launched()
    m.bytes_copied("h2d", 1)
    for event in ("admission_wait", "throttle", "advise", "preemption", "quota_rejection"):
        getattr(m, event)("alice")
    for key, (_name, _doc, labels) in LABELED_COUNTERS.items():
        m.count(key, tuple("x" for _ in labels))
    registry = registry_for(m, poller=SimpleNamespace(reads_total=1, errors_total=1))
    series: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def dashboard_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in panels:
        out.append(p)
        out += dashboard_panels(p.get("panels", []))
    return out


def test_grafana_dashboard_queries_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert 36 <= dash["schemaVersion"] <= 41
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    series = exported_series()
    panels = dashboard_panels(dash["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))

    used: set[str] = set()
    exprs = 0
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names, labels = promql_names(target["expr"])
            assert names, (panel["title"], target["expr"])
            unknown = names - set(series)
            assert not unknown, (panel["title"], unknown)
            labels |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            available = set().union(*(series[n] for n in names)) | {"instance", "job"}
            assert labels <= available, (panel["title"], labels - available)
            used |= names
            exprs += 1
    for var in dash["templating"]["list"]:
        metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["definition"]).groups()
        assert label in series[metric] | {"instance", "job"}, var["name"]  # those two: Prometheus's
    # every query is filtered by the host variable (issue 15: several pilotd hosts on one dashboard)
    for panel in panels:
        for target in panel.get("targets", []):
            for name in re.findall(r"\bpilot_\w+", target["expr"]):
                assert re.search(name + r'\{instance=~"\$instance"', target["expr"]), target["expr"]

    # The panels the brief asks for are there.
    for name in ("pilot_gpu_memory_used_bytes", "pilot_gpu_memory_free_bytes",
                 "pilot_gpu_capacity_bytes", "pilot_gpu_utilization_ratio", "pilot_sessions",
                 "pilot_tenant_device_memory_bytes", "pilot_tenant_managed_memory_bytes",
                 "pilot_tenant_quota_bytes", "pilot_calls_total",
                 "pilot_call_latency_seconds_bucket", "pilot_kernels_launched_total",
                 "pilot_copied_bytes_total", "pilot_admission_waits_total",
                 "pilot_throttles_total", "pilot_advises_total", "pilot_preemptions_total",
                 "pilot_quota_rejections_total"):
        assert name in used, name
    assert exprs >= 20


def test_build_info() -> None:
    """pilot_build_info{version, python} = 1, so dashboards can tell versions apart (issue 15)."""
    import platform

    from pilot import __version__

    samples = {s.name: s for f in registry_for(Metrics()).collect() for s in f.samples}
    build = samples["pilot_build_info"]
    assert build.value == 1
    assert build.labels == {"version": __version__, "python": platform.python_version()}


def test_pilotd_does_not_start_when_its_metrics_port_is_taken(tmp_path: Path) -> None:
    """A busy metrics port stopped nothing but the metrics (the daemon said ready); now the
    start fails with a message naming the address and the way out (issue 15)."""
    import socket as socket_module
    import subprocess
    import sys

    with socket_module.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "pilot.daemon", "--backend", "sim", "--socket",
             str(tmp_path / "p.sock"), "--state-dir", str(tmp_path / "state"),
             "--metrics-address", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert '"" to run without metrics' in proc.stderr
    assert not (tmp_path / "p.sock").exists()  # nothing left behind


ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "pilot-alerts.yml"


def test_alert_rules_use_exported_metrics_and_pass_promtool() -> None:
    """deploy/pilot-alerts.yml (issue 15): every pilot_* metric its rules query is exported (with
    the labels they use), and `promtool check rules` accepts it where promtool is installed."""
    import shutil
    import subprocess

    series = exported_series()
    exprs = re.findall(r"^\s+expr: (.+)$", ALERTS.read_text(), flags=re.M)
    assert len(exprs) >= 5
    for expr in exprs:
        names, labels = promql_names(expr)
        for name in names - {"up"}:
            assert name in series, (expr, name)
            assert labels <= series[name] | {"instance", "job"}, (expr, labels - series[name])
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed: the rules' syntax is not checked here")
    proc = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
