"""PyTorch training by several tenants at once under pilot (issue 13, item (d)), on the GPU machine:
two training processes of two tenants (root and nobody), each under a memory quota, run side by
side and both finish with native's loss curves; a third tenant whose quota is smaller than what
it asks for gets torch.OutOfMemoryError (and goes on), while the other two are unaffected.

    python3 tests/gpu/torch_tenants.py        (after tests/gpu/run_compare.sh --install-only)

Writes $OUT/torch-tenants/ (each process's output, pilotd's log); exit status 0 when all holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_checks import check, exit_status, info

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/pilot-gpu-out")) / "torch-tenants"
PYTHON = os.environ.get("PYTHON", "python3")
PROBE = REPO / "tests" / "gpu" / "torch" / "probe.py"
NOBODY, DAEMON_UID = 65534, 1  # a second and a third tenant: user:nobody, user:daemon


def as_user(uid: int) -> object:
    def switch() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return switch


def verdict(ok: bool, what: str, details: str) -> None:
    check(ok, what)
    if not ok:
        print(details, flush=True)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pilot-tenants-"))
    work.chmod(0o777)
    sock = work / "pilot.sock"
    probe = work / "probe.py"  # where every tenant's user can read it
    shutil.copy(PROBE, probe)
    probe.chmod(0o644)
    env = {**os.environ, "PILOT_SOCKET": str(sock), "HOME": str(work), "PYTHONDONTWRITEBYTECODE": "1",
           "TRITON_CACHE_DIR": str(work / "triton")}
    env.pop("LD_PRELOAD", None)
    log = open(OUT / "pilotd.log", "w")
    daemon = subprocess.Popen([PYTHON, "-m", "pilot.daemon", "--backend", "cuda", "--socket",
                               str(sock), "--state-dir", str(work / "state")], stdout=log,
                              stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(600):
            if "pilotd ready" in (OUT / "pilotd.log").read_text():
                break
            time.sleep(0.1)
        os.chmod(sock, 0o777)
        ctl = [PYTHON, "-m", "pilot.cli.pilotctl"]
        for tenant, quota in (("user:root", "8GiB"), ("user:nobody", "8GiB"), ("user:daemon", "1GiB")):
            out = subprocess.run([*ctl, "quota", "set", tenant, quota], env=env,
                                 capture_output=True, text=True)
            verdict(out.returncode == 0, f"quota {tenant} = {quota}", out.stdout + out.stderr)
        native = subprocess.run([PYTHON, str(probe), "transformer"], capture_output=True,
                                text=True, env={k: v for k, v in env.items() if k != "PILOT_SOCKET"})
        (OUT / "native.log").write_text(native.stdout + native.stderr)
        run = [PYTHON, "-m", "pilot.cli.pilot", "run", "--", PYTHON, str(probe)]
        procs = {
            "root transformer": subprocess.Popen([*run, "transformer"], env=env,
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
            "nobody mlp": subprocess.Popen([*run, "mlp"], env=env, preexec_fn=as_user(NOBODY),
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
            "daemon oom": subprocess.Popen([*run, "oom"], env=env, preexec_fn=as_user(DAEMON_UID),
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        }
        outs = {}
        for name, proc in procs.items():
            outs[name] = proc.communicate(timeout=300)[0]
            (OUT / (name.replace(" ", "-") + ".log")).write_text(outs[name])
            info(f"{name}: exit {proc.returncode}")
        want = next((line for line in native.stdout.splitlines() if line.startswith("transformer ok")), None)
        got = next((line for line in outs["root transformer"].splitlines()
                    if line.startswith("transformer ok")), None)
        verdict(procs["root transformer"].returncode == 0 and got is not None and got == want,
              "root's transformer under pilot, beside the others: native's loss curve",
              outs["root transformer"][-2000:])
        verdict(procs["nobody mlp"].returncode == 0 and "mlp ok" in outs["nobody mlp"],
              "nobody's MLP under pilot: finished", outs["nobody mlp"][-2000:])
        verdict(procs["daemon oom"].returncode == 0 and "oom ok OutOfMemoryError" in outs["daemon oom"],
              "daemon's tenant over its 1 GiB quota: torch.OutOfMemoryError, then allocates again",
              outs["daemon oom"][-2000:])
        mib = [w for line in outs["daemon oom"].splitlines() if line.startswith("oom OutOfMemory")
               for w in line.split() if w.isdigit()]
        verdict(bool(mib) and int(mib[0]) <= 1024, f"the OutOfMemoryError came at the quota ({mib} MiB)",
              outs["daemon oom"][-500:])
    finally:
        daemon.terminate()
        daemon.wait(20)
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
