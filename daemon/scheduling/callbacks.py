"""Host callbacks (cudaLaunchHostFunc, cudaStreamAddCallback): the daemon's half.

A callback is a function of the client process, so it must run there, in stream order: it
starts once everything queued before it on the stream is done, and nothing queued after it may
start before it returned. The daemon cannot run it, and cannot give the driver a Python
callable either (cuLaunchHostFunc takes a C function pointer). So a callback becomes a *gate*
on the program's stream (daemon/native/gates.h):

1. STREAM_CALLBACK (vGPU thread): `arm` takes a slot of pinned host memory and the backend
   enqueues pilot_gate_fire (C, compiled into pilot.shim._proto; it runs on the driver's
   callback thread without Python) followed by a wait on the slot's word (cuStreamWaitValue32).
2. When the stream reaches the gate, pilot_gate_fire writes the slot's token into a pipe.
3. The hub thread (`pilot-callbacks`) reads the token and sends CALLBACK_RUN to the session's
   callback connection; the shim's callback thread runs the callback and answers
   CALLBACK_DONE.
4. The hub opens the gate (stores the target into the word): the stream goes on.

The hub thread owns its own socket and never touches CUDA. A vGPU thread never waits behind a
gate: while a session part has a gate not yet opened (`Session.callback_gates`), its calls
that would wait for unfinished work (a synchronize, a blocking copy, cudaFree...) are held in
its backlog and served once that work is done (scheduling/callback_wait.py, waiting.py
`hold_for_callbacks`), so the other sessions of the vGPU never queue behind a tenant's host
callback (issue 27, 5). A session
that ends (process exit or crash, pilotctl kill, daemon shutdown) has every gate it still holds
opened at once by the router thread, so a client that dies mid-callback leaves no stream
waiting. A session's callbacks on the legacy stream move that session to a legacy stream of its
own first (streams.own_legacy), so its gates never sit on the vGPU stream other tenants share.

Slots are 32-byte `pilot_gate` structs in registered pages that are never freed; a slot is
reused once it both fired and was opened. Its word only ever grows (targets are cyclic, as
cuStreamWaitValue32's default compare is), so a reused slot never satisfies an old wait late.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INITIALIZATION,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED,
    Backend,
    BackendError,
    Gate,
)
from pilot.daemon.protocol import ENVELOPE_SIZE, ffi, lib, new
from pilot.daemon.sessions.session import Session
from pilot.daemon.telemetry.thread_names import NamedThread

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.callbacks")

PAGE = 4096
GATE_SIZE = ffi.sizeof("pilot_gate")
PER_PAGE = PAGE // GATE_SIZE
TOKEN = struct.Struct("<Q")
WAKE = 0  # token: commands are queued
STOP = 2**64 - 1  # token: the hub thread exits
PIPE_BYTES = 1 << 20  # room for 131072 tokens in flight
BATCH = 64

HOST_FUNC = lib.PILOT_CALLBACK_HOST_FUNC
STREAM_CALLBACK = lib.PILOT_CALLBACK_STREAM


@dataclass(eq=False)
class _Pending:
    slot: int
    gate: Any  # pilot_gate *
    session: int
    part: Session
    client_id: int
    kind: int
    fired: bool = False
    opened: bool = False
    asked_at: float = 0.0  # when CALLBACK_RUN went to the client (monotonic); 0: not asked
    vgpu: Any = None  # the VGpu whose thread armed it: told when the part's last gate opens


class CallbackHub:
    """The `pilot-callbacks` thread, its socket, and the gate slots of every vGPU."""

    def __init__(self, endpoint_path: str, backend: Backend, timeout: float = 60.0,
                 hold_total: float = 0.0) -> None:
        self.endpoint_path = endpoint_path
        self.backend = backend
        # A callback the client has not answered after `timeout` s ends its session (0: never):
        # its gates open (a vGPU may wait behind one) and `on_overdue(session, why)` asks the
        # router to release it. Set by the Daemon.
        self.timeout = timeout
        # What all of a session's callbacks may hold its streams, added up (0: no limit): a
        # client answering each one just inside `timeout` would otherwise hold its vGPU forever.
        self.hold_total = hold_total
        self.on_overdue: Callable[[int, str], None] = lambda sid, why: None
        self._read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._read_fd, False)
        try:
            fcntl.fcntl(self._write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # a smaller pipe only means host functions may wait for the hub
            pass
        self._lock = threading.Lock()
        # Guarded by _lock.
        self._pages: list[tuple[mmap.mmap, int]] = []  # (mapping, address)
        self._device_addresses: dict[tuple[int, int], int] = {}  # (page, backend device) -> addr
        self._free: list[int] = []
        self._generation: dict[int, int] = {}  # slot -> last target
        self._pending: dict[int, _Pending] = {}  # slot -> pending
        self._by_client: dict[tuple[int, int], _Pending] = {}  # (session, client id)
        self._sessions: dict[int, Any] = {}  # session id -> devices.SessionGroup or Session
        self._conns: dict[int, int] = {}  # session id -> callback connection
        self._closed = False  # shutting down: no new gates
        self._held: dict[int, float] = {}  # session id -> seconds its answered callbacks took
        # Owned by the hub thread.
        self._by_conn: dict[int, int] = {}  # connection -> session id
        self._commands: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        self._srv: Any = None
        self._thread = NamedThread(target=self._run, name="pilot-callbacks", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # ---- router thread ----
    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error:
            raise self._error

    def stop(self) -> None:
        self.close_all()
        if self._thread.is_alive():
            os.write(self._write_fd, TOKEN.pack(STOP))
            self._thread.join(5)

    def open_session(self, session_id: int, owner: Any) -> None:
        """A new session (`owner` has .parts or is the Session: its credentials are checked
        against the callback connection's)."""
        with self._lock:
            self._sessions[session_id] = owner

    def close_session(self, session_id: int) -> None:
        """The session is ending: open every gate it holds so its streams drain (a vGPU thread
        may be blocked on one of them), and drop its callback connection."""
        with self._lock:
            self._sessions.pop(session_id, None)
            self._conns.pop(session_id, None)
            self._held.pop(session_id, None)
            opened = [p for p in self._pending.values() if p.session == session_id]
            for p in opened:
                self._open_locked(p)
        if opened:
            self.backend.kick()
        self._commands.put(("drop", session_id))
        self._wake()

    def close_all(self) -> None:
        """Shutdown: open every gate and arm no more, so no vGPU thread stays blocked."""
        with self._lock:
            self._closed = True
            ids = list(self._sessions) + [p.session for p in self._pending.values()]
        for sid in set(ids):
            self.close_session(sid)

    # ---- vGPU threads ----
    def arm(self, vg: VGpu, s: Session, client_id: int, kind: int, stream: Any) -> None:
        """Put the gate for the client's callback `client_id` on `stream`."""
        with self._lock:
            if self._closed:
                raise BackendError(CUDA_ERROR_NOT_SUPPORTED, "pilotd is stopping")
            if s.id not in self._conns:
                raise BackendError(CUDA_ERROR_INITIALIZATION,
                                   "no callback connection (CALLBACK_ATTACH first)")
            if (s.id, client_id) in self._by_client:
                raise BackendError(CUDA_ERROR_INVALID_VALUE, f"callback {client_id} is pending")
            slot = self._take_slot_locked(vg)
            gate = self._gate_locked(slot)
            target = (self._generation.get(slot, 0) + 1) & 0xFFFFFFFF
            gate.target, gate.status, gate.fd = target, 0, self._write_fd
            gate.token, gate.wait = slot + 1, 0  # the backend sets wait where it must
            pending = _Pending(slot, gate, s.id, s, client_id, kind, vgpu=vg)
            self._pending[slot] = pending
            s.callback_gates += 1
            self._by_client[(s.id, client_id)] = pending
            page = slot // PER_PAGE
            device_address = self._device_address_locked(vg, page) + (slot % PER_PAGE) * GATE_SIZE
        address = int(ffi.cast("uintptr_t", gate))
        try:
            vg.backend.gate(stream, Gate(address, device_address, target, kind == STREAM_CALLBACK))
        except BaseException:
            with self._lock:  # never enqueued: the slot can go back at once
                s.callback_gates -= 1
                self._forget_locked(pending)
                self._free.append(slot)
            raise

    def _take_slot_locked(self, vg: VGpu) -> int:
        if not self._free:
            mapping = mmap.mmap(-1, PAGE)
            address = int(ffi.cast("uintptr_t", ffi.from_buffer(mapping)))
            vg.backend.map_host(address, PAGE)
            page = len(self._pages)
            self._pages.append((mapping, address))
            self._free.extend(range(page * PER_PAGE + PER_PAGE - 1, page * PER_PAGE - 1, -1))
        return self._free.pop()

    def _gate_locked(self, slot: int) -> Any:
        _, address = self._pages[slot // PER_PAGE]
        return ffi.cast("pilot_gate *", address + (slot % PER_PAGE) * GATE_SIZE)

    def _device_address_locked(self, vg: VGpu, page: int) -> int:
        key = (page, vg.device)
        found = self._device_addresses.get(key)
        if found is None:  # the calling vGPU thread has this device's context current
            found = self._device_addresses[key] = vg.backend.host_device_pointer(self._pages[page][1])
        return found

    # ---- any thread, _lock held ----
    def _open_locked(self, p: _Pending) -> None:
        if p.opened:
            return
        lib.pilot_gate_open(p.gate, p.gate.target)
        self._generation[p.slot] = p.gate.target
        p.opened = True
        p.part.callback_gates -= 1
        if p.part.waiting is not None:
            _wake(p.vgpu)  # a call held behind its gates may go on now
        if p.asked_at and p.session in self._sessions:
            self._held[p.session] = self._held.get(p.session, 0.0) + time.monotonic() - p.asked_at
        self._by_client.pop((p.session, p.client_id), None)
        if p.fired:
            self._forget_locked(p)
            self._free.append(p.slot)

    def _forget_locked(self, p: _Pending) -> None:
        self._pending.pop(p.slot, None)
        self._by_client.pop((p.session, p.client_id), None)

    def _wake(self) -> None:
        try:
            os.write(self._write_fd, TOKEN.pack(WAKE))
        except OSError:
            pass

    # ---- the hub thread ----
    def _run(self) -> None:
        try:
            err = ffi.new("char[]", 256)
            srv = lib.pilot_srv_open(self.endpoint_path.encode(), self._read_fd, err, 256)
            if srv == ffi.NULL:
                raise OSError(f"callback socket: {ffi.string(err).decode()}")
            self._srv = srv
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._serve()
        finally:
            lib.pilot_srv_close(self._srv)

    def _serve(self) -> None:
        msgs = ffi.new("pilot_srv_msg[]", BATCH)
        control = ffi.new("int *")
        while True:  # the timeout may change (SIGHUP): the wait follows it
            bound = min(t for t in (self.timeout, self.hold_total, 4.0) if t > 0)
            wait_ms = max(100, min(1000, int(bound * 250)))
            n = lib.pilot_srv_wait(self._srv, wait_ms, 0, msgs, BATCH, control)
            if n < 0:
                log.error("callback socket failed; host callbacks stop")
                return
            if self.timeout > 0 or self.hold_total > 0:
                self._end_overdue()
            for i in range(n):
                try:
                    self._message(msgs[i])
                except Exception:
                    log.exception("callback hub: request failed; dropped")
            if control[0] and not self._drain():
                return

    def _drain(self) -> bool:
        """Handle the tokens in the pipe; False once told to stop."""
        while True:
            try:
                data = os.read(self._read_fd, TOKEN.size * 512)
            except BlockingIOError:
                break
            if not data:
                break
            for (token,) in TOKEN.iter_unpack(data[: len(data) - len(data) % TOKEN.size]):
                if token == STOP:
                    return False
                if token != WAKE:
                    self._fired(token - 1)
        while True:
            try:
                command, sid = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command == "drop":
                for conn in [c for c, s in self._by_conn.items() if s == sid]:
                    del self._by_conn[conn]
                    lib.pilot_srv_disconnect(self._srv, conn)

    def _fired(self, slot: int) -> None:
        """The stream reached the gate in `slot`: have the client run the callback."""
        with self._lock:
            p = self._pending.get(slot)
            if p is None or p.fired:
                return  # a stale token
            p.fired = True
            if p.opened:  # opened early (the session ended): the slot is free again
                self._forget_locked(p)
                self._free.append(slot)
                return
            conn = self._conns.get(p.session)
            status = int(p.gate.status) or p.part.sticky
        skip = conn is None or (p.kind == HOST_FUNC and status != 0)
        sent = False
        if conn is not None:
            msg = new("pilot_msg_callback")
            msg.id, msg.status = p.client_id, status
            msg.flags = lib.PILOT_CALLBACK_SKIP if skip else 0
            sent = self._send(conn, lib.PILOT_OP_CALLBACK_RUN, msg, p.session)
            if sent and not skip:
                p.asked_at = time.monotonic()
        if skip or not sent:  # nobody will answer: open it now
            with self._lock:
                self._open_locked(p)
            self.backend.kick()

    def _end_overdue(self) -> None:
        """Sessions with a callback unanswered for longer than the timeout lose the session (not
        the vGPU: their gates open now)."""
        now = time.monotonic()
        with self._lock:
            late = {p.session: f"a host callback unanswered for {self.timeout:g} s"
                    for p in self._pending.values()
                    if self.timeout > 0 and p.asked_at and not p.opened and now - p.asked_at > self.timeout}
            if self.hold_total > 0:
                holding = dict(self._held)
                for p in self._pending.values():
                    if p.asked_at and not p.opened:
                        holding[p.session] = holding.get(p.session, 0.0) + now - p.asked_at
                late.update({sid: f"its host callbacks held its streams {held:.1f} s in all "
                                  f"([daemon] callback_hold_total = {self.hold_total:g} s)"
                             for sid, held in holding.items() if held > self.hold_total})
        for sid, why in late.items():
            log.warning("session %d: %s: the session is ended", sid, why, extra={"session": sid})
            self.close_session(sid)
            self.on_overdue(sid, why)

    def _send(self, conn: int, op: int, body: Any, session: int) -> bool:
        env = new("pilot_envelope")
        env.version, env.opcode, env.session = lib.PILOT_PROTO_VERSION, op, session
        rc = lib.pilot_srv_send(self._srv, conn, env, ENVELOPE_SIZE, body, ffi.sizeof(body[0]),
                                ffi.NULL, 0)
        return rc == 0

    def _message(self, msg: Any) -> None:
        if msg.nframes < 2 or msg.len[0] < ENVELOPE_SIZE:
            return
        env = ffi.cast("pilot_envelope *", msg.frame[0])
        if env.opcode == lib.PILOT_OP_CALLBACK_ATTACH:
            self._attach(msg, env)
        elif env.opcode == lib.PILOT_OP_CALLBACK_DONE and msg.len[1] >= ffi.sizeof("pilot_msg_callback"):
            sid = self._by_conn.get(msg.conn)
            if sid is None or sid != env.session:
                return
            done = ffi.cast("pilot_msg_callback *", msg.frame[1])
            with self._lock:
                p = self._by_client.get((sid, done.id))
                if p is None:
                    return
                self._open_locked(p)
            self.backend.kick()
        else:
            log.warning("callback socket: unexpected opcode %d", env.opcode)

    def _attach(self, msg: Any, env: Any) -> None:
        uid, gid, pid = ffi.new("uint32_t *"), ffi.new("uint32_t *"), ffi.new("int32_t *")
        if lib.pilot_srv_peer(self._srv, msg.conn, uid, gid, pid) != 0:
            return
        sid = env.session
        err = 0
        with self._lock:
            owner = self._sessions.get(sid)
            creds = _creds(owner)
            if creds is None or (creds.pid, creds.uid) != (pid[0], uid[0]) or sid in self._conns:
                err = CUDA_ERROR_INITIALIZATION
            else:
                self._conns[sid] = msg.conn
        if err:
            log.warning("callback socket: pid %d uid %d refused for session %d", pid[0], uid[0], sid)
        else:
            self._by_conn[msg.conn] = sid
        rep = new("pilot_rep_status")
        rep.hdr.err = err
        env_out = new("pilot_envelope")
        ffi.memmove(env_out, msg.frame[0], ENVELOPE_SIZE)
        lib.pilot_srv_send(self._srv, msg.conn, env_out, ENVELOPE_SIZE, rep,
                           ffi.sizeof("pilot_rep_status"), ffi.NULL, 0)

    # ---- reports and tests ----
    def pending(self, session_id: int | None = None) -> int:
        with self._lock:
            return sum(1 for p in self._pending.values()
                       if not p.opened and (session_id is None or p.session == session_id))


def _wake(vg: Any) -> None:
    if vg is None:
        return
    try:
        vg.send_control(b"W")
    except (BlockingIOError, OSError):  # full of wake-ups already, or the vGPU stopped
        pass


def _creds(owner: Any) -> Any:
    if owner is None:
        return None
    parts = getattr(owner, "parts", None)
    first = parts[0] if parts else owner
    return getattr(first, "creds", None)


