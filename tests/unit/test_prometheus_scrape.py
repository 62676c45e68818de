"""A real Prometheus server scrapes pilot's exporter, and its query API returns pilot's series.

This is the end-to-end check of the exposition (names, types, labels, the histogram) against the
consumer that matters: unit tests with prometheus_client's own parser cannot catch a format that
only Prometheus rejects. Needs the `prometheus` binary (Debian package `prometheus`); skipped
without it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pilot.daemon.telemetry.metrics import Exporter, Metrics, PilotCollector, start_exporter
from pilot.daemon.telemetry.nvml import SimSource

PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
GiB = 1 << 30
TIMEOUT = 30.0

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus binary not found (apt-get install -y --no-install-recommends prometheus)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state() -> dict[str, Any]:
    sim = SimSource(total=16 * GiB, used=lambda i: (i + 1) * GiB)
    return {
        "sessions": [
            {"session": 1, "tenant": "alice", "pid": 10, "gpu": 0, "device_bytes": 3 * GiB,
             "managed_bytes": 0},
            {"session": 2, "tenant": "alice", "pid": 11, "gpu": 0, "device_bytes": 1 * GiB,
             "managed_bytes": 2 * GiB},
            {"session": 3, "tenant": "bob", "pid": 12, "gpu": 1, "device_bytes": 5 * GiB,
             "managed_bytes": 0},
        ],
        "gpus": [{"index": i, "capacity": 12 * GiB, "draining": i == 1, "reading": sim.read(i)}
                 for i in (0, 1)],
        "quotas": {"alice": {"0": {"hard": 6 * GiB, "provisioned": None}}},
        "vgpus": [{"index": 0, "gpu": 0, "sessions": 2}, {"index": 1, "gpu": 1, "sessions": 1}],
    }


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    m = Metrics()
    for _ in range(5):
        m.call("cudaMalloc", 4e-6)
    m.kernels_launched(7)
    m.bytes_copied("h2d", 1 << 20)
    m.quota_rejection("bob")
    exp = start_exporter("127.0.0.1:0", PilotCollector(m, state))
    yield exp
    exp.stop()


def start_prometheus(tmp_path: Path, target_port: int) -> tuple[subprocess.Popen[bytes], str]:
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: pilot\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target_port}']\n")
    port = free_port()
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def stop_prometheus(proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.returncode not in (0, -15):
        print((tmp_path / "prometheus.log").read_text(errors="replace"))


@pytest.fixture
def prometheus(tmp_path: Path, exporter: Exporter) -> Iterator[str]:
    proc, base = start_prometheus(tmp_path, exporter.port)
    try:
        yield base
    finally:
        stop_prometheus(proc, tmp_path)


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(base: str, promql: str, n: int) -> list[dict[str, Any]]:
    """Polls until `promql` returns n series (Prometheus needs to start and scrape once)."""
    deadline = time.monotonic() + TIMEOUT
    last: Exception | list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            last = query(base, promql)
            if len(last) >= n:
                return last
        except (urllib.error.URLError, ConnectionError) as e:  # not listening yet
            last = e
        time.sleep(0.2)
    raise AssertionError(f"{promql}: no {n} series within {TIMEOUT}s (last: {last!r})")


def by(series: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(s["metric"][k] for k in labels): float(s["value"][1]) for s in series}


def test_prometheus_scrapes_pilot_exporter(prometheus: str, exporter: Exporter) -> None:
    mem = wait_for(prometheus, "pilot_tenant_device_memory_bytes", 2)
    assert by(mem, "tenant", "gpu") == {("alice", "0"): 4 * GiB, ("bob", "1"): 5 * GiB}
    assert {s["metric"]["job"] for s in mem} == {"pilot"}

    up = query(prometheus, 'up{job="pilot"}')
    assert [float(s["value"][1]) for s in up] == [1.0]
    assert by(query(prometheus, "pilot_tenant_managed_memory_bytes"), "tenant", "gpu") == {
        ("alice", "0"): 2 * GiB, ("bob", "1"): 0}
    assert by(query(prometheus, "pilot_tenant_quota_bytes"), "tenant", "gpu", "kind") == {
        ("alice", "0", "hard"): 6 * GiB}
    assert by(query(prometheus, "pilot_sessions"), "gpu") == {("0",): 2, ("1",): 1}
    assert by(query(prometheus, "pilot_gpu_memory_used_bytes"), "gpu") == {
        ("0",): GiB, ("1",): 2 * GiB}
    assert by(query(prometheus, "pilot_gpu_draining"), "gpu") == {("0",): 0, ("1",): 1}
    assert by(query(prometheus, "pilot_calls_total"), "function") == {("cudaMalloc",): 5}
    assert by(query(prometheus, "pilot_kernels_launched_total"))[()] == 7
    assert by(query(prometheus, "pilot_copied_bytes_total"), "direction")[("h2d",)] == 1 << 20
    assert by(query(prometheus, "pilot_quota_rejections_total"), "tenant") == {("bob",): 1}
    # The histogram is usable by histogram_quantile: 5 observations of 4 us, all in (2.5, 5] us.
    median = query(prometheus,
                   "histogram_quantile(0.5, sum by (le) (pilot_call_latency_seconds_bucket))")
    assert 2.5e-6 < float(median[0]["value"][1]) <= 5e-6
    assert by(query(prometheus, "pilot_call_latency_seconds_count"), "function") == {
        ("cudaMalloc",): 5}


# A client that holds a session: libpilot.so loaded with ctypes, 64 MiB allocated, then it waits.
HOLDER = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
ptr = ctypes.c_void_p()
print(lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)), flush=True)
sys.stdin.readline()
"""


