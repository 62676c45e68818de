"""Prometheus metrics: counters the daemon's threads bump, and a collector that reads them and the
daemon's state at scrape time.

Counting is on the hot path (every CUDA call on a vGPU thread), so it is plain Python arithmetic
with no lock and no prometheus_client objects: each thread writes its own shard (a thread-local
`_Shard`), which keeps counts exact whatever the interleaving of threads, and the collector adds
the shards up when Prometheus scrapes. A shard outlives its thread, so counters never go back.
Everything else (sessions, memory, quotas, GPU readings) is a gauge computed from a snapshot the
daemon builds on demand (`state()`), so nothing is kept twice.

Labels are low-cardinality by design: tenant, gpu, vgpu, function, direction, kind. Never pid or
session: those churn and would grow Prometheus's series without bound.
"""

from __future__ import annotations

import logging
import math
import platform
import socket
import socketserver
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from pilot import __version__
from pilot.daemon.backends import ptx_preempt as pp
from pilot.daemon.protocol import ffi, lib
from pilot.daemon.telemetry.thread_names import NamedThread

log = logging.getLogger("pilot.metrics")

# Upper bounds (seconds) of the call latency histogram: 1-2.5-5 per decade from 1 us (a call
# answered in the shim's spin window) to 10 s (a large synchronous copy or a long synchronize).
LATENCY_BUCKETS: tuple[float, ...] = (
    1e-6, 2.5e-6, 5e-6,
    1e-5, 2.5e-5, 5e-5,
    1e-4, 2.5e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3,
    1e-2, 2.5e-2, 5e-2,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
    10.0,
)
_BOUNDS = list(LATENCY_BUCKETS)
# A call row: [calls, bucket_0 .. bucket_n (the last one is +Inf), sum of observed seconds].
_NBUCKETS = len(LATENCY_BUCKETS) + 1
_SUM = _NBUCKETS + 1
_ROW = [0] * (_NBUCKETS + 1) + [0.0]

DIRECTIONS = ("h2d", "d2h", "d2d")
POLICY_EVENTS = ("admission_wait", "throttle", "advise", "preemption", "quota_rejection")


class _Shard:
    """One thread's counters. Only its thread writes; the collector copies (dict/list copies are
    atomic under the GIL) and sums."""

    __slots__ = ("calls", "copied", "kernels", "labeled", "policy")

    def __init__(self) -> None:
        self.calls: dict[str, list[Any]] = {}
        self.copied: dict[str, int] = dict.fromkeys(DIRECTIONS, 0)
        self.kernels = 0
        self.policy: dict[tuple[str, str], int] = {}
        self.labeled: dict[tuple[str, tuple[str, ...]], float] = {}


