"""Issue 27 item 10 on the GPU: kernels confined to their tenant's memory, by pilotd's confined
mode ([isolation] tenants = "all" and mps = true: an engine per tenant, each an MPS client with
its own GPU address space; router/mps.py, docs/SECURITY.md).

    PYTHONPATH=/tmp/site python3 tests/gpu/confine_check.py [--out DIR]
        (from the repository root, as root, after tests/gpu/run_compare.sh --install-only)

One run, two pilotds (the default shared one, then a confined one), three parts:
  a. The attack, as control. Tenant V (uid 20001) holds 64 MiB of a random 64-bit pattern;
     tenant A (uid 20002) launches a kernel given V's device address as an integer (so that no
     pointer check of pilot's sees it) that counts the pattern's words there. In the shared
     pilotd (one context per GPU) it must find all of them: the check can fail.
  b. Confined. The same scan finds none of V's bytes (A's kernel faults in A's own engine, or
     reads A's own memory). MPS does not contain that fault (H100, 2026-11-28: its server tears
     down every client, V's data is lost: INFO), but pilotd names A from the MPS server's log and
     marks A's tenant to run without MPS (checked: `pilotctl isolate list`, A's engine shown as
     "engine" and not an MPS client, V's engine and pilotd still are); how long until A's tenant
     runs again. Then the scan again while V has kernels running: A's engine, without MPS, has
     its own address space (0 bytes found) and its fault is its own: V's busy program finishes,
     V's idle data is intact, no new fault reaches the top pilotd, both tenants run again. Last,
     the control daemon is gone after pilotd stops.
  c. Overhead. PyTorch training steps (bench/tenant_worker.py: transformer and cnn) by N = 1
     and N = 4 tenants at once (uids 20011-20014: each its own engine when confined), confined
     vs shared; the ratio of the median step time (issue 27's target: <= 1.10).
Prints PASS/FAIL/INFO lines and a summary table; writes DIR/confine.json (default
$OUT/confine), the pilotds' logs and the workers' there. Exit status 0 when everything passed,
1 if a check failed, 2 if the MPS programs are missing. ~2.5 minutes on an H100.

Without a GPU, to try the script's steps (not the hardware): --backend sim, with a stand-in
nvidia-cuda-mps-control first on PATH (tests/apps/fake_mps_control.py); part c is skipped and
the MPS client checks are INFO only.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from fig1 import as_user, user_env  # bench/fig1.py: another user for a child
from gpu_checks import check, exit_status, info

REPO = Path(__file__).resolve().parents[2]

PYTHON = os.environ.get("PYTHON", sys.executable)
V_UID, A_UID = 20001, 20002  # tenants uid:20001 and uid:20002 (no passwd entry needed)
WORKER_UIDS = (20011, 20012, 20013, 20014)
BUFFER = 64 << 20  # confine_probe.cu's victim buffer
SHARED_CONFIG = "# the default: every tenant in the shared pilotd\n[isolation]\nafter_fault = false\n"
CONFINED_CONFIG = '# the confined mode\n[isolation]\ntenants = "all"\nmps = true\n'
MPS_PROGRAMS = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def running(pid: int) -> bool:
    """pid exists and is not a zombie (a daemon reparented to a PID 1 that does not reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def mps_servers_running() -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"nvidia-cuda-mps-server" in (proc / "cmdline").read_bytes() \
                    and running(int(proc.name)):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def clean_env() -> dict[str, str]:
    drop = ("LD_PRELOAD", "PILOT_SOCKET", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
    return {k: v for k, v in os.environ.items() if k not in drop}


class Pilotd:
    """A pilotd of this script (its own socket and state directory), output in OUT."""

    def __init__(self, name: str, work: Path, out: Path, config: str, backend: str,
                 extra: list[str]) -> None:
        self.name = name
        self.dir = work / name
        self.dir.mkdir(mode=0o755)
        self.socket = self.dir / "pilot.sock"
        (self.dir / "pilotd.toml").write_text(config)
        self.log_path = out / f"pilotd-{name}.log"
        self._log = self.log_path.open("w")
        cmd = [PYTHON, "-m", "pilot.daemon", "--config", str(self.dir / "pilotd.toml"), "--backend",
               backend, "--socket", str(self.socket), "--state-dir", str(self.dir / "state"),
               "--metrics-address", "", "--log-level", "info", *extra]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=clean_env())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120) -> bool:
        deadline = time.monotonic() + timeout
        while "pilotd ready" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                print(self.log()[-3000:], flush=True)
                return False
            time.sleep(0.05)
        return True

    def env(self) -> dict[str, str]:
        return {**clean_env(), "PILOT_SOCKET": str(self.socket)}

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PYTHON, "-m", "pilot.cli.pilotctl", "--control-socket",
                               str(self.dir / "control.sock"), *args], env=self.env(),
                              capture_output=True, text=True, timeout=60)

    def status(self) -> dict[str, Any]:
        proc = self.ctl("status", "--json")
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        self._log.close()
        return self.proc.returncode


