"""Isolation mode: a tenant whose work runs in a pilotd process of its own, so that its kernel
faults reach only its own sessions.

Why a process and not a context: on the H100 a fault poisons every context of the faulting
process on that device, created and green contexts included (tests/gpu/fault_probe.py), so the
only boundary that holds is the process. An *isolated tenant* is served by an **engine**: a
pilotd started by this one with the same command line and settings plus `--isolated-tenant T`
(it serves T alone), its own sockets under `<socket dir>/isolated/<T>/`, no metrics endpoint,
and a capacity per GPU: by default the same as this pilotd's, so a program sees the same GPU
isolated or not (the two processes' allocations together are then bounded by the GPU itself,
as between native processes: the driver's out-of-memory decides); with `[isolation] capacity`
set, that much, withheld from this pilotd's budget while the engine runs. An engine recovers
from its own faults like any pilotd (router/recovery.py) while the others' work goes on.

A program of an isolated tenant says HELLO to the main socket as always; the router answers
PILOT_HELLO_REDIRECT with the engine's main socket, and the shim says HELLO there (the engine
takes the program's identity from the kernel, like any pilotd). The engine's listening socket
is made here and handed over at its start, so programs wait in its backlog while it starts
(CUDA initialization, ~1 s on an H100). An engine with no session for `[isolation] idle_exit`
ends; the next program of the tenant starts a new one.

Who is isolated: `[isolation] tenants` (a list, or "all"), and the tenants marked at run time:
by an operator (`pilotctl isolate set T`), or by a kernel fault of theirs when
`[isolation] after_fault` is on (the fault's tenant must be known). Marks persist in
`isolation.json` in the state directory until `pilotctl isolate clear T`.

What it costs: an engine's kernels and the other tenants' do not run at the same time on the
GPU (processes without MPS are time-sliced), and an engine holds its own CUDA context (~0.5 GiB
of device memory) and capacity share (bench/RESULTS.md, "isolation").

With `[isolation] mps` the engines (and this pilotd) are clients of pilotd's own MPS control
daemon (router/mps.py; they inherit its environment): their kernels run at once, and each has its
own GPU address space, so a tenant's device code cannot reach another's memory. With
`tenants = "all"` too, that is the *confined* mode (docs/SECURITY.md).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from pilot.daemon.config import Config
from pilot.daemon.protocol import ask_sessions
from pilot.daemon.resources.broker import GpuBudget
from pilot.daemon.router.recovery import RECOVERY_ENV

log = logging.getLogger("pilot.isolation")

ISOLATION_FILE = "isolation.json"
LISTEN_BACKLOG = 512


CONFINED, ENGINE, SHARED = "confined", "engine", "shared"


def confinement(config: Config) -> str:
    """Where this process's sessions run, as `pilotctl sessions` shows it: "confined" (an engine
    over MPS: its own GPU address space), "engine" (a process of its own without MPS: its faults
    are its own, its kernels share no context, but are time-sliced), or "shared" (the shared
    pilotd: one context per GPU with the other shared tenants)."""
    if config.isolated_tenant is None:
        return SHARED
    return CONFINED if config.isolation_mps else ENGINE


class EngineError(Exception):
    """An isolated tenant's pilotd cannot be started (no capacity left, a socket problem)."""