# Counters with labels of their own: key -> (metric name, help, label names).
LABELED_COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "allocation_refusals": ("pilot_allocation_refusals_total",
                            "Allocations refused by the resource broker, by path (kind) and reason.",
                            ("tenant", "kind", "reason")),
    "policy_decisions": ("pilot_policy_decisions_total",
                         "Launch decisions of the scheduling policy.", ("policy", "tenant", "decision")),
    "launch_waits": ("pilot_launch_waits_total",
                     "Launches that had to wait, by how their wait ended.", ("policy", "tenant", "outcome")),
    "launch_wait_seconds": ("pilot_launch_wait_seconds_total",
                            "Seconds launches spent waiting for the policy.", ("policy", "tenant")),
    "policy_actions": ("pilot_policy_actions_total",
                       "What the policy did to a tenant: hold, release, throttle, unthrottle, and the "
                       "memory moves it asked for (evict, advise_host, unadvise).",
                       ("policy", "tenant", "action")),
    "policy_memory_events": ("pilot_policy_memory_events_total",
                             "Allocations and frees of GPU memory a policy counts: heard (its events) "
                             "or quiet (counted only, as the policy asked: Controls.quiet_memory).",
                             ("policy", "tenant", "outcome")),
    "residency_evicted_bytes": ("pilot_residency_evicted_bytes_total",
                                "Movable memory moved to host memory, by whose and why (capacity: "
                                "the enforcer made room; policy: a policy asked).",
                                ("gpu", "tenant", "reason")),
    "tenant_launches": ("pilot_tenant_launches_total", "Kernels launched, by tenant.", ("tenant",)),
    "priority_gate_holds": ("pilot_priority_gate_holds_total",
                            "Times a session's work was held at the priority gate (it had [priority] "
                            "gated_inflight pieces in flight while a higher class was active), by "
                            "tenant and its class.", ("tenant", "priority")),
    "preemptible_launches": ("pilot_preemptible_launches_total",
                             "Launches of gated sessions run as preemptible variants (they retreat "
                             "while a higher class needs the GPU), by tenant.", ("tenant",)),
    "priority_gate_wait_seconds": ("pilot_priority_gate_wait_seconds_total",
                                   "Seconds sessions' calls were held at the priority gate, by "
                                   "tenant and its class.", ("tenant", "priority")),
    "fast_launches": ("pilot_fast_launches_total",
                      "Of the kernels launched, those pilotd put on their stream in C, without "
                      "Python ([daemon] fast_launch), by tenant.", ("tenant",)),
    "fast_copies": ("pilot_fast_copies_total",
                    "Small cudaMemcpy H2D/D2H calls pilotd did and answered in C, without Python "
                    "([daemon] fast_launch), by tenant.", ("tenant",)),
    "fast_syncs": ("pilot_fast_syncs_total",
                   "cudaDeviceSynchronize / cudaStreamSynchronize calls pilotd did and answered in "
                   "C, without Python ([daemon] fast_launch), by tenant.", ("tenant",)),
    "fast_word_answers": ("pilot_fast_word_answers_total",
                          "Of the synchronizations and small D2H copies pilotd answered in C, "
                          "those answered at once with a completion word the GPU writes behind "
                          "the work, which the program polls (no pilotd thread waits), by "
                          "tenant.", ("tenant",)),
    "fast_library_calls": ("pilot_fast_library_calls_total",
                           "cuBLAS GEMMs, cuBLASLt matmuls and cudaMemset calls pilotd checked and "
                           "issued in C, without Python ([daemon] fast_launch), by tenant.",
                           ("tenant",)),
    "fast_graph_launches": ("pilot_fast_graph_launches_total",
                            "CUDA graph launches pilotd made in C (one cuGraphLaunch each), "
                            "without Python ([daemon] fast_launch), by tenant.", ("tenant",)),
    "graph_instantiations": ("pilot_graph_instantiations_total",
                             "Executable graphs programs had pilotd instantiate, by outcome: "
                             "instantiated (a CUDA graph in pilotd), refused (a node outside "
                             "the tenant's memory), or replay_* (the shim issues the nodes one "
                             "by one: replay_node, replay_policy, replay_capture, replay_limit).",
                             ("tenant", "outcome")),
    "fast_flushes": ("pilot_fast_flushes_total",
                     "Unified-memory shadow flushes (host-written managed memory to the GPU) "
                     "pilotd did and answered in C, without Python ([daemon] fast_launch), by "
                     "tenant.", ("tenant",)),
    "tenant_kernel_seconds": ("pilot_tenant_kernel_seconds_total",
                              "GPU time of the tenant's kernels, from events recorded around each "
                              "launch ([metrics] kernel_time; kernels that overlap count each).",
                              ("tenant",)),
    "library_calls": ("pilot_library_calls_total",
                      "CUDA math library calls (cuBLAS, cuBLASLt) pilotd ran, by tenant and function.",
                      ("tenant", "function")),
    "tenant_copied_bytes": ("pilot_tenant_copied_bytes_total",
                            "Bytes copied by cudaMemcpy and friends, by tenant and direction.",
                            ("tenant", "direction")),
    "residency_prefetched_bytes": ("pilot_residency_prefetched_bytes_total",
                                   "Movable memory moved onto the GPU ahead of use: a policy's "
                                   "unthrottle, or a launch's footprint (MFit, AMFit).", ("gpu", "tenant")),
}


@dataclass(frozen=True)
class CallStats:
    """Totals for one CUDA function. `buckets` are per-bucket (not cumulative) counts of the
    observed latencies, aligned with LATENCY_BUCKETS plus a final +Inf bucket."""

    calls: int
    buckets: tuple[int, ...]
    latency_sum: float

    @property
    def observed(self) -> int:
        return sum(self.buckets)


@dataclass(frozen=True)
class MetricsSnapshot:
    calls: dict[str, CallStats]
    kernels: int
    copied: dict[str, int]
    policy: dict[tuple[str, str], int]  # (event, tenant) -> count; events from POLICY_EVENTS
    labeled: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)