class Tenants:
    """Runs confine_probe as the tenants' users, under one pilotd."""

    def __init__(self, probe: Path, shim: str, exchange: Path, homes: Path) -> None:
        self.probe, self.shim, self.exchange, self.homes = probe, shim, exchange, homes

    def env(self, pilot: Pilotd, uid: int) -> dict[str, str]:
        home = self.homes / str(uid)
        home.mkdir(mode=0o777, exist_ok=True)
        home.chmod(0o777)
        return {**pilot.env(), "LD_PRELOAD": self.shim, **user_env(uid, home)}

    def start(self, pilot: Pilotd, uid: int, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.probe), *args], env=self.env(pilot, uid), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=as_user(uid))

    def run(self, pilot: Pilotd, uid: int, *args: str, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([str(self.probe), *args], env=self.env(pilot, uid), text=True,
                                  capture_output=True, timeout=timeout, preexec_fn=as_user(uid))
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, -1, str(exc.stdout or ""), "timed out")

    def runs_again(self, pilot: Pilotd, uid: int, since: float, limit: float = 60) -> float | None:
        """Seconds from `since` until a `work` program of uid's tenant succeeds (None: not
        within `limit`)."""
        while time.time() - since < limit:
            if self.run(pilot, uid, "work", timeout=limit).stdout.strip() == "work: ok":
                return time.time() - since
            time.sleep(0.1)
        return None


def word(lines: list[str], prefix: str, index: int = 1) -> str:
    for line in lines:
        if line.startswith(prefix):
            parts = line.split()
            return parts[index] if len(parts) > index else ""
    return ""


def attack(pilot: Pilotd, t: Tenants, label: str, busy: bool = False) -> dict[str, Any]:
    """V holds the pattern, A scans V's address; with `busy`, V also has kernels running when
    A's scan runs. What each saw, and how long until each tenant ran again."""
    pattern = secrets.randbits(64) | 1  # never 0: A's own zeroed memory cannot match
    addr_file, stop_file = t.exchange / f"addr-{label}", t.exchange / f"stop-{label}"
    victim = t.start(pilot, V_UID, "victim", str(addr_file), f"{pattern:x}", str(stop_file))
    deadline = time.monotonic() + 120
    while not addr_file.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    result: dict[str, Any] = {"label": label}
    if not addr_file.exists():
        victim.kill()
        out, err = victim.communicate()
        result["error"] = f"the victim did not start: {out.strip()} {err.strip()[-500:]}"
        return result
    addr = addr_file.read_text().strip()
    result["victim_addr"] = addr
    rows = json.loads(pilot.ctl("sessions", "--json").stdout or "[]")
    result["sessions"] = sorted({(r["tenant"], r.get("confinement", "?")) for r in rows})
    spinner = t.start(pilot, V_UID, "busy", "6") if busy else None
    if spinner is not None:
        time.sleep(1.5)  # its kernels are running
    scan = t.run(pilot, A_UID, "scan", addr, f"{pattern:x}")
    t_scan = time.time()
    lines = scan.stdout.splitlines()
    result["scan_own_addr"] = word(lines, "scan: own", 2)
    result["scan_error"] = word(lines, "scan: c") or scan.stderr.strip()[-200:] or "no output"
    found = word(lines, "scan: c", 2)
    result["secret_bytes_found"] = int(found) if found.isdigit() else 0
    result["scan_output"] = scan.stdout.strip()
    # both tenants' next programs from the end of the scan, at once
    again: dict[str, float | None] = {}
    tries = [threading.Thread(target=lambda k=k, uid=uid: again.__setitem__(
        k, t.runs_again(pilot, uid, t_scan))) for k, uid in (("a", A_UID), ("v", V_UID))]
    for th in tries:
        th.start()
    for th in tries:
        th.join()
    result["a_runs_again_s"], result["v_runs_again_s"] = again.get("a"), again.get("v")
    if spinner is not None:
        try:
            result["busy_victim"] = spinner.communicate(timeout=60)[0].strip()
        except subprocess.TimeoutExpired:
            spinner.kill()
            result["busy_victim"] = "hung"
    stop_file.touch()
    try:
        out, err = victim.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        victim.kill()
        out, err = victim.communicate()
        err += " (hung)"
    result["victim_output"] = out.strip()
    result["victim_intact"] = "victim: intact" in out
    result["victim_kernel_ok"] = "victim: kernel ok" in out
    return result