class IsolationList:
    """Which tenants are isolated: the configured ones and those marked at run time (persisted)."""

    def __init__(self, state_dir: str, configured: tuple[str, ...]) -> None:
        self.path = os.path.join(state_dir, ISOLATION_FILE)
        self.configured = configured
        self._marked: dict[str, dict[str, Any]] = {}
        self.reload()

    def reload(self) -> None:
        try:
            with open(self.path) as f:
                data = json.load(f)
            self._marked = {str(t): dict(v) for t, v in data.get("tenants", {}).items()}
        except FileNotFoundError:
            self._marked = {}
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            log.error("%s unreadable (%s): no tenant marked isolated", self.path, exc)
            self._marked = {}

    def isolated(self, tenant: str) -> bool:
        return "all" in self.configured or tenant in self.configured or tenant in self._marked

    def mark(self, tenant: str, why: str) -> None:
        self._marked[tenant] = {"since": time.time(), "why": why}
        self._save()
        log.warning("tenant %s runs isolated from now on (%s); `pilotctl isolate clear %s` ends it",
                    tenant, why, tenant, extra={"tenant": tenant})

    def clear(self, tenant: str) -> bool:
        if self._marked.pop(tenant, None) is None:
            return False
        self._save()
        log.info("tenant %s no longer marked isolated", tenant, extra={"tenant": tenant})
        return True

    def describe(self) -> dict[str, Any]:
        return {"configured": list(self.configured), "marked": dict(self._marked)}

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"tenants": self._marked}, f, indent=1)
        os.replace(tmp, self.path)


@dataclass
class Engine:
    """One isolated tenant's pilotd (a child of this process)."""

    tenant: str
    pid: int
    socket: str  # its main socket
    started: float
    capacity: int  # device memory it grants per GPU
    withheld: int = 0  # what this pilotd's budget holds back for it, per GPU

    def alive(self) -> bool:
        """Reaps it when it has exited (it is this process's child)."""
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return pid == 0


def _safe_name(tenant: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tenant)[:48] or "_"