class Metrics:
    """Counters updated by the daemon's threads; read by `PilotCollector` at scrape time.

    `call()` costs a thread-local lookup, a dict lookup and a few integer adds (and a bisect when
    a latency is given); see the printout in tests/unit/test_metrics.py.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._shards: list[_Shard] = []
        self._shards_lock = threading.Lock()

    def _new_shard(self) -> _Shard:
        shard = _Shard()
        with self._shards_lock:
            self._shards.append(shard)
        self._local.shard = shard
        return shard

    def shard(self) -> _Shard:
        """The calling thread's counters, for a hot loop that counts inline (vGPU threads):
        `shard.calls[name][0] += 1`, `shard.kernels += n`."""
        try:
            return self._local.shard
        except AttributeError:
            return self._new_shard()

    @staticmethod
    def new_row() -> list[float]:
        """A fresh per-function row for shard.calls (count, histogram buckets, sum)."""
        return _ROW.copy()

    def call(self, function: str, seconds: float | None = None) -> None:
        """Counts a call of a CUDA function (by name); observes its latency when given."""
        try:
            shard = self._local.shard
        except AttributeError:
            shard = self._new_shard()
        try:
            row = shard.calls[function]
        except KeyError:
            row = shard.calls[function] = _ROW.copy()
        row[0] += 1
        if seconds is not None:
            row[bisect_left(_BOUNDS, seconds) + 1] += 1  # le semantics: x <= bound
            row[_SUM] += seconds

    def kernels_launched(self, n: int = 1) -> None:
        try:
            shard = self._local.shard
        except AttributeError:
            shard = self._new_shard()
        shard.kernels += n

    def bytes_copied(self, direction: str, n: int, tenant: str | None = None) -> None:
        """`direction` is one of h2d, d2h, d2d; with `tenant`, counted for it too."""
        try:
            shard = self._local.shard
        except AttributeError:
            shard = self._new_shard()
        try:
            shard.copied[direction] += n
        except KeyError:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}") from None
        if tenant is not None:
            key = ("tenant_copied_bytes", (tenant, direction))
            shard.labeled[key] = shard.labeled.get(key, 0) + n

    def _policy(self, event: str, tenant: str) -> None:
        try:
            shard = self._local.shard
        except AttributeError:
            shard = self._new_shard()
        key = (event, tenant)
        shard.policy[key] = shard.policy.get(key, 0) + 1

    def admission_wait(self, tenant: str) -> None:
        self._policy("admission_wait", tenant)

    def throttle(self, tenant: str) -> None:
        self._policy("throttle", tenant)

    def advise(self, tenant: str) -> None:
        self._policy("advise", tenant)

    def preemption(self, tenant: str) -> None:
        self._policy("preemption", tenant)

    def quota_rejection(self, tenant: str) -> None:
        self._policy("quota_rejection", tenant)

    def count(self, counter: str, labels: tuple[str, ...], n: float = 1) -> None:
        """Adds n to a counter of LABELED_COUNTERS (labels in its order)."""
        try:
            shard = self._local.shard
        except AttributeError:
            shard = self._new_shard()
        key = (counter, labels)
        shard.labeled[key] = shard.labeled.get(key, 0) + n

    def snapshot(self) -> MetricsSnapshot:
        """The sum of every thread's counters. Counts bumped while this runs may or may not be
        included; each call's row is copied whole, so a histogram's count and buckets agree."""
        with self._shards_lock:
            shards = list(self._shards)
        rows: dict[str, list[Any]] = {}
        kernels = 0
        copied = dict.fromkeys(DIRECTIONS, 0)
        policy: dict[tuple[str, str], int] = {}
        labeled: dict[tuple[str, tuple[str, ...]], float] = {}
        for shard in shards:
            for key, n in dict(shard.labeled).items():
                labeled[key] = labeled.get(key, 0) + n
            for function, row in dict(shard.calls).items():
                row = list(row)
                total = rows.get(function)
                if total is None:
                    rows[function] = row
                else:
                    for i, value in enumerate(row):
                        total[i] += value
            kernels += shard.kernels
            for direction, n in dict(shard.copied).items():
                copied[direction] += n
            for key, n in dict(shard.policy).items():
                policy[key] = policy.get(key, 0) + n
        calls = {f: CallStats(calls=r[0], buckets=tuple(r[1:_SUM]), latency_sum=r[_SUM])
                 for f, r in rows.items()}
        return MetricsSnapshot(calls=calls, kernels=kernels, copied=copied, policy=policy,
                               labeled=labeled)


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


_POLICY_METRICS = {
    "admission_wait": ("pilot_admission_waits_total", "Allocations or sessions that waited for admission."),
    "throttle": ("pilot_throttles_total", "Times a tenant was throttled."),
    "advise": ("pilot_advises_total", "Memory advice (MAdvise) actions taken for a tenant."),
    "preemption": ("pilot_preemptions_total", "Times a tenant's work was preempted."),
    "quota_rejection": ("pilot_quota_rejections_total", "Allocations refused by a tenant's quota."),
}


TENANTS_HIDDEN = "all"


def _without_tenants(family: Metric) -> Metric:
    """`family` with its samples summed over the tenant label (tenant="all")."""
    if not any("tenant" in sample.labels for sample in family.samples):
        return family
    summed: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
    for sample in family.samples:
        labels = dict(sample.labels)
        if "tenant" in labels:
            labels["tenant"] = TENANTS_HIDDEN
        key = (sample.name, tuple(sorted(labels.items())))
        prev = summed.get(key)
        summed[key] = sample._replace(labels=labels, value=sample.value + (prev.value if prev else 0),
                                      exemplar=None)
    family.samples = list(summed.values())
    return family


class PilotCollector(Collector):
    """A prometheus_client custom collector: everything is computed at scrape time from the
    `Metrics` counters and one `state()` snapshot.

    `state()` returns {"sessions": [{"session", "tenant", "pid", "gpu", "device_bytes",
    "managed_bytes"}], "gpus": [{"index", "capacity", "draining", "reading": GpuReading | None,
    "name", "uuid", "pci_bus_id"}],
    "quotas": {tenant: {gpu_key: {"hard": int | None, "provisioned": int | None}}},
    "vgpus": [{"index", "gpu", "sessions"}],
    "shares": {gpu: {"sms": int | None, "held": {tenant: SMs}}}}; missing keys count as empty.
    If it raises, the scrape still returns the counters (and the failure is logged), so a bug
    there cannot blind the counters. `poller` (an NvmlPoller), when given, adds its read/error counters.
    """

    def __init__(self, metrics: Metrics, state: Callable[[], dict[str, Any]],
                 poller: Any = None, tenant_labels: bool = True) -> None:
        """`tenant_labels` False ([metrics] tenant_labels, the daemon's default): the endpoint is
        readable by every local user, so series are not told apart by tenant: each family's
        samples that differ only by tenant are summed under tenant="all"."""
        self.metrics = metrics
        self.state = state
        self.poller = poller
        self.tenant_labels = tenant_labels

    def describe(self) -> Iterator[Metric]:
        # Names only, so registering does not call state() (the daemon may not be ready yet).
        yield from self._state_families({})
        yield from self._counter_families(None)

    def collect(self) -> Iterator[Metric]:
        families = self._collect()
        if self.tenant_labels:
            yield from families
        else:
            yield from (_without_tenants(f) for f in families)

    def _collect(self) -> Iterator[Metric]:
        try:
            state = self.state()
        except Exception:
            log.exception("metrics state snapshot failed; exporting counters only")
            state = None
        build = _gauge("pilot_build_info", "Always 1; pilot's version and the Python it runs on.",
                       ["version", "python"])
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        if state is not None:
            yield from self._state_families(state)
        yield from self._counter_families(self.metrics.snapshot())
        yield from self._spin_families()

    @staticmethod
    def _spin_families() -> Iterator[Metric]:
        """The spin budget of pilotd's threads (daemon/native/spin_budget.h, `[daemon] spinners`):
        how often a wait could spin and how often it slept at once because the budget was spent."""
        granted, refused = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        lib.pilot_spin_counts(granted, refused)
        limit = _gauge("pilot_spin_limit", "Threads of pilotd that may spin at once waiting for a "
                       "call or the GPU ([daemon] spinners; 0: no limit).")
        limit.add_metric([], lib.pilot_spin_limit())
        yield limit
        endpoint = _gauge("pilot_spin_endpoints", "1 while the vGPU threads spin for their tenants' "
                          "next calls, 0 while the host is crowded ([daemon] endpoint_spin).")
        endpoint.add_metric([], lib.pilot_spin_endpoint())
        yield endpoint
        waits = _counter("pilot_spin_waits", "Waits of pilotd's threads while a spin limit is set: "
                         "spun (a token of the spin budget held) or slept at once (the budget "
                         "spent).", ["outcome"])
        waits.add_metric(["spun"], granted[0])
        waits.add_metric(["slept"], refused[0])
        yield waits

    @staticmethod
    def _fault_families(faults: list[dict[str, Any]],
                        engine_faults: Iterable[dict[str, Any]] = ()) -> Iterator[Metric]:
        """GPU faults since pilotd's service started (they survive its restarts after a fault),
        and those of the isolated tenants' pilotds it started (each restarted alone; their
        tenant is always known)."""
        counts: dict[tuple[str, str, str], int] = {}
        teardowns: dict[tuple[str, str], int] = {}
        for f in [*faults, *engine_faults]:
            if f.get("bystander"):  # another MPS client's fault ended this pilotd's work
                where = (str(f["gpu"]), str(f.get("culprit") or "unknown"))
                teardowns[where] = teardowns.get(where, 0) + 1
                continue
            key = (str(f["gpu"]), str(f["error"]), str(f.get("tenant") or "unknown"))
            counts[key] = counts.get(key, 0) + 1
        total = _counter("pilot_gpu_faults", "Context-fatal GPU faults (a kernel's illegal address, "
                         "device assert...): every session on the GPU (of an isolated tenant's "
                         "pilotd: of that tenant) got the error and that pilotd restarted. "
                         "tenant: whose work faulted, where it is known.",
                         ["gpu", "error", "tenant"])
        for labels, n in sorted(counts.items()):
            total.add_metric(list(labels), n)
        yield total
        torn = _counter("pilot_gpu_mps_teardowns", "Restarts of this pilotd because the MPS "
                        "server tore every client down for another client's fault ([isolation] "
                        "mps); culprit: that client's tenant, where it was an engine of this pilotd.",
                        ["gpu", "culprit"])
        for where, n in sorted(teardowns.items()):
            torn.add_metric(list(where), n)
        yield torn
        recovery = _gauge("pilot_gpu_fault_recovery_seconds",
                          "From the last fault noticed to serving again.", ["gpu"])
        for f in faults:
            if f.get("restarted"):
                recovery.add_metric([str(f["gpu"])], f["restarted"] - f["detected"])
        yield recovery

    @staticmethod
    def _connection_families(conn: dict[str, Any] | None) -> Iterator[Metric]:
        """The main and control sockets' connections (router/acceptor.py): how near the limits
        pilotd is, and how many it refused (a flood, or a user past `connections_per_uid`)."""
        if not conn:
            return
        admitted = _gauge("pilot_connections", "Connections admitted to the main and control sockets "
                          "now; pilotd refuses more than `limit` in all.", ["limit"])
        admitted.add_metric([str(conn["limit"])], conn["admitted"])
        yield admitted
        refused = _counter("pilot_connections_refused", "Connections to the main and control sockets "
                           "refused: past [limits] connections_per_uid or connections, or out of "
                           "descriptors.")
        refused.add_metric([], conn["refused"])
        yield refused
        if "endpoint_refused" in conn:
            endpoint = _counter("pilot_endpoint_connections_refused", "Connections to the vGPU and "
                                "callback endpoints refused: past [limits] connections_per_uid or "
                                "connections, or out of descriptors.")
            endpoint.add_metric([], conn["endpoint_refused"])
            yield endpoint

    @staticmethod
    def _ipc_families(ipc: dict[str, Any] | None) -> Iterator[Metric]:
        """CUDA IPC (resources/ipc.py): exports, opens, and memory kept for the processes that
        opened it after its exporter freed it (still charged to the tenant)."""
        if not ipc:
            return
        exports = _gauge("pilot_ipc_exports", "Allocations and events exported through CUDA IPC "
                         "now.", ["kind"])
        exports.add_metric(["memory"], ipc["memory_exports"])
        exports.add_metric(["event"], ipc["event_exports"])
        yield exports
        grants = _gauge("pilot_ipc_grants", "Exported allocations opened by another process, "
                        "counted once per opening session.")
        grants.add_metric([], ipc["grants"])
        yield grants
        kept = _gauge("pilot_ipc_kept_bytes", "Device memory its exporter freed that pilotd keeps "
                      "for the processes that opened it (still charged to the tenant).")
        kept.add_metric([], ipc["kept_bytes"])
        yield kept

    @staticmethod
    def _preemption_families(pre: dict[str, Any] | None) -> Iterator[Metric]:
        """[priority] preempt (scheduling/preempt.py): retreat words raised and lowered per GPU,
        preemptible kernels, the JIT's time."""
        if not pre:
            return
        raised = _counter("pilot_preempt_raises", "Times a retreat word was raised on a GPU "
                          "(a higher class's launch while a lower class's preemptible kernels may "
                          "run), by GPU.", ["gpu"])
        lowered = _counter("pilot_preempt_clears", "Times raised retreat words were lowered, by "
                           "GPU and why (idle: the higher classes had no work left; forced: up "
                           "for longer than 0.25 s).", ["gpu", "why"])
        for gpu, w in sorted((pre.get("gpus") or {}).items()):
            if not w.get("usable"):
                continue
            raised.add_metric([gpu], int(w["raises"]))
            forced = int(w.get("forced_clears", 0))
            lowered.add_metric([gpu, "idle"], max(0, int(w["clears"]) - forced))
            lowered.add_metric([gpu, "forced"], forced)
        yield raised
        yield lowered
        f = _gauge("pilot_preemptible_kernels", "Kernels of the module images seen that have a "
                   "preemptible variant (preemptible) or not (refused).", ["state"])
        f.add_metric(["preemptible"], int(pre.get("preemptible_kernels", 0)))
        f.add_metric(["refused"], len(pre.get("kernels_not_preemptible") or {}))
        yield f
        chosen = _gauge("pilot_preempt_choices", "Kernels at a block size and grid size class, by "
                        "how they run while gated ([priority] preempt_chunk = \"auto\"): measuring, "
                        "original (every variant measured more than 5% slower), chunk N.", ["choice"])
        for how, n in sorted((pre.get("choices") or {}).items()):
            chosen.add_metric([how], int(n))
        yield chosen
        c = _counter("pilot_ptx_jit_seconds", "Seconds spent rewriting and compiling module images "
                     "into preemptible variants (a disk cache hit costs a read).")
        c.add_metric([], float(pre.get("jit_seconds", 0.0)))
        yield c
        preempted = _counter("pilot_preemptions", "Preemptions: parts of preemptible launches whose "
                             "blocks retreated (saw a retreat word raised before a claim) with "
                             "blocks left, which a later part of the launch ran; a launch of "
                             "several parts can be preempted more than once. By tenant; counted "
                             "by the GPU (the sessions' tallies, read when words come down and "
                             "when a session ends).", ["tenant"])
        deferred = _counter("pilot_preempt_blocks_deferred", "Logical blocks of preempted launches "
                            "that ran after a retreat (by a later part), by tenant.", ["tenant"])
        abandoned = _counter("pilot_preempt_blocks_abandoned", "Logical blocks that loop-level "
                             "retreats ([tenants.X] loop_preempt) left inside and that ran again "
                             "from their start, by tenant.", ["tenant"])
        for tenant, t in sorted((pre.get("tenants") or {}).items()):
            preempted.add_metric([tenant], int(t["preempted"]))
            deferred.add_metric([tenant], int(t["blocks_deferred"]))
            abandoned.add_metric([tenant], int(t.get("blocks_abandoned", 0)))
        yield preempted
        yield deferred
        yield abandoned
        spread = [int(n) for n in pre.get("retreat_spread") or ()]
        if spread:
            yield _log2_histogram(
                "pilot_preempt_retreat_seconds", "Per preempted launch, GPU clock time from the "
                "first of its blocks seeing the retreat word raised to the last one seeing it (the "
                "blocks still running finish their logical block first; the request came at most "
                "one block's time before the first sighting).", spread)
        drain = [int(n) for n in pre.get("drain") or ()]
        if any(drain):
            yield _log2_histogram(
                "pilot_policy_preempt_drain_seconds", "Per session a policy preempted "
                "(Controls.preempt), from the request to pilotd seeing the last of its cut launches "
                "leave the SMs (polled every 0.5 ms).", drain)
        made = _counter("pilot_policy_preemptions", "Sessions a policy preempted (Controls.preempt) "
                        "and resumed.", ["what"])
        made.add_metric(["preempt"], int(pre.get("policy_preemptions", 0)))
        made.add_metric(["resume"], int(pre.get("policy_resumes", 0)))
        yield made

    def _state_families(self, state: dict[str, Any]) -> Iterator[Metric]:
        sessions = list(state.get("sessions") or ())
        gpus = list(state.get("gpus") or ())
        quotas = dict(state.get("quotas") or {})
        vgpus = list(state.get("vgpus") or ())

        per_gpu: dict[str, int] = {str(g["index"]): 0 for g in gpus}
        per_tenant: dict[tuple[str, str], list[int]] = {}  # (tenant, gpu) -> [sessions, dev, managed]
        for s in sessions:
            gpu = str(s["gpu"])
            per_gpu[gpu] = per_gpu.get(gpu, 0) + 1
            row = per_tenant.setdefault((str(s["tenant"]), gpu), [0, 0, 0])
            row[0] += 1
            row[1] += int(s.get("device_bytes") or 0)
            row[2] += int(s.get("managed_bytes") or 0)

        f = _gauge("pilot_sessions", "Client sessions attached, by GPU.", ["gpu"])
        for gpu, n in sorted(per_gpu.items()):
            f.add_metric([gpu], n)
        yield f
        f = _gauge("pilot_priority_sessions",
                   "Sessions by GPU, priority class and whether the priority gate applies to them "
                   "now (gated=1: a higher class is active on the GPU).", ["gpu", "priority", "gated"])
        by_class: dict[tuple[str, str, str], int] = {}
        for s in sessions:
            key = (str(s["gpu"]), str(s.get("priority", "normal")), str(int(bool(s.get("gated")))))
            by_class[key] = by_class.get(key, 0) + 1
        for key, n in sorted(by_class.items()):
            f.add_metric(list(key), n)
        yield f
        f = _gauge("pilot_vgpu_sessions", "Client sessions attached, by vGPU.", ["gpu", "vgpu"])
        for v in vgpus:
            f.add_metric([str(v["gpu"]), str(v["index"])], int(v["sessions"]))
        yield f
        yield from self._preemption_families(state.get("preemption"))

        tenant_families = [
            _gauge("pilot_tenant_sessions", "Sessions of a tenant on a GPU.", ["tenant", "gpu"]),
            _gauge("pilot_tenant_device_memory_bytes",
                   "Device memory (cudaMalloc and friends) held by a tenant's sessions on a GPU.",
                   ["tenant", "gpu"]),
            _gauge("pilot_tenant_managed_memory_bytes",
                   "Managed (unified) memory held by a tenant's sessions on a GPU.", ["tenant", "gpu"]),
        ]
        for (tenant, gpu), row in sorted(per_tenant.items()):
            for family, value in zip(tenant_families, row, strict=True):
                family.add_metric([tenant, gpu], value)
        yield from tenant_families

        f = _gauge("pilot_tenant_quota_bytes",
                   "A tenant's memory quota on a GPU: kind=hard (never exceeded) or provisioned "
                   "(guaranteed).", ["tenant", "gpu", "kind"])
        for tenant, by_gpu in sorted(quotas.items(), key=lambda kv: str(kv[0])):
            for gpu_key, limits in sorted((by_gpu or {}).items(), key=lambda kv: str(kv[0])):
                for kind in ("hard", "provisioned"):
                    value = (limits or {}).get(kind)
                    if value is not None:
                        f.add_metric([str(tenant), str(gpu_key), kind], int(value))
        yield f

        f = _gauge("pilot_tenant_sm_share_ratio",
                   "The part of a GPU's SMs a capped tenant's partition holds now (compute shares; "
                   "tenants without a partition run on the whole GPU).", ["tenant", "gpu"])
        for gpu, rep in sorted(dict(state.get("shares") or {}).items(), key=lambda kv: str(kv[0])):
            sms = (rep or {}).get("sms")
            for tenant, held in sorted(((rep or {}).get("held") or {}).items()):
                if sms:
                    f.add_metric([str(tenant), str(gpu)], held / sms)
        yield f

        info = _gauge("pilot_gpu_info", "Always 1; the GPU's name, UUID (as nvidia-smi and DCGM show "
                      "it) and PCI bus id as labels.", ["gpu", "name", "uuid", "pci_bus_id"])
        capacity = _gauge("pilot_gpu_capacity_bytes",
                          "Memory pilot hands out on a GPU (--capacity, or the GPU's total).", ["gpu"])
        draining = _gauge("pilot_gpu_draining", "1 while a GPU takes no new sessions.", ["gpu"])
        used = _gauge("pilot_gpu_memory_used_bytes", "GPU memory in use, as the driver reports it.",
                      ["gpu"])
        free = _gauge("pilot_gpu_memory_free_bytes", "GPU memory free, as the driver reports it.",
                      ["gpu"])
        total = _gauge("pilot_gpu_memory_total_bytes", "GPU memory installed.", ["gpu"])
        util = _gauge("pilot_gpu_utilization_ratio",
                      "Fraction of the last sample period a kernel was running (NVML).", ["gpu"])
        mem_util = _gauge("pilot_gpu_memory_utilization_ratio",
                          "Fraction of the last sample period device memory was read or written "
                          "(NVML).", ["gpu"])
        for g in gpus:
            gpu = str(g["index"])
            if g.get("capacity") is not None:
                capacity.add_metric([gpu], int(g["capacity"]))
            draining.add_metric([gpu], 1 if g.get("draining") else 0)
            reading = g.get("reading")
            name = g.get("name") or (reading.name if reading is not None else "")
            info.add_metric([gpu, str(name), str(g.get("uuid", "")), str(g.get("pci_bus_id", ""))], 1)
            if reading is None:
                continue  # no reading (poller not started, or the GPU's last read failed)
            used.add_metric([gpu], reading.memory_used)
            free.add_metric([gpu], reading.memory_free)
            total.add_metric([gpu], reading.memory_total)
            if not math.isnan(reading.utilization_gpu):
                util.add_metric([gpu], reading.utilization_gpu / 100.0)
            if not math.isnan(reading.utilization_memory):
                mem_util.add_metric([gpu], reading.utilization_memory / 100.0)
        yield from (info, capacity, draining, used, free, total, util, mem_util)
        yield from self._fault_families(list(state.get("faults") or ()),
                                        list(state.get("engine_faults") or ()))
        yield from self._connection_families(state.get("connections"))
        yield from self._ipc_families(state.get("ipc"))

        resident = _gauge("pilot_gpu_resident_bytes",
                          "Movable (managed) memory pilot counts resident on a GPU.", ["gpu"])
        peak = _gauge("pilot_gpu_resident_peak_bytes",
                      "The most movable memory pilot counted resident on a GPU at once.", ["gpu"])
        room = _gauge("pilot_gpu_resident_room_bytes",
                      "What movable memory may occupy: the capacity less fixed allocations.", ["gpu"])
        movable = _gauge("pilot_gpu_movable_bytes", "Movable (managed) memory allocated on a GPU.",
                         ["gpu"])
        advised = _gauge("pilot_gpu_advised_host_bytes",
                         "Movable memory a policy keeps in host memory (MAdvise).", ["gpu"])
        for g in gpus:
            r = g.get("residency")
            if r:
                gpu = str(g["index"])
                resident.add_metric([gpu], r["resident"])
                peak.add_metric([gpu], r["peak_resident"])
                room.add_metric([gpu], r["room"])
                movable.add_metric([gpu], r["movable"])
                advised.add_metric([gpu], r["advised_to_host"])
        yield from (resident, peak, room, movable, advised)
        yield from self._salus_families(state.get("salus") or {})

    @staticmethod
    def _salus_families(salus: dict[str, Any]) -> Iterator[Metric]:
        """The salus policy's lanes per GPU (`pilotctl lanes`'s state); empty under other policies."""
        lanes = _gauge("pilot_salus_lanes", "Lanes of the salus policy on a GPU.", ["gpu"])
        memory = _gauge("pilot_salus_memory_bytes",
                        "The salus safety condition's terms: sum of admitted jobs' persistent memory "
                        "(persistent), sum of lane sizes (lanes), what jobs without a lane hold "
                        "(outside), and C (capacity).", ["gpu", "part"])
        jobs = _gauge("pilot_salus_jobs", "Jobs (sessions) of the salus policy by state: running an "
                      "iteration, held at a boundary or launch, queued for a lane.", ["gpu", "state"])
        for gpu, g in sorted((salus.get("gpus") or {}).items()):
            lanes.add_metric([gpu], len(g["lanes"]))
            for part, key in (("persistent", "persistent"), ("lanes", "lane_bytes"),
                              ("outside", "outside"), ("capacity", "capacity")):
                memory.add_metric([gpu, part], g.get(key, 0))
            queued = set(g["queue"])
            counts = {"running": 0, "held": 0, "queued": len(queued)}
            for j in g["jobs"]:
                if j["running"]:
                    counts["running"] += 1
                elif j["held"] and j["session"] not in queued:
                    counts["held"] += 1
            for state, n in counts.items():
                jobs.add_metric([gpu, state], n)
        yield from (lanes, memory, jobs)

    def _counter_families(self, snap: MetricsSnapshot | None) -> Iterator[Metric]:
        calls = _counter("pilot_calls_total", "CUDA calls handled, by function.", ["function"])
        latency = HistogramMetricFamily(
            "pilot_call_latency_seconds",
            "Time the daemon took to handle a CUDA call, by function.", labels=["function"])
        kernels = _counter("pilot_kernels_launched_total", "Kernels launched.")
        copied = _counter("pilot_copied_bytes_total", "Bytes copied by cudaMemcpy and friends.",
                          ["direction"])
        policy = {event: _counter(name, doc, ["tenant"])
                  for event, (name, doc) in _POLICY_METRICS.items()}
        labeled = {key: _counter(name, doc, labels) for key, (name, doc, labels) in LABELED_COUNTERS.items()}
        families: list[Metric] = [calls, latency, kernels, copied, *policy.values(), *labeled.values()]
        poller = self.poller
        if poller is not None:
            nvml_reads = _counter("pilot_nvml_reads_total", "Successful GPU readings (NVML poller).")
            nvml_errors = _counter("pilot_nvml_errors_total", "Failed GPU readings (NVML poller).")
            families += [nvml_reads, nvml_errors]
        if snap is not None:
            for function, stats in sorted(snap.calls.items()):
                calls.add_metric([function], stats.calls)
                if stats.observed:
                    cumulative, buckets = 0, []
                    for bound, n in zip((*LATENCY_BUCKETS, math.inf), stats.buckets, strict=True):
                        cumulative += n
                        buckets.append((floatToGoString(bound), cumulative))
                    latency.add_metric([function], buckets, stats.latency_sum)
            kernels.add_metric([], snap.kernels)
            for direction, n in snap.copied.items():
                copied.add_metric([direction], n)
            for (event, tenant), n in sorted(snap.policy.items()):
                policy[event].add_metric([str(tenant)], n)
            for (key, values), n in sorted(snap.labeled.items()):
                if key in labeled:
                    labeled[key].add_metric(list(values), n)
            if poller is not None:
                nvml_reads.add_metric([], poller.reads_total)
                nvml_errors.add_metric([], poller.errors_total)
        yield from families