def gpu_check(args: argparse.Namespace, ok: bool, text: str) -> None:
    """A check on the GPU; under the sim (no MPS server, no fault of its own) an INFO line."""
    if args.backend == "cuda":
        check(ok, text)
    else:
        info(f"{text} [sim: {'yes' if ok else 'no'}]")


def mps_clients(pilot: Pilotd) -> dict[str, Any]:
    """The servers and clients pilotd's MPS control daemon lists."""
    mc = pilot.status().get("isolation", {}).get("mps_control") or {}
    if not mc:
        return {"error": "no MPS control daemon in pilotctl status"}
    env = {**clean_env(), "CUDA_MPS_PIPE_DIRECTORY": mc["pipe_dir"],
           "CUDA_MPS_LOG_DIRECTORY": mc["log_dir"]}

    def ask(text: str) -> list[int]:
        out = subprocess.run([mc["program"]], input=text + "\n", env=env, capture_output=True,
                             text=True, timeout=30).stdout
        return [int(w) for w in out.split() if w.isdigit()]
    servers = ask("get_server_list")
    clients = sorted({c for s in servers for c in ask(f"get_client_list {s}")})
    return {"control_pid": mc["control_pid"], "servers": servers, "clients": clients}


def overhead(pilot: Pilotd, out: Path, worker: Path, homes: Path, args: argparse.Namespace
             ) -> list[dict[str, Any]]:
    """bench/tenant_worker.py's transformer and cnn steps by N = 1 and 4 tenants at once."""
    from tenants import Worker, run_config  # bench/tenants.py

    cmd = [PYTHON, "-m", "pilot.cli.pilot", "run", "--", PYTHON, str(worker), "--workloads",
           "transformer,cnn"]
    workers: list[Worker] = []
    rows: list[dict[str, Any]] = []
    try:
        for i, uid in enumerate(WORKER_UIDS):
            home = homes / str(uid)
            home.mkdir(mode=0o777, exist_ok=True)
            home.chmod(0o777)
            env = {**pilot.env(), **user_env(uid, home), "PYTHONUNBUFFERED": "1",
                   "PYTHONDONTWRITEBYTECODE": "1"}
            workers.append(Worker(cmd, env, out / f"worker-{pilot.name}-{i}.log",
                                  preexec_fn=as_user(uid)))
        for w in workers:
            w.expect("ready", 240)
        for workload in ("transformer", "cnn"):
            for n in (1, len(WORKER_UIDS)):
                row = run_config(workers, workload, n, args.warm, args.measure, None, None)
                rows.append({k: row[k] for k in ("workload", "n", "aggregate_steps_s", "median_ms",
                                                 "worst_median_ms")})
                info(f"{pilot.name}: {workload} N={n}: median step {row['median_ms']:.2f} ms, "
                     f"{row['aggregate_steps_s']:.1f} steps/s in all")
    finally:
        for w in workers:
            w.stop()
    return rows


def measured(pilot: Pilotd, out: Path, worker: Path, homes: Path, args: argparse.Namespace
             ) -> list[dict[str, Any]]:
    """overhead(), a failure of which is a FAIL line (the rest of the part goes on)."""
    try:
        return overhead(pilot, out, worker, homes, args)
    except Exception as exc:
        check(False, f"c. {pilot.name}: PyTorch workers: {type(exc).__name__}: {exc} "
                     f"(logs: {out}/worker-{pilot.name}-*.log)")
        return []


