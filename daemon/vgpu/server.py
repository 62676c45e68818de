"""A vGPU proxy thread: it owns one endpoint socket, one non-blocking stream on its GPU, and the
sessions assigned to it. A call is received, executed and answered on this one thread, with no
hand-off; that is what keeps a remoted call close to a native one.

The endpoint is served by daemon/native/vgpu_server.c (ZMTP/3.0 on a UNIX socket, called through cffi
with the GIL released), which spins briefly before it sleeps and reads each peer's uid/gid/pid
from the kernel when it accepts the connection.

Thread roles: `vgpu-N` runs serve(); the router thread talks to it only through its control
pipe (b"R" + session id: release it; b"S": stop). Attach comes from the client itself.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from typing import Any

from pilot.daemon.backends.base import (
    Backend,
    DeviceInfo,
)
from pilot.daemon.ops import handler_table
from pilot.daemon.ops.ipc import session_ends as ipc_session_ends
from pilot.daemon.protocol import ffi, lib, op_names
from pilot.daemon.resources.broker import ResourceBroker
from pilot.daemon.scheduling.launch import KernelWatch
from pilot.daemon.scheduling.policy_host import PolicyHost
from pilot.daemon.scheduling.priority import GATE_WAKE_MS, PriorityBoard, SessionGate
from pilot.daemon.scheduling.waiting import WaitQueue
from pilot.daemon.sessions.quarantine import Quarantine
from pilot.daemon.sessions.session import Session
from pilot.daemon.sessions.staging import StagingSpares
from pilot.daemon.telemetry.thread_names import NamedThread
from pilot.daemon.vgpu.dispatch import Dispatch, _Prepared
from pilot.daemon.vgpu.fast import FastLaunches

log = logging.getLogger("pilot.vgpu")

STREAM_NON_BLOCKING = 1
BATCH = 256  # messages taken per wake-up
WAKE_MS = 10  # how often a vGPU with waiting launches or watched kernels looks again
CONTROL = struct.Struct("<cQ")  # command, session id


class VGpu(Dispatch):
    def __init__(self, index: int, device: int, backend: Backend, endpoint_path: str,
                 broker: ResourceBroker, spin_us: int = 50, gpu: int | None = None) -> None:
        self.index = index
        self.device = device  # the backend's device number
        self.gpu = device if gpu is None else gpu  # the GPU's index on the host (nvidia-smi)
        self.backend = backend
        self.endpoint_path = endpoint_path
        self.spin_us = spin_us
        self.broker = broker
        self.metrics = broker.metrics
        self.topology: Any = None  # devices.Topology of the daemon's GPUs (set by the Daemon)
        self.policy: PolicyHost | None = None  # set by the Daemon
        self.waits = WaitQueue(self)  # launches the policy made wait (scheduling/waiting.py)
        self.kernel_watch = KernelWatch(self)  # kernel ends, for policies that ask
        # priority gating (scheduling/priority.py); the Daemon gives it the daemon's board
        self.gate = SessionGate(self, PriorityBoard(None, []))
        self.kernel_time = False  # [metrics] kernel_time: every launch timed (set by the Daemon)
        self.callbacks: Any = None  # callbacks.CallbackHub (set by the Daemon)
        self.report_fault: Any = None  # recovery.FaultMonitor.report (set by the Daemon)
        self.shares: Any = None  # shares.ComputeShares (set by the Daemon; None: no shares)
        self.fast_launch = True  # [daemon] fast_launch (set by the Daemon)
        self.fast: FastLaunches | None = None  # launches run in C (vgpu/fast.py), made in serve
        self.preempt: Any = None  # preempt.VGpuPreemption (set by the Daemon; None: [priority] preempt off)
        self.capturing = False  # ops/graphs.py is capturing a program's graph on this thread
        self.device_output: Any = None  # device_output.DeviceOutput (set by the Daemon)
        # freed memory being zeroed, and zeroed blocks kept while the GPU has room to spare
        # (sessions/quarantine.py)
        budget, key = broker.budget, self.gpu  # the budget is by host GPU, as Session.device
        self.quarantine = Quarantine(backend, lambda: budget.capacity(key) - budget.used(key))
        self.staging_spares: StagingSpares | None = None  # areas pinned ahead (set by the Daemon)
        self._partition: Any = None  # the SM partition current on this thread (dispatch.enter)
        self._info: DeviceInfo | None = None
        self._op_names = op_names()
        self._control_r, self._control_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Shared with the router thread (dict operations are atomic under the GIL).
        self.sessions: dict[int, Session] = {}
        # Owned by the vgpu thread.
        self._by_conn: dict[int, Session] = {}
        self._specs = {op: _Prepared(spec, op) for op, spec in handler_table().items()}
        self.stream: Any = None
        self.um_stream: Any = None  # shadow flushes and fetches (daemon/managed.py)
        self.shard: Any = None  # this thread's metrics counters (set in serve)
        self._srv: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = NamedThread(target=self._run, name=f"vgpu-{index}", daemon=True)

    # ---- called from other threads ----
    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error:
            raise self._error

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def send_control(self, command: bytes, session_id: int = 0) -> None:
        os.write(self._control_w, CONTROL.pack(command, session_id))

    def memory_limits(self, s: Session) -> tuple[int, int]:
        """(free, total) as this session's cudaMemGetInfo sees them (resources/broker.py)."""
        return self.broker.memory_limits(s, self.backend.mem_get_info(self.device)[0])

    def device_info(self) -> DeviceInfo:
        if self._info is None:
            self._info = self.backend.device_info(self.device)
        return self._info

    # ---- the vgpu thread ----
    def _run(self) -> None:
        try:
            self.backend.bind_thread(self.device)
            self.stream = self.backend.stream_create(STREAM_NON_BLOCKING, 0)
            err = ffi.new("char[]", 256)
            srv = lib.pilot_srv_open(self.endpoint_path.encode(), self._control_r, err, 256)
            if srv == ffi.NULL:
                raise OSError(f"vGPU {self.index}: {ffi.string(err).decode()}")
            self._srv = srv
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self.serve()
        finally:
            for session in list(self.sessions.values()):
                self._release(session)
            if self.policy is not None:
                self.policy.run_deferred()
            self.kernel_watch.close()
            self.gate.close()
            self.quarantine.close()
            lib.pilot_srv_set_fast(self._srv, ffi.NULL)
            if self.fast is not None:
                self.fast.close()
            lib.pilot_srv_close(self._srv)
            os.close(self._control_r)
            os.close(self._control_w)

    def serve(self) -> None:
        self.shard = self.metrics.shard()  # this thread's counters, updated inline
        msgs = ffi.new("pilot_srv_msg[]", BATCH)
        control = ffi.new("int *")
        srv, handle = self._srv, self.handle
        waits, watch, quarantine, gate = self.waits, self.kernel_watch, self.quarantine, self.gate
        board = gate.board
        if self.fast_launch:
            self.fast = FastLaunches.create(self)
            if self.fast is not None:
                lib.pilot_srv_set_fast(srv, self.fast.ptr)
        output = self.device_output
        by_conn = self._by_conn
        policy = self.policy
        after_reply = None  # the policy's memory events, run once the call's reply is sent
        if policy is not None and (policy.hears_allocated or policy.hears_freed):
            policy.defer_memory_events()
            after_reply = policy.run_deferred
        while True:
            # Something to look at again (waiting launches, running kernels, memory being
            # zeroed): wake up every tick.
            # Calls held at the priority gate: every GATE_WAKE_MS.
            timeout = GATE_WAKE_MS if gate.held else \
                WAKE_MS if (waits or watch or quarantine or gate.gated) else -1
            n = lib.pilot_srv_wait(srv, timeout, self.spin_us, msgs, BATCH, control)
            if n < 0:
                log.error("vgpu-%d: endpoint failed; stopping", self.index)
                return
            fast = self.fast
            if fast is not None:
                fast.fold()  # what C launched came before these messages
                if output is not None:  # another vGPU may have taken printf output meanwhile
                    fast.output(output.fd, output.taken)
            for i in range(n):
                handle(msgs[i])
                if after_reply is not None:
                    after_reply()
            if fast is not None and n:
                for conn in {msgs[i].conn for i in range(n)}:
                    session = by_conn.get(conn)
                    if session is not None:
                        fast.update(session)
            if watch:
                watch.poll()
            if quarantine:
                quarantine.poll()
            if waits:
                waits.poll()
            if control[0]:
                try:
                    if not self._control():
                        return
                except Exception:  # a release that failed must not take the vGPU down
                    log.exception("vgpu-%d: control command failed", self.index)
            if board.enabled or gate.gated or gate.held:
                gate.poll()
            if after_reply is not None:  # those of held calls served again, releases
                after_reply()

    def _control(self) -> bool:
        """Runs queued control commands; False once told to stop."""
        try:
            data = os.read(self._control_r, CONTROL.size * 64)
        except BlockingIOError:
            return True
        for off in range(0, len(data) - CONTROL.size + 1, CONTROL.size):
            command, session_id = CONTROL.unpack_from(data, off)
            if command == b"S":
                return False
            if command in (b"W", b"P"):  # ask waiting launches again; look at the priority gates
                continue
            session = self.sessions.get(session_id)
            if command == b"R" and session is not None:
                self._release(session)
        return True

    def _release(self, session: Session) -> None:
        if self.sessions.pop(session.id, None) is not None:
            lib.pilot_srv_session_uid(session.creds.uid, -1)
        if self.fast is not None:
            self.fast.forget(session)
        for conn in (session.identity, session.fault_identity):
            if conn is not None:
                self._by_conn.pop(conn, None)
                lib.pilot_srv_disconnect(self._srv, conn)  # a live client sees EOF
        self.waits.drop(session)
        self.gate.forget(session)
        if self.preempt is not None:
            self.preempt.session_ends(session)
        self.kernel_watch.forget(session.id)
        self.enter(session)  # its modules and streams go in the context they were made in
        try:  # what it exported or opened through CUDA IPC (ops/ipc.py)
            ipc_session_ends(self, session)
        except Exception:
            log.exception("vgpu-%d: session %d: IPC release failed", self.index, session.id)
        held = session.held_allocations()
        if self.broker.residency is not None:
            self.broker.residency.quiesce(session)
        session.release(self.backend, self.stream)
        if self.preempt is not None:  # its work is synchronized: its variants and counters go
            self.preempt.forget(session)
        if self.device_output is not None:  # printed after its last reply: pilotd's log
            self.device_output.drain()
            self.device_output.released(session.id)
        self.broker.release_session(session, held)
        if session.partition is not None:
            self.backend.use_partition(self.device, None)  # never destroy the current context
            self._partition = None
            if self.fast is not None:
                self.fast.context(None)
            if self.shares is not None:
                self.shares.release(session)
        if self.policy is not None:
            self.policy.session_ended(session)
        log.info("session %d (pid %d) released", session.id, session.creds.pid,
                 extra={"session": session.id, "tenant": session.tenant})