def _log2_histogram(name: str, doc: str, per_bucket: list[int]) -> HistogramMetricFamily:
    """A histogram from counts per log2 bucket of microseconds (ptx_preempt.spread_bucket); the
    sum is estimated from the buckets (the middle of each, the lower bound of the last)."""
    h = HistogramMetricFamily(name, doc)
    cumulative, buckets, total = 0, [], 0.0
    for k, n in enumerate(per_bucket):
        cumulative += n
        bound = pp.bucket_bound_s(k)
        buckets.append((floatToGoString(bound), cumulative))
        low = 0.0 if k == 0 else pp.bucket_bound_s(k - 1)
        total += n * (low if math.isinf(bound) else (low + bound) / 2)
    h.add_metric([], buckets, total)
    return h


class _Server(WSGIServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host name (socket.getfqdn), which can stall for
        # seconds without DNS; the name is not needed here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 10  # a client that stops talking must not hold the (single) serving thread

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("exporter: " + format, *args)


class Exporter:
    """A running /metrics endpoint (see start_exporter)."""

    def __init__(self, server: _Server, thread: threading.Thread, registry: CollectorRegistry):
        self._server = server
        self._thread = thread
        self.registry = registry
        self.host = server.server_name
        self.port: int = server.server_port
        self._stopped = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else (self.host or "127.0.0.1")
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def parse_address(address: str) -> tuple[str, int]:
    """'host:port', '[v6]:port' or ':port' (all interfaces) -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"exporter address must be host:port, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port_number = int(port)
    except ValueError:
        raise ValueError(f"bad port in exporter address {address!r}") from None
    if not 0 <= port_number <= 65535:
        raise ValueError(f"bad port in exporter address {address!r}")
    return host, port_number


def start_exporter(address: str, collector: Collector, process_metrics: bool = True) -> Exporter:
    """Serves Prometheus's text format (and OpenMetrics, gzip, `name[]` filters, as
    prometheus_client's WSGI app negotiates) at /metrics on `address` ('host:port'; port 0 picks a
    free one), from a registry of its own holding `collector` (plus process_* metrics of pilotd
    unless disabled), on a daemon thread named `exporter`. Scrapes are served one at a time."""
    host, port = parse_address(address)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    if process_metrics:
        from prometheus_client import ProcessCollector

        ProcessCollector(registry=registry)
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"pilot exporter: see /metrics\n"]
        return metrics_app(environ, start_response)

    server_class = _Server6 if ":" in host else _Server
    server = server_class((host, port), _QuietHandler)
    server.set_app(app)
    thread = NamedThread(target=server.serve_forever, kwargs={"poll_interval": 0.25},
                         name="exporter", daemon=True)
    thread.start()
    log.info("metrics exporter listening on %s:%d", host or "*", server.server_port)
    return Exporter(server, thread, registry)