def shared_part(work: Path, out: Path, t: Tenants, args: argparse.Namespace,
                results: dict[str, Any], worker: Path) -> None:
    pilot = Pilotd("shared", work, out, SHARED_CONFIG, args.backend, args.pilotd_extra)
    try:
        if not pilot.wait_ready():
            check(False, "shared: pilotd started")
            return
        r = attack(pilot, t, "shared")
        results["shared"] = r
        check(r.get("secret_bytes_found") == BUFFER,
              f"a. shared (control): A's kernel read V's secret: {r.get('secret_bytes_found')} of "
              f"{BUFFER} bytes ({r.get('scan_error')}): the check can see a leak")
        check(bool(r.get("victim_intact")), f"a. shared: V's data intact ({r.get('victim_output')!r})")
        check(r.get("sessions") == [(f"uid:{V_UID}", "shared")],
              f"shared: pilotctl sessions shows V's session shared ({r.get('sessions')})")
        if args.overhead:
            results["overhead_shared"] = measured(pilot, out, worker, t.homes, args)
    finally:
        rc = pilot.stop()
        check(rc == 0, f"shared: pilotd stopped cleanly (rc {rc})")


def confined_part(work: Path, out: Path, t: Tenants, args: argparse.Namespace,
                  results: dict[str, Any], worker: Path) -> None:
    pilot = Pilotd("confined", work, out, CONFINED_CONFIG, args.backend, args.pilotd_extra)
    control_pid = 0
    try:
        if not pilot.wait_ready():
            check(False, "confined: pilotd started (with its MPS control daemon)")
            return
        iso = pilot.status().get("isolation", {})
        control_pid = (iso.get("mps_control") or {}).get("control_pid", 0)
        check(bool(iso.get("confined")) and bool(control_pid),
              f"confined: pilotd runs its own MPS control daemon (pid {control_pid})")

        r = attack(pilot, t, "confined")
        results["confined"] = r
        found = r.get("secret_bytes_found")
        how = ("A's kernel faulted in A's own engine" if r.get("scan_error") != "cudaSuccess"
               else "A's kernel read memory of its own address space, not V's")
        check("error" not in r and found == 0,
              f"b. confined: A's scan found {found} bytes of V's secret ({r.get('scan_error')}: {how})")
        info(f"b. confined, A's first fault: V's idle program {r.get('victim_output')!r} "
             f"({'intact' if r.get('victim_intact') else 'MPS tore down every client'})")
        again = r.get("a_runs_again_s")
        check(again is not None, f"b. confined: A's tenant runs again "
                                 f"{'-' if again is None else f'{again:.2f}'} s after its scan ended")
        faults_first = len(pilot.status().get("faults") or [])
        info(f"b. confined: faults the top pilotd saw at A's first fault: {faults_first}")
        marked = json.loads(pilot.ctl("isolate", "list", "--json").stdout or "{}").get("marked", {})
        mark = marked.get(f"uid:{A_UID}", {})
        results["a_mark"] = mark
        text = f"b. confined: A's tenant is marked to run without MPS ({mark or 'no mark'})"
        gpu_check(args, mark.get("mps") is False, text)
        clients = mps_clients(pilot)
        results["mps"] = clients
        rows = pilot.status().get("isolation", {}).get("engines", [])
        kinds = {e["pid"]: e.get("confinement") for e in rows}
        results["engines"] = rows
        confined = [p for p, k in kinds.items() if k == "confined"]
        outside = [p for p, k in kinds.items() if k != "confined"]
        listed = set(clients.get("clients", []))
        verdict = (bool(confined) and set(confined) <= listed and pilot.proc.pid in listed
                   and not set(outside) & listed)
        text = (f"b. confined: pilotd (pid {pilot.proc.pid}) and its confined engines {confined} are "
                f"clients of its MPS server(s) {clients.get('servers')}, A's engine without MPS "
                f"{outside} is not (clients {sorted(listed)})")
        if args.backend == "cuda":
            check(verdict and len(outside) == 1, text)
        else:
            info(text + " [sim: not MPS clients]")
        check(r.get("sessions") == [(f"uid:{V_UID}", "confined")],
              f"confined: pilotctl sessions shows V's session confined ({r.get('sessions')})")

        if args.overhead:
            results["overhead_confined"] = measured(pilot, out, worker, t.homes, args)

        b = attack(pilot, t, "confined-busy", busy=True)
        results["confined_busy"] = b
        check("error" not in b and b.get("secret_bytes_found") == 0,
              f"b. confined, V busy: A's scan (its engine without MPS: its own address space) "
              f"found {b.get('secret_bytes_found')} bytes of V's secret ({b.get('scan_error')})")
        check(str(b.get("busy_victim", "")).startswith("busy: ok"),
              f"b. confined, V busy: V's kernels ran through A's second fault, contained in A's "
              f"engine ({b.get('busy_victim')!r})")
        check(bool(b.get("victim_intact")) and bool(b.get("victim_kernel_ok")),
              f"b. confined, V busy: V's idle data is intact and its kernels run after A's second "
              f"fault ({b.get('victim_output')!r})")
        a_again, v_again = b.get("a_runs_again_s"), b.get("v_runs_again_s")
        check(a_again is not None and v_again is not None,
              f"b. confined, V busy: both tenants run again (A after "
              f"{'-' if a_again is None else f'{a_again:.2f}'} s, V after "
              f"{'-' if v_again is None else f'{v_again:.2f}'} s)")
        faults_now = len(pilot.status().get("faults") or [])
        text = (f"b. confined: A's second fault did not reach the top pilotd (its faults: "
                f"{faults_first}, then {faults_now})")
        gpu_check(args, faults_now == faults_first, text)
        waits = [line for line in pilot.log().splitlines() if "MPS took this process after" in line]
        info(f"engines' CUDA initializations that waited for MPS: {len(waits)}"
             + (f" (last: {waits[-1].split('after')[-1].strip()})" if waits else ""))
        results["mps_waits"] = waits
    finally:
        rc = pilot.stop()
        check(rc == 0, f"confined: pilotd stopped cleanly (rc {rc})")
        if control_pid:  # quit by a helper once pilotd has exited (router/mps.py)
            deadline = time.monotonic() + 20
            while running(control_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            gone = not running(control_pid)
            check(gone, f"confined: its MPS control daemon (pid {control_pid}) is gone after pilotd's exit")
        info(f"MPS servers still running after pilotd's exit: {mps_servers_running() or 'none'}")
        logs = pilot.dir / "state" / "mps" / "log"  # control.log, server.log, pilotd-quit.log
        if logs.is_dir():
            shutil.copytree(logs, out / "mps-log", dirs_exist_ok=True)


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    shared = {(r["workload"], r["n"]): r for r in results.get("overhead_shared", [])}
    out = []
    for r in results.get("overhead_confined", []):
        s = shared.get((r["workload"], r["n"]))
        if s and s["median_ms"] and r["median_ms"]:
            out.append({"workload": r["workload"], "n": r["n"], "shared_ms": s["median_ms"],
                        "confined_ms": r["median_ms"], "ratio": r["median_ms"] / s["median_ms"],
                        "throughput_ratio": s["aggregate_steps_s"] / r["aggregate_steps_s"]
                        if r["aggregate_steps_s"] else None})
    return out


def summary(results: dict[str, Any]) -> str:
    s, c, b = (results.get(k, {}) for k in ("shared", "confined", "confined_busy"))

    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} s"

    def data(r: dict[str, Any]) -> str:
        return "intact" if r.get("victim_intact") else repr(r.get("victim_output", "-"))
    lines = ["| | shared (default) | confined |", "| --- | --- | --- |",
             f"| bytes of V's secret A's kernel found (of {BUFFER}) | {s.get('secret_bytes_found', '-')} "
             f"| {c.get('secret_bytes_found', '-')} |",
             f"| A's scan ended with | {s.get('scan_error', '-')} | {c.get('scan_error', '-')} |",
             f"| V's data afterwards (confined: A's first fault, under MPS) | {data(s)} | {data(c)} |",
             f"| A's tenant runs again after | {secs(s.get('a_runs_again_s'))} "
             f"| {secs(c.get('a_runs_again_s'))} |",
             f"| A's tenant then marked without MPS | - | {results.get('a_mark', {}).get('mps') is False} |",
             f"| second scan (A without MPS, V busy): bytes found | - | {b.get('secret_bytes_found', '-')} |",
             f"| V with kernels running at A's second fault | - | {b.get('busy_victim', '-')!r} |",
             f"| V's idle program then | - | {b.get('victim_output', '-')!r} |",
             f"| tenants run again after (A, V) | - | {secs(b.get('a_runs_again_s'))}, "
             f"{secs(b.get('v_runs_again_s'))} |"]
    rs = results.get("ratios", [])
    if rs:
        lines += ["", "| workload | N | shared median ms | confined median ms | confined/shared | "
                      "throughput shared/confined |", "| --- | --- | --- | --- | --- | --- |"]
        for r in rs:
            tr = r["throughput_ratio"]
            lines.append(f"| {r['workload']} | {r['n']} | {r['shared_ms']:.2f} | {r['confined_ms']:.2f} "
                         f"| {r['ratio']:.3f} | {'-' if tr is None else f'{tr:.3f}'} |")
        worst = max(r["ratio"] for r in rs)
        lines.append(f"\nworst confined/shared median step: {worst:.3f} (target <= 1.10); "
                     f"geometric mean {statistics.geometric_mean([r['ratio'] for r in rs]):.3f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path,
                    default=Path(os.environ.get("OUT", "/tmp/pilot-gpu-out")) / "confine")
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--warm", type=float, default=1.0, help="seconds of steps before each measure")
    ap.add_argument("--measure", type=float, default=2.0, help="seconds measured per configuration")
    ap.add_argument("--no-overhead", dest="overhead", action="store_false", help="skip part c")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    programs = MPS_PROGRAMS if args.backend == "cuda" else MPS_PROGRAMS[:1]
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        print(f"FAIL the MPS programs are missing: {', '.join(missing)} (the NVIDIA driver's "
              "utilities): the confined mode cannot run here", flush=True)
        return 2
    args.pilotd_extra = []
    if args.backend == "sim":
        args.overhead = False
        args.pilotd_extra = ["--sim-kernels", str(REPO / "tests/gpu/confine_sim_kernels.py")]
    if os.geteuid() != 0:
        print("FAIL run as root: the tenants are other users", flush=True)
        return 1

    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="pilot-confine-"))
    work.chmod(0o755)
    exchange, homes = work / "exchange", work / "homes"
    for d in (exchange, homes):
        d.mkdir()
        d.chmod(0o777)
    probe = work / "confine_probe"
    subprocess.run(["nvcc", "-cudart", "shared", "-O2", "-arch=sm_90", "-o", str(probe),
                    str(REPO / "tests/gpu/confine_probe.cu")], check=True)
    worker = work / "tenant_worker.py"  # where every tenant's user can read it
    shutil.copy(REPO / "bench" / "tenant_worker.py", worker)
    worker.chmod(0o644)
    shim = subprocess.run([PYTHON, "-m", "pilot.cli.pilot", "shim-path"], capture_output=True,
                          text=True, check=True).stdout.strip()
    tenants = Tenants(probe, shim, exchange, homes)
    results: dict[str, Any] = {"backend": args.backend, "gpu": subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else ""}
    try:
        for part in (shared_part, confined_part):
            try:
                part(work, args.out, tenants, args, results, worker)
            except Exception as exc:  # the other part still runs
                check(False, f"{part.__name__}: {type(exc).__name__}: {exc}")
    finally:
        results["ratios"] = ratios(results)
        results["seconds"] = round(time.monotonic() - t_start, 1)
        (args.out / "confine.json").write_text(json.dumps(results, indent=1))
        shutil.rmtree(work, ignore_errors=True)
    for r in results["ratios"]:
        check(r["ratio"] <= 1.10, f"c. {r['workload']} N={r['n']}: confined/shared median step "
                                  f"{r['ratio']:.3f} (target <= 1.10)")
    text = summary(results)
    (args.out / "confine.md").write_text(text + "\n")
    print("\n" + text, flush=True)
    info(f"confine_check took {results['seconds']} s; numbers in {args.out / 'confine.json'}")
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
