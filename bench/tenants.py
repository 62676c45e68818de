#!/usr/bin/env python3
"""Many tenants at once (issue 25): N PyTorch processes sharing the GPU under time-slicing, MPS and
pilot's default configuration, side by side in one run.

    python3 bench/tenants.py --out DIR [--modes timeslice,pilot,confined,mps] [--ns 1,2,4,8,16]
                             [--workloads transformer,cnn,graph,mix] [--rounds 2]
                             [--warm 1.0] [--measure 2.0] [--profile CONFIG]

For each mode, max(N) worker processes (bench/tenant_worker.py) start once and build every
workload (the graph workload compiles with torch.compile once; later workers hit Inductor's
cache). Then, for each round, workload and N, the first N workers run that workload in the same
time window: WARM seconds of steps, then MEASURE seconds in which each step (synchronized) is
timed; the others stay idle. `mix` runs N/2 transformer and N/2 cnn workers at once. Per
configuration: each process's median and worst step time (ms), and the aggregate steps/s (the
sum over processes of the steps each finished in the window, per second).

Modes, in this order: timeslice (the processes as they are: the driver time-slices their
contexts), pilot (a pilotd started here with an empty config, the workers under `pilot run`),
confined (pilot's confined mode: `[isolation] tenants = "all"`, `mps = true`; worker i runs as
uid 21000 + i, so each is a tenant with an engine of its own, an MPS client: N processes submit
instead of one, which one process's ceiling calls for, bench/one_context.sh; run as root), mps
(a private nvidia-cuda-mps-control, stopped after the mode). Ratios against MPS at the same
N and workload: aggregate pilot/MPS (target >= 0.95) and median step pilot/MPS (target <= 1.15);
graph inference per call against timeslice N=1 (native alone; target <= 1.3).

--profile WORKLOAD:N samples pilotd with py-spy (from $PYSPY, PATH or $PILOT_TOOLS/bin, where
tests/gpu/env.sh installs the carried wheel) during that configuration's measured window of the
last round (py-spy --gil then --idle per-thread samples), and each pilotd thread's CPU time is
read from /proc (by thread name: pilotd names its threads for the OS) for every pilot
configuration. Outputs in --out: tenants.json, tenants.md, tenants.png (with matplotlib),
the daemons' and workers' logs, profile-*.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fig1 import Mps, Pilotd, as_user, clean_env, user_env  # bench/fig1.py: the MPS, pilotd, uid helpers

BENCH = Path(__file__).resolve().parent
WORKER = BENCH / "tenant_worker.py"
MODES = ("timeslice", "pilot", "confined", "mps")
CONFINED_CONFIG = '# the confined mode\n[isolation]\ntenants = "all"\nmps = true\n'
CONFINED_UID = 21000  # worker i runs as uid 21000 + i: a tenant of its own
WORKLOADS = ("transformer", "cnn", "graph", "mix")
READY_TIMEOUT_S = 600.0


def log(msg: str) -> None:
    print(f"[tenants] {msg}", file=sys.stderr, flush=True)


class Worker:
    """One tenant process: commands on stdin, results on stdout, stderr to a log file."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        """`preexec_fn`: run in the child before the exec (another user: tests/gpu/confine_check.py)."""
        self.err: IO[str] = log_path.open("w")
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, bufsize=1, preexec_fn=preexec_fn)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.strip())
                self.cond.notify_all()
        with self.cond:
            self.lines.append("EOF")
            self.cond.notify_all()

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i, line in enumerate(self.lines):
                    if line.startswith(prefix) or line == "EOF":
                        del self.lines[: i + 1]
                        if line == "EOF":
                            raise RuntimeError(f"worker {self.proc.pid} exited "
                                               f"(rc {self.proc.poll()}) before '{prefix}'")
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"worker {self.proc.pid}: no '{prefix}' within {timeout:.0f} s")
                self.cond.wait(left)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(20)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of pid, by thread name (names that repeat are summed)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def scrape(url: str) -> dict[str, float]:
    """The counters of pilotd's /metrics worth a per-step look: calls by function, the time
    synchronous calls took, and what the C fast path did."""
    import urllib.request
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(("pilot_calls_total", "pilot_call_latency_seconds_sum", "pilot_fast_",
                                "pilot_library_calls_total", "pilot_kernels_launched_total")):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
    return out


def find_pyspy() -> str | None:
    for cand in (os.environ.get("PYSPY"), shutil.which("py-spy"),
                 os.path.join(os.environ.get("PILOT_TOOLS", "/tmp/site-tools"), "bin", "py-spy")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def assignment(workload: str, n: int) -> list[str]:
    if workload == "mix":
        return ["transformer"] * (n // 2) + ["cnn"] * (n - n // 2)
    return [workload] * n


def run_config(workers: list[Worker], workload: str, n: int, warm: float, measure: float,
               daemon_pid: int | None, profile: tuple[str, str] | None,
               metrics_url: str | None = None) -> dict[str, Any]:
    names = assignment(workload, n)
    start = time.time() + 0.5
    for w, name in zip(workers, names, strict=False):
        w.send(f"run {name} {start:.3f} {warm} {measure}")
    spies: list[subprocess.Popen[bytes]] = []
    cpu0: dict[str, float] = {}
    if daemon_pid is not None:
        time.sleep(max(0.0, start + warm - time.time()))
        cpu0 = thread_cpu(daemon_pid)
        m0 = scrape(metrics_url) if metrics_url else {}
        if profile is not None:
            pyspy, prefix = profile
            half = max(1, int(measure / 2))
            for k, extra in enumerate((["--gil"], ["--idle"])):
                spy_log = open(f"{prefix}-{extra[0][2:]}.log", "w")
                spies.append(subprocess.Popen(
                    [pyspy, "record", "-p", str(daemon_pid), "--threads", "--nonblocking", "-f", "raw",
                     "-r", "1000", "-d", str(half), "-o", f"{prefix}-{extra[0][2:]}.txt", *extra],
                    stdout=spy_log, stderr=subprocess.STDOUT))
                if k == 0:
                    spies[0].wait()
        time.sleep(max(0.0, start + warm + measure - time.time()))
    cpu1 = thread_cpu(daemon_pid) if daemon_pid is not None else {}
    m1 = scrape(metrics_url) if metrics_url and daemon_pid is not None else {}
    for s in spies:
        s.wait()
    procs = []
    for w, name in zip(workers, names, strict=False):
        words = w.expect("result", warm + measure + 120).split()
        times = [float(t) for t in words[3:]]
        procs.append({"pid": w.proc.pid, "workload": name, "steps": len(times),
                      "median_ms": statistics.median(times) if times else None,
                      "worst_ms": max(times) if times else None})
    agg = sum(p["steps"] for p in procs) / measure
    meds = [p["median_ms"] for p in procs if p["median_ms"] is not None]
    row = {"workload": workload, "n": n, "aggregate_steps_s": agg,
           "median_ms": statistics.median(meds) if meds else None,
           "worst_median_ms": max(meds) if meds else None,
           "worst_ms": max((p["worst_ms"] for p in procs if p["worst_ms"] is not None), default=None),
           "procs": procs}
    if cpu1:
        row["pilotd_cpu"] = {k: round((cpu1[k] - cpu0.get(k, 0.0)) / measure, 3)
                             for k in cpu1 if cpu1[k] - cpu0.get(k, 0.0) > 0.005 * measure}
    if m1:
        steps = max(1, sum(p["steps"] for p in procs))
        per_step = {k: round((v - m0.get(k, 0.0)) / steps, 4) for k, v in m1.items()
                    if v - m0.get(k, 0.0) > 0}
        row["pilotd_per_step"] = dict(sorted(per_step.items(), key=lambda kv: -kv[1]))
    return row


def run_mode(mode: str, args: argparse.Namespace, work: Path, out: Path) -> list[dict[str, Any]]:
    env = {**clean_env(), "PYTHONUNBUFFERED": "1"}
    prefix: list[str] = []
    daemon: Pilotd | None = None
    mps: Mps | None = None
    user: UserOf = same_user
    if mode in ("pilot", "confined"):
        extra = list(args.pilotd_arg)
        if args.metrics_port:
            extra += ["--metrics-address", f"127.0.0.1:{args.metrics_port}"]
        saved = dict(os.environ)
        os.environ.update(kv.split("=", 1) for kv in args.pilotd_env)  # pilotd's only
        try:
            daemon = Pilotd(args.python, "cuda", work, out / f"pilotd-{mode}.log", extra,
                            **({"config_text": CONFINED_CONFIG} if mode == "confined" else {}))
        finally:
            os.environ.clear()
            os.environ.update(saved)
        daemon.wait_ready(120)
        env["PILOT_SOCKET"] = daemon.socket
        prefix = [args.python, "-m", "pilot.cli.pilot", "run", "--"]
        if mode == "confined":
            user = confined_user(work)
    elif mode == "mps":
        mps = Mps(shutil.which(args.mps_control) or args.mps_control, work)
        mps.start()
        env.update(mps.env)
    nmax = max(args.ns)
    workers: list[Worker] = []
    rows: list[dict[str, Any]] = []
    try:
        cmd = [*prefix, args.python, str(WORKER), "--workloads",
               ",".join(sorted({w for wl in args.workloads for w in assignment(wl, 2)}))]
        # One first (it fills Inductor's cache), then the rest together.
        def start(i: int) -> Worker:
            more, preexec = user(i)
            return Worker(cmd, {**env, **more}, out / f"worker-{mode}-{i}.log", preexec_fn=preexec)

        workers.append(start(0))
        workers[0].expect("ready", READY_TIMEOUT_S)
        for i in range(1, nmax):
            workers.append(start(i))
        for w in workers[1:]:
            w.expect("ready", READY_TIMEOUT_S)
        log(f"{mode}: {nmax} workers ready")
        if mps is not None and not mps.servers():
            raise RuntimeError("MPS: no server running: the workers did not use MPS")
        pyspy = find_pyspy() if args.profile and daemon is not None else None
        if args.profile and daemon is not None and pyspy is None:
            log("--profile: no py-spy ($PYSPY, PATH, $PILOT_TOOLS/bin): pilotd is not sampled")
        for rnd in range(args.rounds):
            for wl in args.workloads:
                for n in args.ns:
                    if wl == "mix" and n < 2:
                        continue
                    prof = None
                    if pyspy and rnd == args.rounds - 1 and args.profile == f"{wl}:{n}":
                        prof = (pyspy, str(out / f"profile-{wl}-{n}"))
                    url = (f"http://127.0.0.1:{args.metrics_port}/metrics"
                           if daemon and args.metrics_port else None)
                    row = run_config(workers, wl, n, args.warm, args.measure,
                                     daemon.proc.pid if daemon else None, prof, url)
                    row.update(mode=mode, round=rnd)
                    rows.append(row)
                    log(f"{mode} r{rnd} {wl} N={n}: agg {row['aggregate_steps_s']:.1f} steps/s, "
                        f"median {row['median_ms']:.2f} ms, worst median {row['worst_median_ms']:.2f} ms"
                        + (f", pilotd cpu {row['pilotd_cpu']}" if row.get("pilotd_cpu") else ""))
    finally:
        for w in workers:
            w.stop()
        if daemon is not None:
            daemon.stop()
        if mps is not None:
            mps.stop()
            mps.copy_logs(out)
    return rows


UserOf = Callable[[int], tuple[dict[str, str], Callable[[], None] | None]]  # worker i -> env, preexec


def same_user(i: int) -> tuple[dict[str, str], Callable[[], None] | None]:
    """Every worker as this process's user (timeslice, pilot, mps)."""
    return {}, None


