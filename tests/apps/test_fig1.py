"""bench/fig1.py's pilot mode end to end on the sim backend, at a tiny size: the build, the daemon
with its default configuration, N processes behind the start barrier, the session check, the
parsing and the reports. (Its bare and mps modes need a GPU: they run on the H100 only.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIG1 = REPO / "bench" / "fig1.py"
NVCC = shutil.which("nvcc") or next(
    (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if Path(p).exists()), None)

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found: fig1_vector_add.cu cannot be built")


def test_pilot_mode_on_the_sim(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(FIG1), "--backend", "sim", "--mbytes", "8",
                           "--launches", "5", "--n", "1,2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "| N | pilot kernel | pilot wall |" in proc.stdout
    assert "pilot/MPS kernel time at N=8: n/a" in proc.stdout
    report = json.loads((out / "fig1.json").read_text())
    assert report["config"]["pilotd_args"] == []
    runs = {r["n"]: r for r in report["runs"]}
    assert sorted(runs) == [1, 2] and all(r["ok"] and r["mode"] == "pilot" for r in runs.values())
    for r in runs.values():
        assert len(r["procs"]) == r["n"]
        for p in r["procs"]:
            v = p["values"]
            assert p["rc"] == 0 and v["ok"] == 1 and v["n"] == (8 << 20) // 12
            assert 0 < v["kernel_s"] <= v["kernel_host_s"] + 0.05 and v["wall_s"] > v["kernel_s"]
    # the default configuration: sessions at once get vGPUs of their own (2 started, more grown)
    vgpus = [p["vgpu"] for p in runs[2]["procs"]]
    assert len(set(vgpus)) == 2, vgpus
    assert "| pilot | 2 |" in (out / "fig1.md").read_text()
    assert "pilotd ready" in (out / "pilotd-fig1.log").read_text()


def test_sim_backend_refuses_the_gpu_modes() -> None:
    proc = subprocess.run([sys.executable, str(FIG1), "--backend", "sim", "--modes", "bare,pilot"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "pilot mode only" in proc.stderr, proc.stderr