def test_prometheus_scrapes_a_running_pilotd(tmp_path: Path) -> None:
    """The whole path: pilotd (sim) with its exporter, a tenant holding memory under a quota,
    a real Prometheus scraping the daemon, and its HTTP API answering for pilot series."""
    import os
    import pwd
    import sys

    from pilot.shim import shim_path

    sock, port = tempfile.mkdtemp(prefix="pilot-prom-") + "/pilot.sock", free_port()
    env = {**os.environ, "PILOT_SOCKET": sock}
    env.pop("LD_PRELOAD", None)
    config = tmp_path / "pilotd.toml"
    config.write_text("[metrics]\ntenant_labels = true\n")  # the operator opts in to names
    with (tmp_path / "pilotd.log").open("w") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "pilot.daemon", "--config", str(config), "--backend", "sim",
             "--socket", sock,
             "--state-dir", str(tmp_path / "state"), "--metrics-address", f"127.0.0.1:{port}",
             "--capacity", "12GiB"], stdout=log, stderr=subprocess.STDOUT, env=env)
    holder = None
    prom = None
    try:
        deadline = time.monotonic() + TIMEOUT
        while "pilotd ready" not in (tmp_path / "pilotd.log").read_text():
            assert daemon.poll() is None and time.monotonic() < deadline, "pilotd did not start"
            time.sleep(0.05)
        me = "user:" + pwd.getpwuid(os.getuid()).pw_name
        subprocess.run([sys.executable, "-m", "pilot.cli.pilotctl", "quota", "set", me, "1GiB"],
                       env=env, check=True, capture_output=True)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(shim_path())], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"  # cudaSuccess
        prom, base = start_prometheus(tmp_path, port)
        mem = by(wait_for(base, f'pilot_tenant_device_memory_bytes{{tenant="{me}"}}', 1), "gpu")
        assert mem == {("0",): float(64 << 20)}
        quota = by(wait_for(base, f'pilot_tenant_quota_bytes{{tenant="{me}",kind="hard"}}', 1), "gpu")
        assert quota == {("0",): float(GiB)}
        assert by(wait_for(base, "pilot_gpu_capacity_bytes", 1), "gpu") == {("0",): float(12 * GiB)}
        calls = by(wait_for(base, 'pilot_calls_total{function="malloc"}', 1), "function")
        assert calls[("malloc",)] >= 1
        assert by(wait_for(base, "pilot_sessions", 1), "gpu")[("0",)] == 1.0
    finally:
        if prom is not None:
            stop_prometheus(prom, tmp_path)
        if holder is not None:
            holder.kill()
            holder.wait()
        daemon.terminate()
        daemon.wait(15)