def confined_user(work: Path) -> UserOf:
    """The confined mode's worker i: uid CONFINED_UID + i (so a tenant, an engine and an MPS
    client of its own), a home of its own, and one Inductor cache for all (worker 0 fills it)."""
    cache = work / "inductor"
    cache.mkdir(mode=0o777)
    cache.chmod(0o1777)

    def user(i: int) -> tuple[dict[str, str], Callable[[], None] | None]:
        uid = CONFINED_UID + i
        home = work / f"home-{uid}"
        home.mkdir(mode=0o700)
        os.chown(home, uid, uid)
        become = as_user(uid)

        def preexec() -> None:
            os.umask(0)  # what worker 0 writes into the shared cache the others may update
            become()
        return {**user_env(uid, home), "TORCHINDUCTOR_CACHE_DIR": str(cache)}, preexec
    return user


def summarize(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, float]]:
    """Per (mode, workload, N): the median over rounds of the aggregate and of the median step."""
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["mode"], r["workload"], r["n"]), []).append(r)
    out = {}
    for key, rs in cells.items():
        out[key] = {"agg": statistics.median(r["aggregate_steps_s"] for r in rs),
                    "med": statistics.median(r["median_ms"] for r in rs),
                    "worst": max(r["worst_median_ms"] for r in rs)}
    return out


