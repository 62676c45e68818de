"""The daemon's front door: the main and control ROUTER sockets and the thread that owns them
(`pilot-router`).

It opens sessions (HELLO: the client's uid/gid/pid come from the kernel, SO_PEERCRED read by
the acceptor when it took the connection (acceptor.py), never from the message), places each on
the least busy vGPU of a GPU that is not draining, serves pilotctl's commands (control.py),
watches every client process through a pidfd so that a client that exits or crashes has
everything released within milliseconds, and keeps systemd informed (READY, watchdog,
STOPPING). It also starts the NVML poller and the Prometheus exporter.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import zmq

from pilot import __version__
from pilot.daemon.backends.base import (
    CUDA_ERROR_INITIALIZATION,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_NOT_SUPPORTED,
    Backend,
)
from pilot.daemon.config import Config, spin_limit
from pilot.daemon.protocol import ENVELOPE_SIZE, ffi, lib, new, to_bytes
from pilot.daemon.resources.broker import GpuBudget, ResourceBroker
from pilot.daemon.resources.gpu_access import GpuAccess, within
from pilot.daemon.resources.priorities import PriorityStore
from pilot.daemon.resources.residency import Residency
from pilot.daemon.resources.shares import ComputeShares, ShareStore
from pilot.daemon.resources.tenants import (
    SLURM_TENANT_PREFIX,
    Ledger,
    QuotaStore,
    TenantResolver,
    slurm_job_of,
    unknown_members,
)
from pilot.daemon.router import control, sdnotify
from pilot.daemon.router import mps as mps_control
from pilot.daemon.router.acceptor import Acceptor
from pilot.daemon.router.admission import (
    Admission,
    EndpointRefusals,
    connection_budget,
    raise_nofile,
    read_endpoint_refusals,
)
from pilot.daemon.router.fault_backoff import backoff_wait
from pilot.daemon.router.isolation import EngineError, Engines, IsolationList, confinement
from pilot.daemon.router.mps import MpsControl
from pilot.daemon.router.recovery import (
    FAULT_GRACE,
    Fault,
    FaultMonitor,
    Handover,
    read_engine_faults,
    record_engine_fault,
    repeat_suspects,
)
from pilot.daemon.scheduling.callbacks import CallbackHub
from pilot.daemon.scheduling.placement import place_part, place_session
from pilot.daemon.scheduling.policy_host import PolicyHost, load_policy
from pilot.daemon.scheduling.preempt import Preemption, VGpuPreemption
from pilot.daemon.scheduling.priority import PriorityBoard
from pilot.daemon.sessions import visible
from pilot.daemon.sessions.devices import SessionGroup, Topology
from pilot.daemon.sessions.session import Credentials, Session, process_start_time, read_cmdline
from pilot.daemon.sessions.staging import StagingSpares
from pilot.daemon.telemetry.logs import setup_logging
from pilot.daemon.telemetry.metrics import Metrics, PilotCollector, start_exporter
from pilot.daemon.telemetry.nvml import NvmlPoller, NvmlSource, NvmlUnavailable, SimSource
from pilot.daemon.telemetry.thread_names import name_this_thread
from pilot.daemon.vgpu.device_output import DeviceOutput
from pilot.daemon.vgpu.endpoint_spin import EndpointSpin
from pilot.daemon.vgpu.server import VGpu
from pilot.policies import Policy

CUDA_ERROR_DEVICES_UNAVAILABLE = 46

log = logging.getLogger("pilot.server")

POLL_MS = 200
LISTEN_BACKLOG = 512  # programs that connect while pilotd restarts after a fault wait here
EXIT_FAULT = 3  # pilotd's exit status after a GPU fault with fault_recovery = "exit"


class DaemonError(Exception):
    """A start-up failure worth one clear line (socket in use, no GPU...)."""


@dataclass
class Watched:
    session: Session  # part 0
    vgpu: VGpu
    pidfd: int | None  # None: pidfd_open unavailable, checked by polling /proc
    group: SessionGroup
    others: list[tuple[VGpu, Session]]  # parts on other devices (DEVICE_JOIN)


def _process_uid(pid: int) -> int | None:
    """The real uid of the process `pid` now (None: gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _alive(w: Watched) -> bool:
    """Whether a watched session's process still runs: its pidfd is not readable (or, without
    one, /proc has the pid)."""
    if w.pidfd is None:
        return os.path.exists(f"/proc/{w.session.creds.pid}")
    return not select.select([w.pidfd], [], [], 0)[0]


def untrusted_directory(directory: str) -> str | None:
    """Why pilotd must not serve in `directory` (None: it may): it must be owned by root or by
    pilotd's user and writable by no one else, or another user could have made it first (and
    replace the sockets in it). The shim checks the same (shim/transport/socket_path.c)."""
    st = os.stat(directory)
    if st.st_uid not in (0, os.geteuid()):
        return f"{directory} is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{directory} is writable by other users (mode {st.st_mode & 0o777:03o})"
    return None


def prepare_socket_path(path: str) -> None:
    """Create the socket's directory (refused if another user could have made it first, issue
    27) and remove a stale socket; refuse a live one."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755 if os.geteuid() == 0 else 0o700, exist_ok=True)
    problem = untrusted_directory(directory)
    if problem is not None:
        raise DaemonError(f"will not serve at {path}: {problem}; only root's or pilotd's user's "
                          "own directory, writable by no one else, is safe")
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                raise
            os.unlink(path)  # stale: nobody listens there
        else:
            raise DaemonError(f"another pilotd is already serving {path}")
        finally:
            probe.close()


def _priority_defaults(config: Config) -> dict[str, str]:
    """The named tenants' priority classes in the config ([tenants.X] priority)."""
    return {t.name: t.priority for t in config.tenants.values() if t.priority is not None}


class Daemon:
    def __init__(self, backend: Backend, config: Config, socket_path: str,
                 control_path: str, policy: Policy | None = None, *,
                 handover: Handover | None = None) -> None:
        """`handover`: what the process this one replaces after a GPU fault handed over (its
        listening sockets, faults and session numbering; router/recovery.py)."""
        self.backend = backend
        self.config = config
        self.socket_path = socket_path
        self.control_path = control_path
        self.version = __version__
        self.started = time.time()
        self.ctx = zmq.Context()
        count = backend.device_count()
        if not count:
            raise DaemonError("no GPU to serve")
        # Backend device d is the host's GPU gpus[d] (the backend was opened on config.gpus).
        host_index = list(config.gpus) if config.gpus else list(range(count))
        self.gpus = {host_index[d]: d for d in range(count)}
        capacities = {g: config.capacity_for(g, backend.device_info(d).total_mem)
                      for g, d in self.gpus.items()}
        self.resolver = TenantResolver(config.tenants)
        for line in unknown_members(config.tenants):
            log.warning("config: %s", line)
        self.quotas = QuotaStore(config.state_dir)
        self.gpu_access = GpuAccess(config.state_dir)
        self.shares = ComputeShares(
            ShareStore(config.state_dir, {t.name: t.sm_share for t in config.tenants.values()
                                          if t.sm_share is not None}), backend, self.gpus)
        self.ledger = Ledger()
        self.metrics = Metrics()
        policy = policy if policy is not None else load_policy(config)
        physical = {g: backend.device_info(d).total_mem for g, d in self.gpus.items()}
        movable = frozenset({"managed", "device"} if config.managed_device_memory else {"managed"})
        managed_limits = ({g: config.managed_limit or physical[g] for g in self.gpus}
                          if config.enforce_capacity else None)
        self.broker = ResourceBroker(self.quotas, self.ledger, GpuBudget(capacities), self.metrics,
                                     config.pinned_limit, config.pinned_limit_per_tenant,
                                     movable, managed_limits, config.pinned_tenant_fraction)
        if config.enforce_capacity or policy.moves_memory:
            self.broker.residency = Residency(backend, self.broker.budget, self.metrics, self.gpus,
                                              config.enforce_capacity)
        elif config.managed_device_memory:
            log.warning("managed_device_memory has no effect without enforce_capacity or a policy "
                        "that moves memory; cudaMalloc is served with device memory")
            self.broker.movable = frozenset({"managed"})
        lib.pilot_spin_set_limit(spin_limit(config.spinners))  # every vGPU thread draws on it
        self.vgpus = [
            VGpu(i, d, backend, f"{socket_path}.vgpu{i}", self.broker, config.spin_us, gpu=g)
            for i, (g, d) in enumerate((g, d) for g, d in self.gpus.items()
                                       for _ in range(config.vgpus_per_gpu))
        ]
        self.max_vgpus_per_gpu = max(config.max_vgpus_per_gpu, config.vgpus_per_gpu)
        # whether the vGPU threads spin for calls (vgpu/endpoint_spin.py): the router's loop asks
        self.endpoint_spin = EndpointSpin(config.endpoint_spin, lambda: (
            s for vg in list(self.vgpus) for s in list(vg.sessions.values())))
        # priority classes (resources/priorities.py) and their gate (scheduling/priority.py)
        chaos = config.priority_preempt_chaos
        self.priorities = PriorityBoard(PriorityStore(config.state_dir, _priority_defaults(config)),
                                        self.vgpus, config.priority_active_window,
                                        config.priority_gated_inflight, force=chaos > 0)
        self.preemption = Preemption(config.priority_preempt_chunk,
                                     os.path.join(config.state_dir, "ptx-cache"),
                                     compile_ptx=self.backend.name != "sim", chaos=chaos,
                                     loop_tenants=frozenset(t.name for t in config.tenants.values()
                                                            if t.loop_preempt),
                                     loop_programs=frozenset(config.priority_loop_preempt_programs),
                                     parts=config.priority_preempt_parts) \
            if config.priority_preempt or chaos > 0 else None
        if chaos > 0:
            log.warning("[priority] preempt_chaos = %g s: every session below high runs gated, "
                        "its kernels preempted at random moments (a test setting)", chaos)
        self.policy = PolicyHost(policy, self.metrics, config.policy_max_wait)
        self.policy.controls.broker = self.broker
        self.policy.controls.vgpus = self.vgpus
        if self.preemption is not None and policy.preempts_kernels:  # Controls.preempt cuts kernels
            self.policy.controls.preempts = self.preemption.for_policy = True
        elif policy.preempts_kernels:
            log.info("policy %s preempts kernels only with [priority] preempt = true; until then "
                     "its preemptions only hold launches", policy.name)
        self.policy.wake = self._wake_waiting
        self.broker.policy = self.policy
        # kernels' printf output, captured from the driver's stdout (vgpu/device_output.py)
        self.device_output: DeviceOutput | None = None
        if config.device_output:
            try:
                self.device_output = DeviceOutput()
            except OSError as exc:  # no stdout to keep (fd 1 closed), no memfd: not captured
                log.warning("kernels' printf output is not captured (it stays on pilotd's "
                            "stdout): %s", exc)
        # staging areas pinned ahead of the sessions that ask (sessions/staging.py)
        self.staging_spares = StagingSpares(backend, per_kind=config.staging_spares)
        self.topology = self._topology()
        self.callbacks = CallbackHub(f"{socket_path}.callbacks", backend, config.callback_timeout,
                                     config.callback_hold_total)
        self._ends: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()  # from other threads
        self.callbacks.on_overdue = lambda sid, why: self._ends.put((sid, why))
        self.draining: set[int] = set()
        self.reread_config: Callable[[], Config] | None = None  # set by main: SIGHUP re-reads
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._nvml: NvmlPoller | None = None
        self._exporter: Any = None
        # Owned by the router thread.
        self._watched: dict[int, Watched] = {}
        # GPU faults (router/recovery.py): this process's and those of the processes before it.
        handover = handover or Handover()
        self.faults: list[Fault] = list(handover.faults)
        self._inherited = dict(handover.fds)
        self._next_session = handover.next_session
        self._listeners: dict[str, int] = {}  # name -> listening descriptor (libzmq owns it)
        # connections to the main and control sockets (router/admission.py); limits set in run()
        self.admission = Admission(config.connections, config.connections_per_uid)
        self.endpoint_refusals = EndpointRefusals(read_endpoint_refusals)  # the router's loop logs them
        self.acceptor = Acceptor(self.admission)  # takes their connections before libzmq
        self.restart: Callable[[Handover], None] | None = None  # set by main: exec_afresh
        self.mps: MpsControl | None = None  # set by main: pilotd's MPS control daemon (router/mps.py)
        self.exit_status = 0
        self._fault_wake_r, self._fault_wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.monitor = FaultMonitor(backend, self.gpus, config.fault_poll_interval,
                                    self._fault_noticed)
        for vg in self.vgpus:
            self._equip(vg)
        # Isolation (router/isolation.py): tenants served by a pilotd of their own
        self.isolation = IsolationList(config.state_dir, config.isolation_tenants)
        self.backoff_cleared: dict[str, float] = {}  # tenant -> when an operator forgave its faults
        self._backoff_logged: dict[str, float] = {}
        self.engines = Engines(socket_path, self.broker.budget, sorted(self.gpus),
                               config.isolation_capacity, mps=config.isolation_mps,
                               without_mps=self.isolation.without_mps)
        # under MPS a fault's culprit is named by the MPS server's log, after what it held now
        self._mps_log_dir = os.environ.get(mps_control.LOG_ENV, "") if config.isolation_mps else ""
        self._mps_log_offset = mps_control.server_log_size(self._mps_log_dir) if self._mps_log_dir else 0
        self.engines.adopt(handover.engines)
        self._idle_since = time.monotonic()

    def _equip(self, vg: VGpu) -> None:
        """What the daemon gives each vGPU, those started with it and those added later."""
        config = self.config
        vg.policy, vg.topology, vg.callbacks = self.policy, self.topology, self.callbacks
        vg.kernel_time = config.metrics_kernel_time
        vg.fast_launch = config.fast_launch
        vg.device_output = self.device_output
        vg.report_fault = self.monitor.report
        vg.shares = self.shares
        vg.gate.board = self.priorities
        vg.preempt = VGpuPreemption(vg, self.preemption) if self.preemption is not None else None
        vg.staging_spares = self.staging_spares

    def _topology(self) -> Topology:
        """The GPUs in host order, as programs number them (relative to their first GPU)."""
        order = sorted(self.gpus)
        devices = [self.gpus[g] for g in order]
        backend = self.backend
        infos = [backend.device_info(d) for d in devices]
        # Every GPU of the host, where the backend can tell: CUDA_DEVICE_ORDER=PCI_BUS_ID
        # indices count the GPUs pilotd does not serve too.
        host_bus_ids = getattr(backend, "host_pci_bus_ids", None)
        topo = Topology(gpus=order, devices=devices, infos=infos,
                        peers=[[p == q or backend.can_access_peer(p, q) for q in devices]
                               for p in devices],
                        ids=visible.identities(order, infos, host_bus_ids() if host_bus_ids else None))
        topo.vgpus = [[v for v in self.vgpus if v.gpu == g] for g in order]
        return topo

    def _grow(self, gpu: int) -> VGpu | None:
        """A new vGPU thread on `gpu` (router thread), or None at the maximum or if it cannot
        start (then the session shares a vGPU)."""
        position = self.topology.position(gpu)
        if len(self.topology.vgpus[position]) >= self.max_vgpus_per_gpu:
            return None
        index = len(self.vgpus)
        vg = VGpu(index, self.gpus[gpu], self.backend, f"{self.socket_path}.vgpu{index}", self.broker,
                  self.config.spin_us, gpu=gpu)
        self._equip(vg)
        try:
            prepare_socket_path(vg.endpoint_path)
            vg.start()
            os.chmod(vg.endpoint_path, 0o666)  # access is decided by peer credentials
        except (OSError, DaemonError, Exception) as exc:
            log.warning("router: cannot start vGPU %d on GPU %d (%s); sessions share", index, gpu, exc)
            return None
        self.vgpus.append(vg)
        self.topology.vgpus[position].append(vg)
        log.info("vGPU %d started on GPU %d (%d there)", index, gpu, len(self.topology.vgpus[position]))
        return vg

    def _wake_waiting(self) -> None:
        """The policy host saw something change: vGPUs with waiting launches ask again."""
        for vg in self.vgpus:
            if vg.waits:
                try:
                    vg.send_control(b"W")
                except BlockingIOError:  # the pipe is full of wake-ups already
                    pass

    def request_reload(self) -> None:
        """SIGHUP (signal handler): the router re-reads what can change while running."""
        self._reload.set()

    # Settings SIGHUP applies to the running daemon; every other one applies at the next start.
    LIVE_SETTINGS = ("log_level", "log_format", "policy_max_wait", "callback_timeout",
                     "callback_hold_total", "switch_interval")

    def _reload_now(self) -> None:
        """SIGHUP: quotas.json again, and the config file (with the command line's overrides):
        the LIVE_SETTINGS that changed are applied; any other change is named in the log as
        waiting for a restart. A config that does not load changes nothing (logged)."""
        self._reload.clear()
        self.quotas.reload()
        self.isolation.reload()
        self.shares.store.reload()
        self.priorities.store.reload()  # type: ignore[union-attr]
        self.gpu_access.reload()
        log.info("SIGHUP: quotas, isolation marks, shares, priorities and GPU allow-lists re-read "
                 "from %s",
                 self.config.state_dir)
        if self.reread_config is None:
            self.priorities.refresh()
            return
        try:
            new = self.reread_config()
        except Exception as exc:  # ConfigError and any surprise: keep what runs
            log.error("SIGHUP: the configuration does not load, nothing changed: %s", exc)
            return
        for line in unknown_members(new.tenants):
            log.warning("SIGHUP: config: %s", line)
        # the tenants' priority classes apply at once (the rest of [tenants] at the next start)
        self.priorities.store.defaults = _priority_defaults(new)  # type: ignore[union-attr]
        self.priorities.refresh()
        old = self.config
        changed = [f.name for f in fields(Config) if getattr(old, f.name) != getattr(new, f.name)]
        live = [k for k in changed if k in self.LIVE_SETTINGS]
        if "log_level" in live or "log_format" in live:
            setup_logging(new.log_level, new.log_format)
        if "policy_max_wait" in live:
            self.policy.max_wait = new.policy_max_wait
        if "callback_timeout" in live:
            self.callbacks.timeout = new.callback_timeout
        if "callback_hold_total" in live:
            self.callbacks.hold_total = new.callback_hold_total
        if "switch_interval" in live:
            sys.setswitchinterval(new.switch_interval)
        # the applied values become the daemon's; the others keep theirs until a restart
        self.config = replace(old, **{k: getattr(new, k) for k in live})
        if live:
            log.info("SIGHUP: applied %s", ", ".join(f"{k} = {getattr(new, k)!r}" for k in live))
        rest = [k for k in changed if k not in self.LIVE_SETTINGS]
        if rest:
            log.warning("SIGHUP: %s changed; that applies at the next start", ", ".join(rest))

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Bind everything, then serve on the calling thread until request_stop()."""
        threading.current_thread().name = "pilot-router"
        name_this_thread("pilot-router")
        self._set_connection_limits()
        for path in (self.callbacks.endpoint_path, *(vg.endpoint_path for vg in self.vgpus)):
            prepare_socket_path(path)
        router = self._listen("main", self.socket_path)
        control_sock = self._listen("control", self.control_path)
        self.acceptor.start()
        try:
            for vg in self.vgpus:
                vg.start()
                os.chmod(vg.endpoint_path, 0o666)  # access is decided by peer credentials
            self.callbacks.start()
            os.chmod(self.callbacks.endpoint_path, 0o666)
            os.chmod(self.socket_path, 0o666)
            os.chmod(self.control_path, 0o666)  # changes are checked against the caller's uid
            self._start_nvml()
            self._start_exporter()
            if self._nvml is not None:
                self.policy.readings = self._nvml.latest
            self.policy.start()
            self.monitor.start()
            log.info("pilotd ready on %s with %d vGPU(s) on GPU(s) %s, backend %s%s", self.socket_path,
                     len(self.vgpus), sorted(self.gpus), self.backend.name,
                     f" (isolated: serves tenant {self.config.isolated_tenant} alone)"
                     if self.config.isolated_tenant else "")
            self._note_recovered()
            sdnotify.notify("READY=1", f"STATUS=serving {len(self.vgpus)} vGPU(s) on {self.socket_path}")
            self._serve(router, control_sock)
            if self.monitor.fired:
                self._after_fault()
        finally:
            sdnotify.notify("STOPPING=1")
            self._shutdown(router, control_sock)

    def _set_connection_limits(self) -> None:
        """[limits] connections, within the descriptors pilotd may open (never EMFILE: libzmq
        aborts on it), for the main and control sockets (admission.py) and the endpoint servers (C)."""
        nofile = raise_nofile()
        sessions = self.config.sessions_per_uid * 16  # pidfds: room for 16 users' worth
        total = connection_budget(self.config.connections, sessions, nofile)
        if total < self.config.connections:
            log.warning("[limits] connections = %d lowered to %d: pilotd may open %d descriptors "
                        "(LimitNOFILE)", self.config.connections, total, nofile)
        self.admission.total = total
        self.admission.per_uid = min(self.config.connections_per_uid, total)
        lib.pilot_srv_set_limits(total, self.admission.per_uid)

    def _listen(self, name: str, path: str) -> zmq.Socket:
        """A ROUTER socket on a listening UNIX socket of pilotd's own (a new one, or the one the
        process before this one handed over): pilotd keeps it across a restart after a GPU fault
        (router/recovery.py), so that programs connecting meanwhile wait instead of failing."""
        fd = self._inherited.pop(name, None)
        if fd is not None:
            listener = socket.socket(fileno=fd)
        else:
            prepare_socket_path(path)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(LISTEN_BACKLOG)
        fd = listener.detach()
        self._listeners[name] = fd
        # pilotd's acceptor takes the connections (router/acceptor.py); libzmq gets only those
        # it admitted, on a private socket
        private_fd, endpoint = self.acceptor.listen(fd)
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.USE_FD, private_fd)  # libzmq closes it with the socket
        # every message on these sockets is small (HELLO, a pilotctl command): a larger frame
        # closes the connection before libzmq buffers it
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_frame)
        sock.bind(endpoint)
        return sock

    # ---- GPU faults (router/recovery.py) ----

    def _fault_noticed(self, gpu: int, error: int, via: str) -> None:
        """The first context-fatal fault (any thread): name the suspects, count, wake the router."""
        fault = Fault(gpu=gpu, error=error, detected=time.time(), via=via,
                      suspects=self._fault_suspects(gpu))
        # under MPS every client gets the error: the MPS server's log tells whose it was
        # (_mps_attribute, in the router thread before the restart)
        fault.known = len(fault.suspects) == 1 and not self._mps_log_dir
        self.faults.append(fault)
        # the pilotd that started this engine exports it (under MPS once the MPS server's log
        # said whose it was: _mps_attribute)
        if self.config.isolated_tenant and not self._mps_log_dir:
            record_engine_fault(self.config.state_dir, fault, self.config.isolated_tenant)
        if self.config.isolation_after_fault and not self.config.isolated_tenant \
                and not self._mps_log_dir:
            for tenant, why in repeat_suspects(self.faults).items():
                self._mark_isolated(tenant, why, False)
        who = ", ".join(f"session {s['session']} (tenant {s['tenant']}, pid {s['pid']}: "
                        f"{s['cmdline'][:80]})" for s in fault.suspects) or "no session had work in flight"
        log.error("GPU %d: context-fatal fault %s (%d), seen by a %s; %s %s. Every session on it "
                  "gets this error; pilotd restarts (fault_recovery = %s)", gpu, fault.name, error,
                  "call" if via == "call" else "fault watch",
                  "the faulting work is" if fault.known else "work in flight:", who,
                  self.config.fault_recovery)
        with contextlib.suppress(OSError):
            os.write(self._fault_wake_w, b"F")

    def _mps_attribute(self, fault: Fault) -> None:
        """Under MPS (router thread, after the fault was noticed and before the restart): the
        clients whose fault the MPS server logged. The server tears every client down, so this
        process's sessions with work in flight are suspects only when it is among them, else
        bystanders. The top pilotd marks the culprits' tenants to run without MPS."""
        culprits = mps_control.faulting_clients(self._mps_log_dir, self._mps_log_offset)
        mine = os.getpid() in culprits
        if not culprits:
            log.warning("GPU %d: the MPS server's log (%s) names no client with a fatal GPU error: "
                        "the fault is nobody's (no tenant marked)", fault.gpu,
                        os.path.join(self._mps_log_dir, mps_control.SERVER_LOG))
        elif not mine:
            log.warning("GPU %d: MPS client pid %s faulted (the MPS server's log), not this process: "
                        "the MPS server tore down every client; this process's sessions with work "
                        "in flight are bystanders: %s", fault.gpu,
                        ", ".join(f"{p} (tenant {self.engines.tenant_of(p) or '?'})" for p in culprits),
                        ", ".join(f"session {s['session']} (tenant {s['tenant']})"
                                  for s in fault.suspects) or "none")
        else:
            fault.known = len(fault.suspects) == 1
            log.error("GPU %d: the fault was this process's (pid %d in the MPS server's log)%s",
                      fault.gpu, os.getpid(), ": the faulting work is session "
                      f"{fault.suspects[0]['session']} (tenant {fault.suspects[0]['tenant']})"
                      if fault.known else "")
        if not mine:
            fault.suspects = []
            fault.bystander = bool(culprits)
            fault.culprit = ",".join(sorted({t for p in culprits
                                             if (t := self.engines.tenant_of(p)) is not None}))
        if self.config.isolated_tenant:  # the pilotd that started this engine exports it
            record_engine_fault(self.config.state_dir, fault, self.config.isolated_tenant)
        if not self.config.isolation_after_fault or self.config.isolated_tenant:
            return
        if mine:
            for tenant, why in repeat_suspects(self.faults).items():
                self._mark_isolated(tenant, why, True)
        for pid in culprits:
            self._mark_mps_culprit(pid, fault)

    def _mark_isolated(self, tenant: str, why: str, under_mps: bool) -> None:
        try:  # a fault under MPS tore down every client: its tenant leaves MPS
            self.isolation.mark(tenant, why, mps=False if under_mps else None)
        except OSError as exc:
            log.error("cannot mark tenant %s isolated: %s", tenant, exc)

    def _mark_mps_culprit(self, pid: int, fault: Fault) -> None:
        """MPS client `pid` faulted: the tenant of the engine with that pid leaves MPS."""
        if pid == os.getpid():
            return  # this process's own: its suspects decided (repeat_suspects)
        tenant = self.engines.tenant_of(pid)
        if tenant is None:
            log.warning("GPU %d: the faulting MPS client pid %d is no engine of this pilotd: no "
                        "tenant marked", fault.gpu, pid)
            return
        log.error("tenant %s's kernel faulted under MPS (pid %d, from the MPS server's log): its "
                  "programs run in an engine without MPS from now on (time-sliced, its faults its "
                  "own)", tenant, pid, extra={"tenant": tenant})
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(fault.detected))
        self._mark_isolated(tenant, f"its kernel faulted under MPS ({fault.name}) at {when}: "
                                    f"pid {pid} in the MPS server's log", True)

    def _fault_suspects(self, gpu: int) -> list[dict[str, Any]]:
        """Sessions on `gpu` that launched kernels since their last synchronizing call: the
        work that may have faulted."""
        found = []
        for w in list(self._watched.values()):
            for part in list(w.group.parts.values()):
                if part.device == gpu and part.work_in_flight:
                    found.append({"session": w.session.id, "tenant": part.tenant,
                                  "pid": part.creds.pid, "cmdline": part.cmdline})
                    break
        return found

    def _after_fault(self) -> None:
        """Calls in flight get the fault's error for FAULT_GRACE, then pilotd starts afresh in
        place (does not return), or stops with EXIT_FAULT."""
        fault = self.faults[-1]
        if self._mps_log_dir:
            self._mps_attribute(fault)
        sdnotify.notify(f"STATUS=GPU {fault.gpu} faulted ({fault.name}); restarting")
        time.sleep(FAULT_GRACE)
        for w in list(self._watched.values()):  # their files would outlive this process
            for part in list(w.group.parts.values()):
                for staging in (part.staging, part.fault_staging):
                    path = getattr(staging, "path", None)
                    if path:
                        with contextlib.suppress(OSError):
                            os.unlink(path)
        if self.restart is not None and self.config.fault_recovery == "restart":
            log.info("restarting in place %.3f s after the fault was noticed", time.time() - fault.detected)
            if self.device_output is not None:  # the new process captures afresh
                self.device_output.restore()
            self.restart(Handover(fds=dict(self._listeners), faults=self.faults,
                                  next_session=self._next_session,
                                  engines=self.engines.handover()))
        self.exit_status = EXIT_FAULT

    def _note_recovered(self) -> None:
        if self.faults and self.faults[-1].restarted is None:
            fault = self.faults[-1]
            fault.restarted = time.time()
            log.warning("recovered from the GPU %d fault (%s) of %s: serving again %.2f s after it "
                        "was noticed", fault.gpu, fault.name,
                        time.strftime("%H:%M:%S", time.localtime(fault.detected)),
                        fault.restarted - fault.detected)

    def _start_nvml(self) -> None:
        if self.backend.name == "sim":
            budget = self.broker.budget
            source: Any = SimSource(total=budget.capacity(min(self.gpus)), used=budget.used)
        else:
            try:
                # NVML numbers GPUs in PCI order, CUDA its own way: find each by PCI bus id
                source = NvmlSource(bus_ids={g: i.pci_bus_id for g, i in
                                             zip(self.topology.gpus, self.topology.ids, strict=True)})
            except NvmlUnavailable as exc:
                log.warning("NVML unavailable (%s): no GPU readings", exc)
                return
        self._nvml = NvmlPoller(source, sorted(self.gpus), self.config.nvml_poll_interval)
        self._nvml.start()

    def _start_exporter(self) -> None:
        if not self.config.metrics_address:
            return
        try:
            self._exporter = start_exporter(self.config.metrics_address,
                                            PilotCollector(self.metrics, self.snapshot, self._nvml,
                                                           self.config.metrics_tenant_labels))
        except (OSError, ValueError) as exc:  # a port taken is a mistake to fix, not to hide
            raise DaemonError(f"metrics: cannot listen on {self.config.metrics_address} ({exc}); "
                              "choose another [metrics] address (--metrics-address), or \"\" to "
                              "run without metrics") from None
        log.info("metrics on http://%s/metrics", self.config.metrics_address)

    def _serve(self, router: zmq.Socket, control_sock: zmq.Socket) -> None:
        interval = sdnotify.watchdog_interval()
        watchdog = sdnotify.Watchdog(interval) if interval else None
        while not self._stop.is_set():
            poller = zmq.Poller()
            poller.register(router, zmq.POLLIN)
            poller.register(control_sock, zmq.POLLIN)
            poller.register(self._fault_wake_r, zmq.POLLIN)
            by_fd: dict[int, int] = {}
            for sid, w in self._watched.items():
                if w.pidfd is not None:
                    poller.register(w.pidfd, zmq.POLLIN)
                    by_fd[w.pidfd] = sid
            ready = dict(poller.poll(POLL_MS))
            if self.monitor.fired:  # no new session on a GPU that cannot serve it: restart
                return
            if watchdog is not None:
                watchdog.maybe_ping()
            self.endpoint_refusals.check()
            self.endpoint_spin.check()
            self.engines.reap()
            if self._idle_too_long():
                log.info("isolated pilotd of %s: no session for %.0f s; stopping",
                         self.config.isolated_tenant, self.config.isolation_idle_exit)
                return
            if self._reload.is_set():
                try:
                    self._reload_now()
                except Exception:
                    log.exception("router: reload failed; the current quotas stay")
            try:
                for fd, sid in by_fd.items():
                    if fd in ready:
                        self.end_session(sid, "process exited")
                while not self._ends.empty():  # asked by other threads (the callback hub)
                    self.end_session(*self._ends.get_nowait())
                self._reap_without_pidfd()
            except Exception:  # the front door stays open whatever one session does
                log.exception("router: session reaping failed")
            for sock, handle in ((router, self._handle), (control_sock, self._handle_control)):
                if sock not in ready:
                    continue
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    try:
                        handle(sock, frames)
                    except Exception:
                        log.exception("router: request failed; dropped")

    def _idle_too_long(self) -> bool:
        """An isolated tenant's pilotd ends after `[isolation] idle_exit` without a session."""
        if not self.config.isolated_tenant or self._watched:
            self._idle_since = time.monotonic()
            return False
        return time.monotonic() - self._idle_since > self.config.isolation_idle_exit

    def _reap_without_pidfd(self) -> None:
        for sid, w in list(self._watched.items()):
            if w.pidfd is None and not os.path.exists(f"/proc/{w.session.creds.pid}"):
                self.end_session(sid, "process exited")

    def _handle_control(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        if len(frames) >= 3 and len(frames[1]) == ENVELOPE_SIZE:
            # A program under the shim pointed at this socket (PILOT_SOCKET=control.sock): tell
            # it at once, in its own protocol, instead of letting it wait for its set-up timeout.
            rep = new("pilot_rep_hello")
            rep.hdr.err = CUDA_ERROR_NOT_SUPPORTED
            sock.send_multipart([frames[0], frames[1], to_bytes(rep)])
            log.warning("control: a CUDA program connected to the control socket; refused")
            return
        if len(frames) != 2:
            log.warning("control: dropped a malformed message")
            return
        creds = self._creds(frames)
        if creds is None:
            log.warning("control: request of a connection pilotd did not admit refused")
            return
        sock.send_multipart([frames[0], control.handle(self, creds, frames[1].bytes)])

    def _creds(self, frames: list[zmq.Frame]) -> Credentials | None:
        """Who sent the message: the kernel's credentials of its connection, read when pilotd's
        acceptor admitted it (router/acceptor.py); None: gone."""
        peer = self.acceptor.peer(frames[0].bytes)
        return None if peer is None else Credentials(uid=peer.uid, gid=peer.gid, pid=peer.pid)

    def _handle(self, router: zmq.Socket, frames: list[zmq.Frame]) -> None:
        if len(frames) < 2 or len(frames[1]) < ENVELOPE_SIZE:
            log.warning("router: dropped a malformed message")
            return
        env = ffi.from_buffer("pilot_envelope *", frames[1].buffer)
        if env.flags & lib.PILOT_F_NO_REPLY:
            return
        if env.opcode == lib.PILOT_OP_HELLO:
            body = self._hello(frames)
            router.send_multipart([frames[0], frames[1], body])
        elif env.opcode == lib.PILOT_OP_DEVICE_JOIN:
            router.send_multipart([frames[0], frames[1], self._join(frames, env.session)])
        elif env.opcode == lib.PILOT_OP_PING:  # a client waiting long on a call: alive
            router.send_multipart([frames[0], frames[1], to_bytes(new("pilot_rep_status"))])
        elif env.opcode == lib.PILOT_OP_SESSIONS:
            rep = new("pilot_rep_status")
            listing = json.dumps(self._sessions_for(frames)).encode()
            router.send_multipart([frames[0], frames[1], to_bytes(rep), listing])
        else:
            rep = new("pilot_rep_status")
            rep.hdr.err = CUDA_ERROR_NOT_SUPPORTED
            router.send_multipart([frames[0], frames[1], to_bytes(rep)])

    def _sessions_for(self, frames: list[zmq.Frame]) -> list[dict[str, Any]]:
        """`pilot sessions`: every session for root and the admin group, the caller's tenant's
        otherwise (pids, command lines and memory of other tenants are theirs), none without
        credentials."""
        creds = self._creds(frames)
        if creds is None:
            return []
        rows = self.session_summaries()
        if self.resolver.is_admin(creds.uid, creds.gid, self.config.admin_group):
            return rows
        tenant = self.resolver.tenant_of(creds.uid, creds.gid)
        return [r for r in rows if r["tenant"] == tenant]

    def _hello(self, frames: list[zmq.Frame]) -> bytes:
        rep = new("pilot_rep_hello")
        peer = self.acceptor.peer(frames[0].bytes)
        if peer is None:
            log.warning("router: HELLO refused: its connection is gone")
            rep.hdr.err = CUDA_ERROR_INITIALIZATION
            return to_bytes(rep)
        creds = Credentials(uid=peer.uid, gid=peer.gid, pid=peer.pid)
        # Pin the peer's process, then make sure it is the one that sent the HELLO: the start
        # time pilotd read from /proc when its acceptor took the connection (router/acceptor.py)
        # must still be the pid's. If the sender exited and its pid was reused, it must neither
        # get a session nor end the sessions the pid's new process has. What the client says of
        # its start time is not used.
        try:
            pidfd: int | None = os.pidfd_open(creds.pid)
        except (AttributeError, OSError):
            pidfd = None
        actual = process_start_time(creds.pid)  # after pidfd_open: of the process it pins
        # the process now holding the pid must at least be the sender's user (another user's
        # process never lends its pid)
        if peer.start_time is None or actual != peer.start_time or _process_uid(creds.pid) != creds.uid:
            log.warning("router: HELLO from pid %d uid %d refused: that pid is now another process "
                        "(started at tick %s, the sender at %s): the sender exited and its pid was "
                        "reused", creds.pid, creds.uid, actual, peer.start_time)
            if pidfd is not None:
                os.close(pidfd)
            rep.hdr.err = CUDA_ERROR_INITIALIZATION
            return to_bytes(rep)
        req = self._hello_request(frames)
        reply = self._hello_session(req, creds, rep, pidfd)
        if pidfd is not None and not any(w.pidfd == pidfd for w in self._watched.values()):
            os.close(pidfd)  # refused: no session watches it
        return reply

    @staticmethod
    def _hello_request(frames: list[zmq.Frame]) -> Any:
        """The HELLO's pilot_req_hello, zero-filled where its frame is short or missing."""
        req = ffi.new("pilot_req_hello *")
        if len(frames) >= 3:
            ffi.memmove(req, frames[2].bytes, min(len(frames[2]), ffi.sizeof("pilot_req_hello")))
        return req

    def _hello_session(self, req: Any, creds: Credentials, rep: Any,
                       pidfd: int | None) -> bytes:
        """The rest of HELLO: end what the pid had, place the session (watched through
        `pidfd`). Returns the reply."""
        # A pid that says HELLO again has exec'd a new program: its old session is dead. Only
        # the same user's: a session of another uid under this pid means its process is gone
        # and the pid reused (reap it), or a process that changed its credentials, which must
        # not end (or take over) the session it had.
        for sid, w in list(self._watched.items()):
            if w.session.creds.pid != creds.pid:
                continue
            if w.session.creds.uid == creds.uid:
                self.end_session(sid, "process exec'd")
            elif not _alive(w):
                self.end_session(sid, "process exited")
            else:
                log.warning("router: HELLO from pid %d uid %d refused: the pid holds session %d of "
                            "uid %d", creds.pid, creds.uid, sid, w.session.creds.uid)
                rep.hdr.err = CUDA_ERROR_INITIALIZATION
                return to_bytes(rep)
        held = sum(1 for w in self._watched.values() if w.session.creds.uid == creds.uid)
        if creds.uid != 0 and held >= self.config.sessions_per_uid:
            log.warning("router: session of pid %d uid %d refused: the user holds %d sessions "
                        "([limits] sessions_per_uid)", creds.pid, creds.uid, held)
            rep.hdr.err = CUDA_ERROR_DEVICES_UNAVAILABLE
            return to_bytes(rep)
        tenant = self._tenant_of(creds)
        if self.config.isolated_tenant is not None and tenant != self.config.isolated_tenant:
            log.warning("router: HELLO from pid %d (tenant %s) refused: this pilotd serves tenant "
                        "%s alone", creds.pid, tenant, self.config.isolated_tenant)
            rep.hdr.err = CUDA_ERROR_INITIALIZATION
            return to_bytes(rep)
        if self.config.isolated_tenant is None:
            wait, faults = self.fault_backoff(tenant)
            if wait > 0:
                self._refuse_backing_off(tenant, creds, wait, faults)
                rep.hdr.err = CUDA_ERROR_DEVICES_UNAVAILABLE
                return to_bytes(rep)
        if self.config.isolated_tenant is None and self.isolation.isolated(tenant):
            return self._redirect(rep, tenant, creds)
        allowed = self._allowed(tenant)
        if allowed is not None and not allowed:
            log.warning("router: session of pid %d refused: tenant %s may use no GPU (%s)", creds.pid,
                        tenant, "its Slurm job was not registered by the prolog: pilotctl job start"
                        if self.gpu_access.allowed(tenant) is None else "its GPU allow-list is empty",
                        extra={"tenant": tenant})
            rep.hdr.err = CUDA_ERROR_NO_DEVICE
            return to_bytes(rep)
        selected = self._selection(req, allowed)
        if selected is not None and not selected:
            log.info("router: session of pid %d refused: its CUDA_VISIBLE_DEVICES selects no GPU "
                     "%s", creds.pid, "pilotd serves" if allowed is None else "its tenant may use",
                     extra={"tenant": tenant})
            rep.hdr.err = CUDA_ERROR_NO_DEVICE
            return to_bytes(rep)
        admin = self.resolver.is_admin(creds.uid, creds.gid, self.config.admin_group)
        # an admin's sessions (root's, the admin group's) are not held to a share of the vGPUs,
        # as they are not to sessions_per_uid: an operator's many-process job keeps a thread each
        share = 0 if admin else self.config.vgpus_per_tenant or max(2, self.max_vgpus_per_gpu // 4)
        if selected is None:
            pool = self.vgpus if allowed is None else [
                v for v in self.vgpus if self.topology.position(v.gpu) in allowed]
            vg = place_session(pool, self.draining, self._grow, tenant, share)
        else:  # the program's device 0 is the GPU it selected first
            vg = place_session(self.topology.vgpus[selected[0]], self.draining, self._grow, tenant, share)
        if vg is None:
            log.warning("router: session of pid %d refused: %s", creds.pid,
                        "every GPU is draining" if selected is None else
                        f"its device 0 (GPU {self.topology.gpus[selected[0]]}) is draining",
                        extra={"tenant": tenant})
            rep.hdr.err = CUDA_ERROR_DEVICES_UNAVAILABLE
            return to_bytes(rep)
        session = Session(id=self._next_session, creds=creds, vgpu=vg.index, device=vg.gpu,
                          tenant=tenant, cmdline=read_cmdline(creds.pid), admin=admin)
        self.shares.place(session)
        self.priorities.place(session)
        self._next_session += 1
        group = SessionGroup(session, self.topology.position(vg.gpu), self.topology, selected, allowed)
        lib.pilot_srv_session_uid(creds.uid, 1)  # its endpoints accept its uid (before the reply)
        vg.sessions[session.id] = session
        self._watched[session.id] = Watched(session, vg, pidfd, group, [])
        self.callbacks.open_session(session.id, group)
        self.policy.session_started(session)
        log.info("session %d: pid %d uid %d (%s) on vGPU %d (GPU %d); devices: GPUs %s%s",
                 session.id, creds.pid, creds.uid, session.cmdline[:80], vg.index, vg.gpu,
                 ",".join(str(self.topology.gpus[p]) for p in group.positions),
                 "" if selected is None else " (CUDA_VISIBLE_DEVICES)",
                 extra={"session": session.id, "tenant": tenant})
        return self._placed(rep, session, vg, 0)

    def fault_backoff(self, tenant: str, engine_faults: list[dict[str, Any]] | None = None
                      ) -> tuple[float, int]:
        """Seconds `tenant`'s next session must still wait after its engine's recent faults, and
        how many counted (router/fault_backoff.py); `engine_faults`: read_engine_faults's list,
        if the caller has it."""
        if self.config.isolation_fault_backoff <= 0:
            return 0.0, 0
        if engine_faults is None:
            engine_faults = read_engine_faults(self.config.state_dir)
        times = [f["detected"] for f in engine_faults if f["tenant"] == tenant]
        return backoff_wait(times, time.time(), self.config.isolation_fault_backoff,
                            self.config.isolation_fault_backoff_max, self.backoff_cleared.get(tenant, 0.0))

    def backing_off(self, engine_faults: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The tenants whose sessions wait now after their engines' faults (pilotctl status)."""
        now = time.time()
        out = {}
        for tenant in {f["tenant"] for f in engine_faults}:
            wait, faults = self.fault_backoff(tenant, engine_faults)
            if wait > 0:
                out[tenant] = {"faults": faults, "wait_s": round(wait, 1), "until": round(now + wait, 1)}
        return out

    def _refuse_backing_off(self, tenant: str, creds: Credentials, wait: float, faults: int) -> None:
        now = time.monotonic()
        if now - self._backoff_logged.get(tenant, -60.0) >= 10.0:  # at most every 10 s a tenant
            self._backoff_logged[tenant] = now
            log.warning("router: session of pid %d refused: tenant %s's engine faulted %d time(s) in "
                        "the last hour; its programs get the GPU again in %.1f s ([isolation] "
                        "fault_backoff; pilotctl isolate clear %s to forgive)", creds.pid, tenant,
                        faults, wait, tenant, extra={"tenant": tenant})

    def _redirect(self, rep: Any, tenant: str, creds: Credentials) -> bytes:
        """HELLO of an isolated tenant: say it again at its own pilotd (started if need be)."""
        try:
            path = self.engines.socket_for(tenant)
        except EngineError as exc:
            log.error("router: session of pid %d refused: %s", creds.pid, exc, extra={"tenant": tenant})
            rep.hdr.err = CUDA_ERROR_DEVICES_UNAVAILABLE
            return to_bytes(rep)
        rep.hdr.err = lib.PILOT_HELLO_REDIRECT
        encoded = path.encode()
        ffi.memmove(rep.endpoint, encoded, len(encoded))
        log.info("router: pid %d of isolated tenant %s sent to %s", creds.pid, tenant, path,
                 extra={"tenant": tenant})
        return to_bytes(rep)

    def _tenant_of(self, creds: Credentials) -> str:
        """The session's tenant: its Slurm job's with `[slurm] job_tenants` when it runs in one,
        else its user's (or named) tenant."""
        if self.config.slurm_job_tenants:
            job = slurm_job_of(creds.pid)
            if job is not None:
                return SLURM_TENANT_PREFIX + job
        return self.resolver.tenant_of(creds.uid, creds.gid)

    def _allowed(self, tenant: str) -> list[int] | None:
        """The topology positions the tenant may use, in order (None: every GPU; resources/
        gpu_access.py): its allow-list, or none at all for a Slurm job no prolog registered."""
        gpus = self.gpu_access.allowed(tenant)
        if gpus is None:
            unregistered_job = self.config.slurm_job_tenants and tenant.startswith(SLURM_TENANT_PREFIX)
            return [] if unregistered_job else None
        return sorted(self.topology.position(g) for g in gpus if g in self.topology.gpus)

    def _selection(self, req: Any, allowed: list[int] | None) -> list[int] | None:
        """The topology positions a HELLO's CUDA_VISIBLE_DEVICES selects (None: not set), among
        the `allowed` ones as a host with only those GPUs would number them."""
        if not req.flags & lib.PILOT_HELLO_VISIBLE_SET:
            return None
        value = ffi.string(req.visible_devices, lib.PILOT_VISIBLE_MAX).decode(errors="replace")
        pci_order = bool(req.flags & lib.PILOT_HELLO_PCI_BUS_ORDER)
        if allowed is None:
            return visible.select(value, self.topology.ids, pci_order)
        chosen = visible.select(value, within(self.topology.ids, allowed), pci_order) or []
        return [allowed[i] for i in chosen]

    def _placed(self, rep: Any, session: Session, vg: VGpu, ordinal: int) -> bytes:
        rep.session = session.id
        rep.vgpu = vg.index
        rep.device = ordinal
        endpoint = vg.endpoint_path.encode()
        ffi.memmove(rep.endpoint, endpoint, len(endpoint))
        callbacks = self.callbacks.endpoint_path.encode()
        ffi.memmove(rep.callbacks, callbacks, len(callbacks))
        return to_bytes(rep)

    def _join(self, frames: list[zmq.Frame], sid: int) -> bytes:
        """DEVICE_JOIN: the session's part on another of its devices, placed on the least busy
        vGPU of that GPU (a draining GPU too: the session already runs). Only the session's own
        process may ask, and once per device."""
        rep = new("pilot_rep_hello")
        w = self._watched.get(sid)
        creds = self._creds(frames)
        if (w is None or creds is None or len(frames) < 3
                or (creds.pid, creds.uid) != (w.session.creds.pid, w.session.creds.uid)):
            log.warning("router: DEVICE_JOIN for session %d refused", sid)
            rep.hdr.err = CUDA_ERROR_INITIALIZATION
            return to_bytes(rep)
        req = ffi.new("pilot_req_device *")
        ffi.memmove(req, frames[2].bytes, min(len(frames[2]), ffi.sizeof("pilot_req_device")))
        ordinal = req.device
        if not 0 < ordinal < len(w.group) or w.group.part(ordinal) is not None:
            rep.hdr.err = CUDA_ERROR_INVALID_DEVICE
            return to_bytes(rep)
        vg = place_part(self.topology.vgpus[w.group.position(ordinal)], self._grow)
        assert vg is not None  # every GPU has vGPUs
        part = w.group.add_part(ordinal, vg)
        self.shares.place(part)
        self.priorities.place(part)
        lib.pilot_srv_session_uid(creds.uid, 1)  # released on its vGPU like a session
        vg.sessions[part.id] = part
        w.others.append((vg, part))
        self.policy.session_started(part)
        log.info("session %d: device %d on vGPU %d (GPU %d)", sid, ordinal, vg.index, vg.gpu,
                 extra={"session": sid, "tenant": part.tenant})
        return self._placed(rep, part, vg, ordinal)

    def end_session(self, sid: int, why: str) -> bool:
        """Tell the session's vGPU to release it (router thread). False if there is no such."""
        w = self._watched.pop(sid, None)
        if w is None:
            return False
        if w.pidfd is not None:
            os.close(w.pidfd)
        log.info("session %d (pid %d): %s", sid, w.session.creds.pid, why,
                 extra={"session": sid, "tenant": w.session.tenant})
        self.callbacks.close_session(sid)  # first: a vGPU may be waiting behind its gates
        w.vgpu.send_control(b"R", sid)
        for vg, _ in w.others:
            vg.send_control(b"R", sid)
        return True

    def session_summaries(self) -> list[dict[str, Any]]:
        """One row per session, those of isolated tenants' pilotds too (`isolated`); `state` is
        error, waiting (a launch waits for the policy), held, throttled or refused (what the
        policy does to it, `why` says why), or active."""
        rows = [w.group.summary() for w in list(self._watched.values())]
        isolated = self.engines.sessions() if len(self.engines) else []
        here = confinement(self.config)
        res = self.broker.residency
        for row in rows:
            status = self.policy.session_status(row["session"])
            row["why"] = row["waiting"]["reason"] if row.get("waiting") else ""
            if status is not None:
                row["policy"] = {"state": status[0], "why": status[1]}
                if row["state"] == "active":
                    row["state"], row["why"] = status
            if res is not None:
                row["movable_bytes"], row["resident_bytes"] = res.session_bytes(row["session"])
            row["confinement"] = here
        return rows + isolated

    def part_summaries(self) -> list[dict[str, Any]]:
        """One row per device a session uses (metrics count memory per GPU)."""
        return [p.summary() for w in list(self._watched.values()) for p in list(w.group.parts.values())]

    def snapshot(self) -> dict[str, Any]:
        """The daemon's state for pilotctl status and the metrics collector (any thread)."""
        readings = self._nvml.latest() if self._nvml is not None else {}
        budget, res, topo = self.broker.budget, self.broker.residency, self.topology
        engine_faults = [] if self.config.isolated_tenant else read_engine_faults(self.config.state_dir)
        return {
            "sessions": self.part_summaries(),
            "gpus": [{"index": g, "capacity": budget.capacity(g), "used_by_pilot": budget.used(g),
                      "draining": g in self.draining, "reading": readings.get(g),
                      "residency": res.describe(g) if res is not None else None,
                      "name": topo.infos[p].name, "uuid": topo.ids[p].uuid,
                      "pci_bus_id": topo.ids[p].pci_bus_id}
                     for p, g in enumerate(topo.gpus)],
            # The quota in force on each GPU (a quota for every GPU is expanded), so it lines up
            # with the per-GPU memory series.
            "quotas": {t: {str(g): {"hard": q.hard, "provisioned": q.provisioned}
                           for g in sorted(self.gpus)
                           for q in [self.quotas.get(t, g)] if (q.hard, q.provisioned) != (None, None)}
                       for t in self.quotas.list()},
            "vgpus": [{"index": v.index, "gpu": v.gpu, "sessions": len(v.sessions)}
                      for v in self.vgpus],
            "faults": [{**asdict(f), "tenant": f.tenant} for f in self.faults],
            "engine_faults": engine_faults,
            "backing_off": self.backing_off(engine_faults),
            "connections": {"admitted": self.admission.connections(), "refused": self.admission.refused,
                            "limit": self.admission.total, "per_uid": self.admission.per_uid,
                            "endpoint_refused": read_endpoint_refusals()[0]},
            "isolation": {**self.isolation.describe(), "engines": self.engines.describe(),
                          "serves": self.config.isolated_tenant, "mps": self.config.isolation_mps,
                          "confined": self.config.confined,
                          "mps_control": self.mps.describe() if self.mps is not None else None},
            "shares": self.shares.report(),
            # CUDA IPC: exports, grants, and memory kept for importers after its exporter's free
            "ipc": self.broker.ipc.counts(),
            "priorities": self.priorities.describe(),
            "preemption": self.preemption.describe() if self.preemption is not None else None,
            "salus": self.policy.state() if self.policy.name == "salus" else {},
        }

    def _shutdown(self, router: zmq.Socket, control_sock: zmq.Socket) -> None:
        self.monitor.stop()
        self.engines.stop_all()
        self.policy.stop()
        self.callbacks.close_all()  # no vGPU may stay blocked behind a gate
        if self.preemption is not None:
            self.preemption.lower_all()  # nor behind a retreat word
            for vg in self.vgpus:  # a policy's preemptions too
                for s in list(vg.sessions.values()):
                    if s.preemption is not None and vg.preempt is not None:
                        vg.preempt.resume(s)
        for vg in self.vgpus:
            vg.send_control(b"S")
        for vg in self.vgpus:
            vg.join(timeout=10)
        self.callbacks.stop()
        if self.preemption is not None:
            self.preemption.close()
        self.staging_spares.close()
        if self._nvml is not None:
            self._nvml.stop()
        if self._exporter is not None:
            self._exporter.stop()
        for w in self._watched.values():
            if w.pidfd is not None:
                os.close(w.pidfd)
        self.acceptor.stop()
        self.acceptor.close_listeners()  # the public sockets: handed on to no one
        router.close(0)
        control_sock.close(0)
        for fd in (self._fault_wake_r, self._fault_wake_w):
            os.close(fd)
        for path in [self.socket_path, self.control_path, self.callbacks.endpoint_path,
                     *(vg.endpoint_path for vg in self.vgpus)]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.ctx.term()
        log.info("pilotd stopped")
