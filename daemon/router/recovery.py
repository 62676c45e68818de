"""Recovery from a context-fatal GPU fault: notice it, tell the sessions, start afresh.

What the H100 does (tests/gpu/fault_probe.py, bench/RESULTS.md "GPU faults"): after a kernel
faults (cudaErrorIllegalAddress and the other sticky errors), every CUDA call of the process on
that device fails with the fault's error, in every context of the process (its primary context,
contexts it created, green contexts), and neither cuDevicePrimaryCtxReset nor destroying the
contexts makes the device usable again: the process must end. pilotd's tenants share its
process, so one tenant's bad kernel takes everyone's work on the GPU down, as under MPS.

What pilotd does about it:
- *Notice*: any call that returns a sticky error reports it (vGPU dispatch), and the
  `pilot-faultwatch` thread asks each GPU's context every `[daemon] fault_poll_interval` (20 ms;
  a query of an idle stream, ~10 us) so that a fault nobody calls into is noticed too.
- *Tell*: from the fault on, every call of every session fails with the fault's error (the
  driver's doing); the router stops taking new sessions, waits FAULT_GRACE so that calls in
  flight get that error, and names the sessions whose kernels may have faulted (those with
  launches since their last synchronizing call: one means it is known; several of one tenant
  mean the tenant is).
- *Start afresh*: pilotd re-executes itself in place (same pid, so systemd, pidfds and
  `pilotctl` see the same daemon), keeping its main and control sockets' listening descriptors
  open across the exec, so that programs connecting meanwhile wait in the socket's backlog
  instead of being refused. Every other descriptor (the driver's included) is closed by the
  exec, which frees the old context's GPU memory. Sessions of the old process lose their
  connections: their next call fails (cudaErrorDevicesUnavailable, sticky), as natively after
  such a fault. The faults seen so far travel in the environment (PILOT_RECOVERY), so metrics
  and `pilotctl status` keep them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from pilot.daemon.backends.base import (
    CUDA_ERROR_MPS_CLIENT_TERMINATED,
    STICKY_ERRORS,
    Backend,
    BackendError,
)
from pilot.daemon.telemetry.thread_names import NamedThread

log = logging.getLogger("pilot.recovery")

RECOVERY_ENV = "PILOT_RECOVERY"
FAULT_GRACE = 0.05  # seconds calls in flight have to get the fault's error before the restart
ERROR_NAMES = {700: "cudaErrorIllegalAddress", 702: "cudaErrorLaunchTimeout",
               710: "cudaErrorAssert", 714: "cudaErrorHardwareStackError",
               715: "cudaErrorIllegalInstruction", 716: "cudaErrorMisalignedAddress",
               717: "cudaErrorInvalidAddressSpace", 718: "cudaErrorInvalidPc",
               719: "cudaErrorLaunchFailure", 214: "cudaErrorECCUncorrectable",
               810: "cudaErrorMpsClientTerminated"}


@dataclass
class Fault:
    """One context-fatal fault, as logged, counted and carried across the restart."""

    gpu: int  # host index
    error: int
    detected: float  # time.time()
    via: str  # "call" (a call returned it) or "watch" (the fault watch saw it)
    suspects: list[dict[str, Any]] = field(default_factory=list)  # session, tenant, pid, cmdline
    known: bool = False  # exactly one suspect: that session's work faulted
    restarted: float | None = None  # when the new process was ready (time.time())
    # Under MPS: the server tore this process down for another client's fault (its log named
    # that client, not this process); `culprit` is that client's tenant where it is an engine of
    # this pilotd. Such a restart is counted apart from the GPU's faults.
    bystander: bool = False
    culprit: str = ""

    @property
    def name(self) -> str:
        return ERROR_NAMES.get(self.error, f"error {self.error}")

    @property
    def tenant(self) -> str:
        """The faulting tenant when it is known (every suspect is its), else "unknown" (the
        metric's label)."""
        return fault_tenant(self.suspects)


SUSPECT_WINDOW = 3600.0  # seconds: a tenant among the suspects of two faults this close is isolated


def repeat_suspects(faults: list[Fault]) -> dict[str, str]:
    """Who the last fault makes isolated ([isolation] after_fault), and why: its tenant when it
    is known; else every suspect tenant that was also a suspect of an earlier fault within
    SUSPECT_WINDOW, so that a tenant cannot fault again and again by always having another
    tenant's work in flight beside its own (a busy bystander may be isolated with it). Nobody
    when the MPS server ended this process for another client's fault."""
    last = faults[-1]
    if last.error == CUDA_ERROR_MPS_CLIENT_TERMINATED:
        return {}  # the MPS server ended this process for another client's fault ([isolation] mps)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.detected))
    if last.tenant != "unknown":
        return {last.tenant: f"its kernel faulted ({last.name}) at {when}"}
    earlier = {s["tenant"] for f in faults[:-1] if last.detected - f.detected <= SUSPECT_WINDOW
               for s in f.suspects}
    return {s["tenant"]: f"it had work in flight at two faults within an hour, the last "
                         f"({last.name}) at {when}"
            for s in last.suspects if s["tenant"] in earlier}


def fault_tenant(suspects: list[dict[str, Any]]) -> str:
    tenants = {s["tenant"] for s in suspects}
    return tenants.pop() if len(tenants) == 1 else "unknown"


class FaultMonitor:
    """Takes fault reports from any thread and polls the GPUs; calls `on_fault(gpu, error, via)`
    once, for the first fault (the process is done with CUDA after it)."""

    def __init__(self, backend: Backend, gpus: dict[int, int], interval: float,
                 on_fault: Callable[[int, int, str], None]) -> None:
        self.backend = backend
        self.gpus = gpus  # host index -> backend device
        self.interval = interval
        self.on_fault = on_fault
        self._by_device = {d: g for g, d in gpus.items()}
        self._lock = threading.Lock()
        self._fired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def fired(self) -> bool:
        return self._fired

    def report(self, device: int, error: int, via: str = "call") -> None:
        """A call on backend `device` returned `error` (any thread); non-sticky errors are ignored."""
        if error not in STICKY_ERRORS or self._fired:
            return
        with self._lock:
            if self._fired:
                return
            self._fired = True
        self.on_fault(self._by_device.get(device, device), error, via)

    def start(self) -> None:
        if self.interval <= 0 or self._thread is not None:
            return
        self._thread = NamedThread(target=self._run, name="pilot-faultwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval) and not self._fired:
            for device in self.gpus.values():
                try:
                    error = self.backend.context_error(device)
                except BackendError as exc:
                    error = exc.code
                except Exception:  # never let the watch die on a surprise
                    log.exception("fault watch: context query failed")
                    continue
                if error:
                    self.report(device, error, "watch")
                    return


@dataclass
class Handover:
    """What a pilotd process hands the one that replaces it after a fault."""

    fds: dict[str, int] = field(default_factory=dict)  # "main"/"control" -> listening descriptor
    faults: list[Fault] = field(default_factory=list)
    next_session: int = 1  # session ids go on, so logs and metrics never reuse one
    exec_at: float = 0.0  # time.time() at the exec, for the log of how long the restart took
    engines: list[dict[str, Any]] = field(default_factory=list)  # isolation.Engines.handover()


def handover_from_environment() -> Handover:
    """What the process before this one handed over, if any (removed from the environment, so
    nothing started later inherits it)."""
    raw = os.environ.pop(RECOVERY_ENV, "")
    if not raw:
        return Handover()
    try:
        data = json.loads(raw)
        return Handover(fds={str(k): int(v) for k, v in data.get("fds", {}).items()},
                        faults=[Fault(**f) for f in data.get("faults", [])],
                        next_session=max(1, int(data.get("next_session", 1))),
                        exec_at=float(data.get("exec_at", 0.0)),
                        engines=[dict(e) for e in data.get("engines", [])])
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("ignoring a malformed %s (%s)", RECOVERY_ENV, exc)
        return Handover()


def _close_on_exec_all_but(keep: set[int]) -> None:
    """Mark every open descriptor but `keep` (and stdio) close-on-exec. Setting the flag, unlike
    closing, leaves the threads still using them (the driver's, libzmq's) undisturbed until the
    exec."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd in keep:
            continue
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
            flags = fcntl.fcntl(fd, fcntl.F_GETFD)
            if not flags & fcntl.FD_CLOEXEC:
                fcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)


def exec_afresh(handover: Handover) -> NoReturn:
    """Replace this process with a new pilotd of the same command line, handing over its
    listening sockets, faults and session numbering."""
    for fd in handover.fds.values():
        os.set_inheritable(fd, True)
    _close_on_exec_all_but(set(handover.fds.values()))
    handover.exec_at = time.time()
    env = dict(os.environ)
    env[RECOVERY_ENV] = json.dumps(asdict(handover))
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable, *sys.argv])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os.execve(sys.executable, argv, env)


# ---- an isolated tenant's faults, seen by the pilotd that started its engine ----

ENGINE_FAULTS_FILE = "engine-faults.jsonl"
ENGINE_FAULTS_READ = 1 << 20  # bytes read from the end: the latest ~10,000 faults; the file is
# cut back to them once it holds twice as much


def record_engine_fault(state_dir: str, fault: Fault, tenant: str) -> None:
    """An engine (a pilotd serving one isolated tenant) faulted: one JSON line appended to the
    state directory's ENGINE_FAULTS_FILE, which the pilotd that started it exports (metrics,
    `pilotctl status`); the engine's own counters restart with it and nobody scrapes it. A fault
    the MPS server ended this engine for (another client's: error 810, or a fault whose MPS log
    names another client) is not recorded: that client's engine records its own. Best effort: a
    full disk loses the line, never the restart."""
    if fault.error == CUDA_ERROR_MPS_CLIENT_TERMINATED or fault.bystander:
        return
    line = json.dumps({"gpu": fault.gpu, "error": fault.error, "name": fault.name,
                       "detected": fault.detected, "tenant": tenant, "pid": os.getpid()})
    path = os.path.join(state_dir, ENGINE_FAULTS_FILE)
    try:
        for _ in range(3):  # a trim by another engine may replace the file between open and lock
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_nlink == 0:
                    continue
                os.write(fd, (line + "\n").encode())
                if os.fstat(fd).st_size > 2 * ENGINE_FAULTS_READ:
                    _trim_engine_faults(path)
                return
            finally:
                os.close(fd)  # and its lock
    except OSError as exc:
        log.warning("cannot record the fault for the pilotd that started this one: %s", exc)


def _trim_engine_faults(path: str) -> None:
    """Keeps the file's last ENGINE_FAULTS_READ bytes (whole lines: all a reader looks at), so a
    tenant faulting its engine over and over cannot fill the state directory. Called with the
    file locked; the copy replaces it atomically, and writers waiting for the lock see the old
    file unlinked and open the new one."""
    with open(path, "rb") as f:
        f.seek(-ENGINE_FAULTS_READ, os.SEEK_END)
        data = f.read()
    data = data[data.find(b"\n") + 1:]
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_engine_faults(state_dir: str) -> list[dict[str, Any]]:
    """The engines' faults recorded in the state directory, oldest first (the last
    ENGINE_FAULTS_READ bytes; lines that are not a fault's are skipped)."""
    path = os.path.join(state_dir, ENGINE_FAULTS_FILE)
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - ENGINE_FAULTS_READ))
            data = f.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > ENGINE_FAULTS_READ:
        lines = lines[1:]  # cut in the middle
    faults = []
    for raw in lines:
        try:
            row = json.loads(raw)
            faults.append({"gpu": int(row["gpu"]), "error": int(row["error"]),
                           "name": str(row.get("name", "")), "detected": float(row["detected"]),
                           "tenant": str(row["tenant"]), "pid": int(row.get("pid", 0))})
        except (ValueError, KeyError, TypeError):
            continue
    return faults