def table(rows: list[dict[str, Any]], modes: list[str]) -> str:
    s = summarize(rows)
    keys = sorted({(w, n) for _, w, n in s}, key=lambda k: (WORKLOADS.index(k[0]), k[1]))
    head = ["workload", "N"]
    for m in modes:
        head += [f"{m} agg/s", f"{m} med ms", f"{m} worst ms"]
    against = [m for m in ("pilot", "confined") if m in modes and "mps" in modes]
    for m in against:
        head += [f"{m}/MPS agg", f"{m}/MPS med"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for w, n in keys:
        cells = [w, str(n)]
        for m in modes:
            c = s.get((m, w, n))
            cells += ([f"{c['agg']:.1f}", f"{c['med']:.2f}", f"{c['worst']:.2f}"] if c else ["-"] * 3)
        for m in against:
            p, q = s.get((m, w, n)), s.get(("mps", w, n))
            cells += ([f"{p['agg'] / q['agg']:.2f}", f"{p['med'] / q['med']:.2f}"] if p and q else ["-", "-"])
        lines.append("| " + " | ".join(cells) + " |")
    native = s.get(("timeslice", "graph", 1))
    pilot1 = s.get(("pilot", "graph", 1))
    if native and pilot1:
        lines.append(f"\ngraph inference alone: pilot {pilot1['med']:.3f} ms per call, native "
                     f"{native['med']:.3f} ms: {pilot1['med'] / native['med']:.2f}x")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], modes: list[str], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib: no plot")
        return
    s = summarize(rows)
    wls = [w for w in WORKLOADS if any(k[1] == w for k in s)]
    fig, axes = plt.subplots(2, len(wls), figsize=(4.2 * len(wls), 7), squeeze=False)
    for j, w in enumerate(wls):
        for m in modes:
            pts = sorted((n, c) for (mm, ww, n), c in s.items() if mm == m and ww == w)
            if not pts:
                continue
            ns = [p[0] for p in pts]
            axes[0][j].plot(ns, [p[1]["agg"] for p in pts], marker="o", label=m)
            axes[1][j].plot(ns, [p[1]["med"] for p in pts], marker="o", label=m)
        axes[0][j].set_title(w)
        axes[0][j].set_ylabel("aggregate steps/s")
        axes[1][j].set_ylabel("median step ms (per process)")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N processes")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--modes", default="timeslice,pilot,mps", help=f"of {','.join(MODES)}")
    ap.add_argument("--ns", default="1,2,4,8,16")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--measure", type=float, default=2.0)
    ap.add_argument("--python", default=os.environ.get("PYTHON", sys.executable))
    ap.add_argument("--mps-control", default="nvidia-cuda-mps-control")
    ap.add_argument("--pilotd-arg", action="append", default=[], help="extra pilotd argument (repeatable)")
    ap.add_argument("--pilotd-env", action="append", default=[],
                    help="KEY=VALUE in pilotd's environment (repeatable; then not the default)")
    ap.add_argument("--metrics-port", type=int, default=0,
                    help="pilot mode: serve pilotd's metrics there and record per-step call counts")
    ap.add_argument("--profile", default="", help="WORKLOAD:N to sample pilotd with py-spy")
    args = ap.parse_args()
    args.ns = sorted(int(x) for x in args.ns.split(","))
    args.workloads = [w for w in WORKLOADS if w in args.workloads.split(",")]
    modes = [m for m in MODES if m in args.modes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    status = 0
    for mode in modes:
        work = Path(tempfile_dir(mode))
        try:
            rows += run_mode(mode, args, work, args.out)
        except Exception as exc:  # one mode failing still reports the others
            log(f"{mode} failed: {exc}")
            status = 1
        finally:
            shutil.rmtree(work, ignore_errors=True)
        (args.out / "tenants.json").write_text(json.dumps(rows, indent=1))
    text = table(rows, modes)
    (args.out / "tenants.md").write_text(text + "\n")
    print(text)
    plot(rows, modes, args.out / "tenants.png")
    return status


def tempfile_dir(mode: str) -> str:
    path = tempfile.mkdtemp(prefix=f"pilot-tenants-{mode}-")
    os.chmod(path, 0o755)
    return path


if __name__ == "__main__":
    sys.exit(main())
