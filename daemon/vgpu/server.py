"""A vGPU proxy thread: it owns one endpoint socket, one non-blocking stream on its GPU, and the
sessions assigned to it. A call is received, executed and answered on this one thread, with no
hand-off; that is what keeps a remoted call close to a native one.

The endpoint is served by shim/vgpu_server.c (ZMTP/3.0 on a UNIX socket, called through cffi
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
import time
from typing import Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INITIALIZATION,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_UNKNOWN,
    STICKY_ERRORS,
    Backend,
    BackendError,
    DeviceInfo,
)
from pilot.daemon.ops import handler_table
from pilot.daemon.ops.registry import HandlerSpec
from pilot.daemon.protocol import ENVELOPE_SIZE, ProtocolError, ffi, lib, new, op_names
from pilot.daemon.resources.broker import ResourceBroker
from pilot.daemon.scheduling import streams
from pilot.daemon.scheduling.launch import KernelWatch, WaitForPolicy
from pilot.daemon.scheduling.policy_host import PolicyHost
from pilot.daemon.scheduling.waiting import HeldMessage, WaitQueue
from pilot.daemon.sessions.session import Credentials, Session

log = logging.getLogger("pilot.vgpu")

STREAM_NON_BLOCKING = 1
BATCH = 256  # messages taken per wake-up
WAKE_MS = 10  # how often a vGPU with waiting launches or watched kernels looks again
CONTROL = struct.Struct("<cQ")  # command, session id


class VGpu:
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
        self.callbacks: Any = None  # callbacks.CallbackHub (set by the Daemon)
        self._info: DeviceInfo | None = None
        self._op_names = op_names()
        self._control_r, self._control_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Shared with the router thread (dict operations are atomic under the GIL).
        self.sessions: dict[int, Session] = {}
        # Owned by the vgpu thread.
        self._by_conn: dict[int, Session] = {}
        self._specs = {op: _Prepared(spec) for op, spec in handler_table().items()}
        self.stream: Any = None
        self.um_stream: Any = None  # shadow flushes and fetches (daemon/managed.py)
        self.shard: Any = None  # this thread's metrics counters (set in serve)
        self._srv: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"vgpu-{index}", daemon=True)

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
            self.kernel_watch.close()
            lib.pilot_srv_close(self._srv)
            os.close(self._control_r)
            os.close(self._control_w)

    def serve(self) -> None:
        self.shard = self.metrics.shard()  # this thread's counters, updated inline
        msgs = ffi.new("pilot_srv_msg[]", BATCH)
        control = ffi.new("int *")
        srv, handle = self._srv, self.handle
        waits, watch = self.waits, self.kernel_watch
        while True:
            # Something to look at again (waiting launches, running kernels): wake up every tick.
            timeout = WAKE_MS if (waits or watch) else -1
            n = lib.pilot_srv_wait(srv, timeout, self.spin_us, msgs, BATCH, control)
            if n < 0:
                log.error("vgpu-%d: endpoint failed; stopping", self.index)
                return
            for i in range(n):
                handle(msgs[i])
            if watch:
                watch.poll()
            if waits:
                waits.poll()
            if control[0]:
                try:
                    if not self._control():
                        return
                except Exception:  # a release that failed must not take the vGPU down
                    log.exception("vgpu-%d: control command failed", self.index)

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
            if command == b"W":  # the policy host: ask waiting launches again (after this)
                continue
            session = self.sessions.get(session_id)
            if command == b"R" and session is not None:
                self._release(session)
        return True

    def _release(self, session: Session) -> None:
        self.sessions.pop(session.id, None)
        for conn in (session.identity, session.fault_identity):
            if conn is not None:
                self._by_conn.pop(conn, None)
                lib.pilot_srv_disconnect(self._srv, conn)  # a live client sees EOF
        self.waits.drop(session)
        self.kernel_watch.forget(session.id)
        held = session.held_allocations()
        session.release(self.backend, self.stream)
        self.broker.release_session(session, held)
        if self.policy is not None:
            self.policy.session_ended(session)
        log.info("session %d (pid %d) released", session.id, session.creds.pid,
                 extra={"session": session.id, "tenant": session.tenant})

    def _send(self, msg: Any, body: Any, size: int, payload: Any = None) -> None:
        if payload is None:
            lib.pilot_srv_send(self._srv, msg.conn, msg.frame[0], ENVELOPE_SIZE, body, size,
                               ffi.NULL, 0)
        else:
            lib.pilot_srv_send(self._srv, msg.conn, msg.frame[0], ENVELOPE_SIZE, body, size,
                               ffi.from_buffer(payload), len(payload))

    def reply_status(self, msg: Any, err: int, deferred: int = 0) -> None:
        rep = new("pilot_rep_status")
        rep.hdr.err, rep.hdr.deferred = err, deferred
        self._send(msg, rep, STATUS_SIZE)

    def handle(self, msg: Any) -> None:
        """One request: envelope, body[, payload]. Never raises. This is the hot path of every
        call, so cffi constants are module globals and the common case comes first."""
        if msg.nframes < 2 or msg.len[0] < ENVELOPE_SIZE:
            log.warning("vgpu-%d: dropped a malformed message (%d frames)", self.index, msg.nframes)
            return
        env = _cast(_ENVELOPE_PTR, msg.frame[0])
        no_reply = env.flags & _NO_REPLY
        opcode = env.opcode
        session = self._by_conn.get(msg.conn)
        if env.version != _VERSION or session is None or session.id != env.session:
            self._refuse(msg, env, session, no_reply)
            return
        if session.waiting is not None and msg.conn == session.identity:
            session.backlog.append(HeldMessage(msg))  # behind its waiting launch, in order
            return
        prepared = self._specs.get(opcode)
        result: Any = None
        err = 0
        t0 = 0.0 if no_reply else _clock()
        if prepared is None:
            log.warning("session %d: unknown opcode %d", session.id, opcode)
            err = CUDA_ERROR_NOT_SUPPORTED
        else:
            try:
                if msg.len[1] < prepared.size:
                    raise ProtocolError(f"body of {msg.len[1]} bytes, expected {prepared.size}")
                req = _cast(prepared.ptr, msg.frame[1]) if prepared.ptr is not None else None
                payload = _buffer(msg.frame[2], msg.len[2]) if msg.nframes > 2 else EMPTY
                result = prepared.fn(self, session, req, payload)
            except BackendError as exc:
                err = exc.code
                log.debug("session %d: %s: %s", session.id, self._op_names.get(opcode), exc)
            except WaitForPolicy as wait:
                self.waits.defer(session, wait, msg, bool(no_reply))
                session.calls += 1
                return
            except ProtocolError as exc:
                err = CUDA_ERROR_INVALID_VALUE
                log.warning("session %d: malformed %s: %s", session.id, self._op_names.get(opcode), exc)
            except Exception:
                err = CUDA_ERROR_UNKNOWN
                log.exception("session %d: %s failed", session.id, self._op_names.get(opcode))
        session.calls += 1
        name = self._op_names.get(opcode, "unknown")
        if no_reply:  # posted calls (launches...) are only counted: the hot path stays lean
            row = self.shard.calls.get(name)
            if row is None:
                row = self.shard.calls[name] = self.metrics.new_row()
            row[0] += 1
        else:
            self.metrics.call(name, _clock() - t0)
        if not err:
            if no_reply:
                return
            out_payload = None
            if type(result) is tuple:
                result, out_payload = result
            if result is None:
                result = new("pilot_rep_status")
            if prepared.synchronizing or session.sticky:  # type: ignore[union-attr]
                result.hdr.deferred = session.take_deferred()
            self._send(msg, result, _reply_size(result), out_payload)
            return
        if err in STICKY_ERRORS:
            log.error("session %d: context-fatal error %d from %s", session.id, err,
                      self._op_names.get(opcode))
        if no_reply or err in STICKY_ERRORS:
            session.note_async_error(err)
        if not no_reply:
            self.reply_status(msg, err, session.sticky)

    def _refuse(self, msg: Any, env: Any, session: Session | None, no_reply: int) -> None:
        """Requests that get no handler: protocol version, attach, no session on the connection."""
        if env.version != _VERSION:
            log.warning("vgpu-%d: protocol version %d, expected %d", self.index, env.version, _VERSION)
            if not no_reply:
                self.reply_status(msg, CUDA_ERROR_NOT_SUPPORTED)
        elif env.opcode == _OP_ATTACH:
            self._attach(msg, env.session, bool(env.flags & _FAULT_CHANNEL))
        else:
            log.warning("vgpu-%d: %s from a connection with no session %d", self.index,
                        self._op_names.get(env.opcode, env.opcode), env.session)
            if not no_reply:
                self.reply_status(msg, CUDA_ERROR_INITIALIZATION)

    def _attach(self, msg: Any, session_id: int, fault_channel: bool = False) -> None:
        """A session's connection (first) or its unified-memory fault channel (second, used by
        the client's fault handler so it never waits behind the main connection's lock)."""
        session = self.sessions.get(session_id)
        uid, gid, pid = ffi.new("uint32_t *"), ffi.new("uint32_t *"), ffi.new("int32_t *")
        err = 0
        if lib.pilot_srv_peer(self._srv, msg.conn, uid, gid, pid) != 0:
            return
        creds = Credentials(uid=uid[0], gid=gid[0], pid=pid[0])
        if session is None or (session.identity is None) == fault_channel or (
                fault_channel and session.fault_identity is not None):
            err = CUDA_ERROR_INITIALIZATION
        elif (creds.pid, creds.uid) != (session.creds.pid, session.creds.uid):
            log.warning("vgpu-%d: pid %d uid %d tried to attach session %d of pid %d", self.index,
                        creds.pid, creds.uid, session.id, session.creds.pid)
            err = CUDA_ERROR_INITIALIZATION
        else:
            if fault_channel:
                session.fault_identity = msg.conn
            else:
                # Concurrency by default: the session's legacy default stream is a non-blocking
                # stream of its own, so tenants on one vGPU never queue behind each other.
                try:
                    streams.own_legacy(self, session)
                except BackendError as exc:
                    err = exc.code
                session.identity = msg.conn
            self._by_conn[msg.conn] = session
        self.reply_status(msg, err)


class _Prepared:
    """A handler with its request type resolved once, off the hot path."""

    __slots__ = ("fn", "ptr", "size", "synchronizing")

    def __init__(self, spec: HandlerSpec) -> None:
        self.fn = spec.fn
        self.synchronizing = spec.synchronizing
        self.ptr = ffi.typeof(spec.request + " *") if spec.request else None
        self.size = ffi.sizeof(spec.request) if spec.request else 0


EMPTY = memoryview(b"")
_cast, _buffer = ffi.cast, ffi.buffer
_clock = time.perf_counter
_ENVELOPE_PTR = ffi.typeof("pilot_envelope *")
_NO_REPLY = lib.PILOT_F_NO_REPLY
_VERSION = lib.PILOT_PROTO_VERSION
_OP_ATTACH = lib.PILOT_OP_ATTACH
_FAULT_CHANNEL = lib.PILOT_F_FAULT_CHANNEL
STATUS_SIZE = ffi.sizeof("pilot_rep_status")
_SIZES: dict[Any, int] = {}


def _reply_size(cdata: Any) -> int:
    ctype = ffi.typeof(cdata)
    size = _SIZES.get(ctype)
    if size is None:
        size = _SIZES[ctype] = ffi.sizeof(ctype.item)
    return size