class Engines:
    """The running engines, by tenant (router thread)."""

    def __init__(self, socket_path: str, budget: GpuBudget, gpus: list[int], capacity: int | None,
                 argv: list[str] | None = None, mps: bool = False) -> None:
        self.base = os.path.join(os.path.dirname(socket_path) or ".", "isolated")
        self.budget = budget
        self.gpus = gpus
        self.capacity = capacity
        self.mps = mps  # engines are MPS clients (they inherit the environment router/mps.py set)
        # the command line this pilotd was started with: engines get its settings
        self.argv = argv if argv is not None else list(getattr(sys, "orig_argv", []) or
                                                       [sys.executable, *sys.argv])
        self._engines: dict[str, Engine] = {}
        self._started = 0  # engines started by this process: each numbers its sessions apart

    def __len__(self) -> int:
        return len(self._engines)

    def _capacity(self) -> tuple[int, int]:
        """(what the engine grants per GPU, what this pilotd withholds for it)."""
        if self.capacity is not None:
            return self.capacity, self.capacity
        return min(self.budget.capacity(g) for g in self.gpus), 0

    def socket_for(self, tenant: str) -> str:
        """The main socket of `tenant`'s engine, started if it is not running."""
        engine = self._engines.get(tenant)
        if engine is not None and engine.alive():
            return engine.socket
        if engine is not None:
            self._ended(engine)
        return self._start(tenant).socket

    def _start(self, tenant: str) -> Engine:
        capacity, withheld = self._capacity()
        taken: list[int] = []
        for gpu in self.gpus:
            if not self.budget.reserve(gpu, withheld):
                for g in taken:
                    self.budget.release(g, withheld)
                raise EngineError(f"GPU {gpu} has not {withheld} bytes left for an isolated tenant")
            taken.append(gpu)
        directory = os.path.join(self.base, _safe_name(tenant))
        path = os.path.join(directory, "pilot.sock")
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            os.chmod(self.base, 0o755)
            os.chmod(directory, 0o755)
            for stale in os.listdir(directory):
                os.unlink(os.path.join(directory, stale))
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(LISTEN_BACKLOG)
            os.chmod(path, 0o666)  # access is decided by peer credentials
            env = dict(os.environ)
            self._started += 1
            # session ids of an engine start at a million times its number, apart from the
            # shared pilotd's (in logs, which engines share)
            first = self._started * 1_000_000 + 1
            env[RECOVERY_ENV] = json.dumps({"fds": {"main": listener.fileno()},
                                            "next_session": first})
            cmd = [*self.argv, "--socket", path, "--control-socket",
                   os.path.join(directory, "control.sock"), "--metrics-address", "",
                   "--capacity", f"{capacity}B", "--isolated-tenant", tenant]
            # stdout: pilotd's own, not the driver's (captured for kernels' printf output,
            # vgpu/device_output.py); the engine captures its own
            proc = subprocess.Popen(cmd, env=env, pass_fds=[listener.fileno()],
                                    stdin=subprocess.DEVNULL, stdout=sys.stdout)
            listener.close()  # the engine has its own copy
        except OSError as exc:
            for g in taken:
                self.budget.release(g, withheld)
            raise EngineError(f"cannot start the isolated pilotd of {tenant}: {exc}") from exc
        engine = Engine(tenant, proc.pid, path, time.time(), capacity, withheld)
        self._engines[tenant] = engine
        log.info("tenant %s: isolated pilotd started (pid %d, %s, %d bytes per GPU)", tenant,
                 proc.pid, path, capacity, extra={"tenant": tenant})
        return engine

    def _ended(self, engine: Engine) -> None:
        self._engines.pop(engine.tenant, None)
        for gpu in self.gpus:
            self.budget.release(gpu, engine.withheld)
        log.info("tenant %s: isolated pilotd (pid %d) ended", engine.tenant, engine.pid,
                 extra={"tenant": engine.tenant})

    def reap(self) -> None:
        for engine in list(self._engines.values()):
            if not engine.alive():
                self._ended(engine)

    def adopt(self, engines: list[dict[str, Any]]) -> None:
        """Engines a previous process of this pilotd started (they are this pid's children)."""
        for e in engines:
            engine = Engine(**e)
            if engine.alive():
                for gpu in self.gpus:
                    self.budget.reserve(gpu, engine.withheld)
                self._engines[engine.tenant] = engine

    def sessions(self, timeout_ms: int = 500) -> list[dict[str, Any]]:
        """Every engine's sessions (SESSIONS on its main socket; this pilotd's uid sees all),
        each row marked with `isolated: True`. An engine that does not answer in time is left
        out (it is starting or restarting)."""
        rows: list[dict[str, Any]] = []
        for engine in list(self._engines.values()):
            for row in ask_sessions(engine.socket, timeout_ms) or []:
                rows.append({**row, "isolated": True})
        return rows

    def handover(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self._engines.values()]

    def describe(self) -> list[dict[str, Any]]:
        return [{"tenant": e.tenant, "pid": e.pid, "socket": e.socket, "started": e.started,
                 "capacity": e.capacity, "withheld": e.withheld,
                 "confinement": CONFINED if self.mps else ENGINE} for e in self._engines.values()]

    def reread_quotas(self) -> None:
        """SIGHUP to every engine: a quota changed here, and they enforce it too."""
        for engine in self._engines.values():
            try:
                os.kill(engine.pid, 1)
            except ProcessLookupError:
                pass

    def stop_tenant(self, tenant: str) -> list[int]:
        """End `tenant`'s engine, and so every session it serves (`pilotctl kill --tenant`, a
        Slurm epilog). Returns those sessions."""
        engine = self._engines.get(tenant)
        if engine is None:
            return []
        ended = [int(r["session"]) for r in ask_sessions(engine.socket, 500) or []]
        self._stop([engine])
        return ended

    def stop_all(self, timeout: float = 20) -> None:
        """SIGTERM every engine and wait for them (their sessions' programs then get errors)."""
        self._stop(list(self._engines.values()), timeout)

    def _stop(self, engines: list[Engine], timeout: float = 20) -> None:
        for engine in engines:
            try:
                os.kill(engine.pid, 15)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for engine in engines:
            while engine.alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            if engine.alive():
                os.kill(engine.pid, 9)
                os.waitpid(engine.pid, 0)
            self._ended(engine)
