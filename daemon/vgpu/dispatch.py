"""The vGPU's dispatch of one call: envelope checks, the handler, the reply (or the deferred or
posted error), attach. The hot path of every call, so cffi constants are module globals and the
common case comes first. Mixed into VGpu (vgpu/server.py), whose thread runs it."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INITIALIZATION,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_MEMORY_ALLOCATION,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_UNKNOWN,
    STICKY_ERRORS,
    BackendError,
)
from pilot.daemon.ops.registry import HandlerSpec
from pilot.daemon.protocol import ENVELOPE_SIZE, ProtocolError, ffi, lib, new
from pilot.daemon.resources.broker import HoldForPolicy
from pilot.daemon.scheduling import streams
from pilot.daemon.scheduling.callback_wait import WAITING_OPS, fields_of, would_wait
from pilot.daemon.scheduling.launch import WaitForPolicy
from pilot.daemon.scheduling.priority import GATED_OPS
from pilot.daemon.scheduling.waiting import HeldMessage
from pilot.daemon.sessions.session import Credentials, Session

if TYPE_CHECKING:
    from pilot.daemon.scheduling.priority import SessionGate
    from pilot.daemon.scheduling.waiting import WaitQueue
    from pilot.daemon.telemetry.metrics import Metrics

log = logging.getLogger("pilot.vgpu")


class Dispatch:
    """What VGpu's thread does with each received message."""

    index: int
    metrics: Metrics
    shard: Any
    waits: WaitQueue
    gate: SessionGate
    sessions: dict[int, Session]
    _srv: Any
    _by_conn: dict[int, Session]
    _specs: dict[int, _Prepared]
    _op_names: dict[int, str]
    _release: Any
    backend: Any
    device: int
    report_fault: Any  # FaultMonitor.report(device, error), set by the router
    _partition: Any  # the SM partition current on this thread (None: the whole GPU)
    fast: Any = None  # vgpu/fast.py's FastLaunches, or None
    device_output: Any = None  # vgpu/device_output.py's DeviceOutput, or None
    quarantine: Any  # sessions/quarantine.py: freed memory being zeroed
    preempt: Any = None  # scheduling/preempt.py's VGpuPreemption, or None

    def enter(self, session: Session) -> None:
        """Make the session's SM partition current on this thread (compute shares): what the
        session creates is then created in it and its kernels run on its SMs. About 1 us, only
        when the thread moves between sessions of different partitions."""
        part = session.partition
        if part is not self._partition:
            self.backend.use_partition(self.device, part)
            self._partition = part
            if self.fast is not None:
                self.fast.context(part)

    def _after_drain(self, prepared: Any, session: Session, req: Any, payload: Any) -> tuple[Any, int]:
        """An allocation failed for want of memory while freed memory is held in the
        quarantine: free what is not behind a program's work and try again; if that is not
        enough, wait for the rest too (as cudaMalloc would wait for memory a stream still
        frees), except what a session's host callback holds back (this thread never waits
        behind a gate: callbacks.py), and try once more. Returns (result, error)."""
        quarantine, err = self.quarantine, CUDA_ERROR_MEMORY_ALLOCATION
        for behind_work in (False, True):
            if err != CUDA_ERROR_MEMORY_ALLOCATION or not quarantine.holds_memory():
                break
            quarantine.drain(behind_work, self._no_gate_shut)
            try:
                return prepared.fn(self, session, req, payload), 0
            except BackendError as exc:
                err = exc.code
        return None, err

    def _no_gate_shut(self, session_id: int) -> bool:
        """Whether waiting for the session's streams cannot wait for its host callbacks."""
        s = getattr(self, "sessions", {}).get(session_id)
        return s is None or not s.callback_gates

    def _send(self, msg: Any, body: Any, size: int, payload: Any = None,
              flush_point: bool = False) -> None:
        """A reply; at a flush point (a synchronizing call: the driver prints kernels' printf
        output there) with what they printed, if it is this session's."""
        output = self.device_output
        data = (self._output_for(msg, output)
                if flush_point and output is not None and output.pending() else b"")
        extra, extra_len = (ffi.NULL, 0) if payload is None else (ffi.from_buffer(payload), len(payload))
        if not data:
            lib.pilot_srv_send(self._srv, msg.conn, msg.frame[0], ENVELOPE_SIZE, body, size, extra,
                               extra_len)
            return
        # the kernels' printf output goes with the reply: an envelope flag, one more frame
        env = new("pilot_envelope")
        ffi.memmove(env, msg.frame[0], ENVELOPE_SIZE)
        env.flags |= _DEVICE_OUTPUT
        lib.pilot_srv_send4(self._srv, msg.conn, env, ENVELOPE_SIZE, body, size, extra, extra_len,
                            data, len(data))

    def _output_for(self, msg: Any, output: Any) -> bytes:
        """What the kernels printed since the last reply, if it is this connection's session's
        (device_output.py); C is told it has been taken."""
        session = self._by_conn.get(msg.conn)
        data = output.take(session.id) if session is not None else b""
        if self.fast is not None:
            self.fast.output(output.fd, output.taken)
        return data

    def reply_status(self, msg: Any, err: int, deferred: int = 0, flush_point: bool = False) -> None:
        rep = new("pilot_rep_status")
        rep.hdr.err, rep.hdr.deferred = err, deferred
        self._send(msg, rep, STATUS_SIZE, None, flush_point)

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
        if (session.waiting is not None or session.gate_held or session.policy_hold is not None) \
                and msg.conn == session.identity:
            # behind its waiting launch or the priority gate, in order; or the first call the
            # policy holds
            held = self.waits.hold(session, msg) if session.waiting is not None or session.gate_held \
                else self.waits.gate(session, msg)
            if not held:
                self._release(session)  # it held more than the daemon keeps for anyone
            return
        if session.signals:  # its calls gate lower tenants (scheduling/priority.py)
            self.gate.board.touched(session, _monotonic())
        gated = session.gated and opcode in _GATED_OPS
        if gated and not self.gate.admit(session):  # at most gated_inflight pieces of work
            if not self.gate.hold(session, msg, isinstance(msg, HeldMessage)):
                self._release(session)
            return
        prepared = self._specs.get(opcode)
        if session.callback_gates and prepared is not None and prepared.waits \
                and msg.conn == session.identity and self._would_wait(session, opcode, prepared, msg):
            # it would wait on this thread for the client's own callback: held instead
            if not self.waits.hold_for_callbacks(session, msg):
                self._release(session)
            return
        if session.partition is not self._partition:
            self.enter(session)
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
                if session.preempt_raises and opcode in _GATED_OPS:
                    result = self._raising(prepared, session, req, payload)
                else:
                    result = prepared.fn(self, session, req, payload)
                if gated:
                    self.gate.issued(session, opcode, req)
            except BackendError as exc:
                err = exc.code
                if err == CUDA_ERROR_MEMORY_ALLOCATION and self.quarantine.holds_memory():
                    result, err = self._after_drain(prepared, session, req, payload)
                if err:
                    log.debug("session %d: %s: %s", session.id, self._op_names.get(opcode), exc)
            except WaitForPolicy as wait:
                self.waits.defer(session, wait, msg, bool(no_reply))
                session.calls += 1
                return
            except HoldForPolicy:  # an allocation the policy holds: served again once released
                if not self.waits.gate(session, msg):
                    self._release(session)
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
                session.work_in_flight = False
            self._send(msg, result, _reply_size(result), out_payload,
                       prepared.synchronizing)  # type: ignore[union-attr]
            return
        if err in STICKY_ERRORS:
            log.error("session %d: context-fatal error %d from %s", session.id, err,
                      self._op_names.get(opcode))
            if self.report_fault is not None:
                self.report_fault(self.device, err)
        if no_reply or err in STICKY_ERRORS:
            session.note_async_error(err)
        if not no_reply:
            self.reply_status(msg, err, session.sticky,
                              prepared is not None and prepared.synchronizing)

    def _would_wait(self, session: Session, opcode: int, prepared: _Prepared, msg: Any) -> bool:
        """Whether the call would block this thread behind one of its session's host callbacks
        (scheduling/callback_wait.py); a short body is the handler's to refuse."""
        if prepared.ptr is not None and msg.len[1] < prepared.size:
            return False
        req = _cast(prepared.ptr, msg.frame[1]) if prepared.ptr is not None else None
        return would_wait(self, session, opcode, req, prepared.fields)  # type: ignore[arg-type]

    def _raising(self, prepared: Any, session: Session, req: Any, payload: Any) -> Any:
        """A call that puts kernels on the GPU, of a session whose launches preempt lower classes
        (scheduling/preempt.py): it raises their retreat words first, as C's fast path does."""
        words = self.preempt.enter(session)
        try:
            return prepared.fn(self, session, req, payload)
        finally:
            if words is not None:
                lib.pilot_preempt_leave(words.ptr)

    def _refuse(self, msg: Any, env: Any, session: Session | None, no_reply: int) -> None:
        """Requests that get no handler: protocol version, attach, no session on the connection."""
        if env.version != _VERSION:
            log.warning("vgpu-%d: protocol version %d, expected %d", self.index, env.version, _VERSION)
            if not no_reply:
                self.reply_status(msg, CUDA_ERROR_NOT_SUPPORTED)
        elif env.opcode == _OP_ATTACH:
            self._attach(msg, env.session, bool(env.flags & _FAULT_CHANNEL))
        else:
            # The first call on a connection must be ATTACH: a peer that does otherwise gets
            # one refusal and loses the connection (a flood of them must cost pilotd nothing
            # but that; issue 12, attack 6).
            log.warning("vgpu-%d: %s from a connection with no session %d: refused, connection "
                        "closed", self.index, self._op_names.get(env.opcode, env.opcode), env.session)
            if not no_reply:
                self.reply_status(msg, CUDA_ERROR_INITIALIZATION)
            lib.pilot_srv_disconnect(self._srv, msg.conn)

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
                    self.enter(session)  # its legacy stream is created in its partition
                    streams.own_legacy(self, session)
                except BackendError as exc:
                    err = exc.code
                session.identity = msg.conn
                if self.device_output is not None:  # what was printed before is not its
                    self.device_output.drain()
                    self.device_output.attached(session.id)
            self._by_conn[msg.conn] = session
            if not err:
                lib.pilot_srv_trust(self._srv, msg.conn)  # large requests from now on
        self.reply_status(msg, err)


class _Prepared:
    """A handler with its request type resolved once, off the hot path."""

    __slots__ = ("fields", "fn", "ptr", "size", "synchronizing", "waits")

    def __init__(self, spec: HandlerSpec, opcode: int = -1) -> None:
        self.fn = spec.fn
        self.synchronizing = spec.synchronizing
        # it waits for the session's streams (held while its callbacks' gates are shut)
        self.waits = spec.synchronizing or opcode in WAITING_OPS
        self.fields = fields_of(spec.request)
        self.ptr = ffi.typeof(spec.request + " *") if spec.request else None
        self.size = ffi.sizeof(spec.request) if spec.request else 0


EMPTY = memoryview(b"")
_cast, _buffer = ffi.cast, ffi.buffer
_clock = time.perf_counter
_monotonic = time.monotonic
_GATED_OPS = frozenset(GATED_OPS)
_ENVELOPE_PTR = ffi.typeof("pilot_envelope *")
_NO_REPLY = lib.PILOT_F_NO_REPLY
_VERSION = lib.PILOT_PROTO_VERSION
_OP_ATTACH = lib.PILOT_OP_ATTACH
_FAULT_CHANNEL = lib.PILOT_F_FAULT_CHANNEL
_DEVICE_OUTPUT = lib.PILOT_F_DEVICE_OUTPUT
STATUS_SIZE = ffi.sizeof("pilot_rep_status")
_SIZES: dict[Any, int] = {}


def _reply_size(cdata: Any) -> int:
    ctype = ffi.typeof(cdata)
    size = _SIZES.get(ctype)
    if size is None:
        size = _SIZES[ctype] = ffi.sizeof(ctype.item)
    return size
