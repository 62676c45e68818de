"""The driver-API tracer of tests/gpu/driver_trace/ (issue 13's measuring tool), against a fake
libcuda.so.1 built here: the generator reads the exports from the ELF, the trampolines pass every
argument untouched and count exactly, cuGetProcAddress pointers are counted per requesting library,
export tables are recorded (and their entries counted when wrapped), the JSON and the summary say so."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DT = REPO / "tests" / "gpu" / "driver_trace"
FAKE = DT / "fake"
pytestmark = pytest.mark.skipif(not shutil.which("gcc") or platform.machine() != "x86_64",
                                reason="needs gcc on x86-64")

sys.path.insert(0, str(DT))
import gen_trace  # noqa: E402
import summarize  # noqa: E402

CC = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror"]
EXPORTS = {"cuInit", "cuDriverGetVersion", "cuMix", "cuMemAlloc_v2", "cuMemAlloc", "cuGetExportTable",
           "cuGetProcAddress_v2", "cuGetProcAddress"}


def build_tracer(real: Path, out: Path, pool: int) -> None:
    res = subprocess.run([sys.executable, str(DT / "gen_trace.py"), "--real", str(real), "--out", str(out),
                          "--pool", str(pool)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr, res.stderr       # tracer.c is -Wall -Wextra clean
    assert f"{len(EXPORTS)} exports of {real}" in res.stdout


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """(dir with the fake libcuda.so.1, libcuother.so and app, tracer dir with pool 64)."""
    d = tmp_path_factory.mktemp("fakecuda")
    subprocess.run([*CC, "-shared", "-fPIC", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1", "-o",
                    str(d / "libcuda.so.1"), str(FAKE / "fake_libcuda.c"), "-ldl"], check=True)
    subprocess.run([*CC, "-shared", "-fPIC", "-o", str(d / "libcuother.so"), str(FAKE / "fake_other.c"),
                    f"-L{d}", "-l:libcuda.so.1"], check=True)
    subprocess.run([*CC, "-o", str(d / "app"), str(FAKE / "fake_app.c"), f"-L{d}", "-l:libcuda.so.1",
                    "-lcuother", "-lpthread", "-ldl"], check=True)
    tracer = d / "tracer"
    build_tracer(d / "libcuda.so.1", tracer, 64)
    return d, tracer


def run_app(fake, out: Path, tracer: Path | None = None, **env) -> list[dict]:
    d, default_tracer = fake
    tracer = tracer or default_tracer
    out.mkdir(parents=True, exist_ok=True)
    e = {**os.environ, "LD_LIBRARY_PATH": f"{tracer}:{d}", "DRIVER_TRACE_DIR": str(tracer),
         "DRIVER_TRACE_OUT": str(out / "app.%p.json"), **env}
    res = subprocess.run([str(d / "app")], capture_output=True, text=True, env=e, timeout=60)
    assert res.returncode == 0 and res.stdout == "ok\n", res.stdout + res.stderr
    docs = [json.loads(p.read_text()) for p in sorted(out.glob("app.*.json"))]
    assert len(docs) == 2, "the parent and its forked child write one file each"
    return sorted(docs, key=lambda doc: doc["forked_from"])   # parent first


def calls(doc: dict, fn: str, through: str | None = None) -> list[dict]:
    return [c for c in doc["calls"] if c["fn"] == fn and (through is None or c["through"] == through)]


def test_generator_lists_exported_functions_only(fake):
    d, tracer = fake
    names, versions = gen_trace.dynamic_functions(str(d / "libcuda.so.1"))
    assert set(names) == EXPORTS and len(names) == len(EXPORTS)    # no cuSecret, cuDataObject, statics
    assert not versions
    assert (tracer / "exports.txt").read_text().split() == names
    dyn = subprocess.run(["readelf", "-d", "--dyn-syms", "-W", str(tracer / "libcuda.so.1")],
                         capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libcuda.so.1]" in dyn
    exported = {line.split()[-1] for line in dyn.splitlines()
                if " FUNC " in line and " GLOBAL " in line and " UND " not in line}
    assert exported == EXPORTS | {"driver_trace_snapshot"}   # trampolines, C wrappers, its own


def test_counts_callers_proc_address_and_export_tables(fake, tmp_path):
    parent, child = run_app(fake, tmp_path)
    assert parent["real"].endswith("libcuda.so.1") and parent["wrap_tables"] is False
    # exact counts through the export trampolines, 4 threads included; the fork child starts at zero
    assert [c["calls"] for c in calls(parent, "cuInit")] == [3101 + 4 * 10000]
    assert child["forked_from"] == parent["pid"]
    assert [(c["fn"], c["calls"]) for c in child["calls"]] == [("cuInit", 1)]
    # callers sampled: the first 64 calls and every 1024th after
    (init,) = calls(parent, "cuInit")
    (sampled,) = init["callers"].values()      # 64 + 43101 // 1024 single-threaded; threads race on it
    assert 64 + 20 <= sampled <= 64 + 60
    assert next(iter(init["callers"])).endswith("/app")
    # linked and through cuGetProcAddress v1 (requested under the old version 12080, flags 1)
    assert {c["through"]: c["calls"] for c in calls(parent, "cuMix")} == {"export": 200, "proc_address": 1}
    # 30 calls after dlopen + dlsym, 1 from the real library's constructor while the tracer loaded it
    (ver,) = calls(parent, "cuDriverGetVersion")
    assert ver["through"] == "export" and ver["calls"] == 31
    assert {Path(k).name: n for k, n in ver["callers"].items()} == {"app": 30, "(real libcuda)": 1}
    # the counts at the two snapshots around 100 cuInit and 25 cuDriverGetVersion
    (begin, end) = parent["snapshots"]
    assert (begin["label"], end["label"]) == ("loop:begin", "loop:end:100")
    delta = {fn: n - dict(begin["calls"]).get(fn, 0) for fn, n in end["calls"]}
    assert {fn: n for fn, n in delta.items() if n} == {"cuInit": 100, "cuDriverGetVersion": 25}
    (alloc,) = calls(parent, "cuMemAlloc_v2")
    assert alloc["through"] == "proc_address" and alloc["requested"] == "cuMemAlloc" and alloc["calls"] == 2
    assert alloc["requested_by"].endswith("/app")
    hidden = {Path(c["requested_by"]).name: c["calls"] for c in calls(parent, "cuHidden", "proc_address")}
    assert hidden == {"app": 4, "libcuother.so": 2}                       # one pool slot per library
    other = next(c for c in calls(parent, "cuHidden") if c["requested_by"].endswith("libcuother.so"))
    assert [Path(k).name for k in other["callers"]] == ["libcuother.so"]
    reqs = {(Path(r["lib"]).name, r["symbol"]): r for r in parent["proc_address"]}
    assert reqs["libcuother.so", "cuHidden"]["via"].endswith("/app")      # the library up the stack
    assert reqs["app", "cuMemAlloc"]["resolved"] == "cuMemAlloc_v2"
    assert reqs["app", "cuHidden"]["resolved"] is None and reqs["app", "cuHidden"]["flags"] == 2
    assert (reqs["app", "cuMix"]["api"], reqs["app", "cuMix"]["version"]) == (2, 12080)
    assert reqs["app", "cuGetProcAddress"]["api"] == 1
    nope = reqs["app", "cuNope"]
    assert (nope["rc"], nope["status"], nope["resolved"]) == (500, 1, None)
    assert sum(c["calls"] for c in calls(parent, "cuGetProcAddress_v2")) == 6   # 4 app + 2 libcuother.so
    # export tables: passed through and recorded, entries not counted unless wrapped
    tables = {t["uuid"][:8]: t for t in parent["export_tables"]}
    assert tables["ab010203"]["rc"] == 0 and tables["ab010203"]["first_word"] == 24
    assert tables["cd010203"]["rc"] == 500 and tables["cd010203"]["entries_wrapped"] == 0
    assert not [c for c in parent["calls"] if c["through"] == "export_table"]
    assert parent["first_use"][:3] == ["cuDriverGetVersion", "cuInit", "cuMix"]   # the constructor first
    loaded = {Path(x["path"]).name: x["needs_libcuda"] for x in parent["loaded"]}
    assert loaded["app"] and loaded["libcuother.so"] and not loaded["libc.so.6"]
    assert parent["pool_used"] == 4 and parent["pool_exhausted"] == 0


def test_wrapped_export_table_entries_are_counted(fake, tmp_path):
    parent, _ = run_app(fake, tmp_path, DRIVER_TRACE_WRAP_TABLES="1")
    entries = {c["fn"]: c["calls"] for c in parent["calls"] if c["through"] == "export_table"}
    assert entries == {"ab010203[1]": 1, "ab010203[2]": 2}              # f0(0) once, f1 twice
    assert {t["uuid"][:8]: t["entries_wrapped"] for t in parent["export_tables"]} == {"ab010203": 2,
                                                                                      "cd010203": 0}


def test_full_pool_falls_back_to_the_export_trampolines(fake, tmp_path):
    d, _ = fake
    small = tmp_path / "tracer1"
    build_tracer(d / "libcuda.so.1", small, 1)
    parent, _ = run_app(fake, tmp_path / "out", tracer=small)
    assert parent["pool_used"] == 1 and parent["pool_exhausted"] >= 3
    # the first pointer got the pool slot; cuMix through cuGetProcAddress is still counted (as export)
    assert sum(c["calls"] for c in calls(parent, "cuMix")) == 201
    assert [c["through"] for c in calls(parent, "cuMemAlloc_v2")] == ["proc_address"]


def test_summary_merges_processes_per_workload(fake, tmp_path):
    top = tmp_path / "trace"
    run_app(fake, top / "raw" / "a")
    run_app(fake, top / "raw" / "b", DRIVER_TRACE_WRAP_TABLES="1")
    for w in ("a", "b"):
        for p in (top / "raw" / w).glob("*.json"):
            p.rename(top / "raw" / p.name.replace("app.", f"{w}."))
    (top / "runs.tsv").write_text("a\t0\t1\tok a\nb\t0\t2\tok b\n")
    assert summarize.main([str(top)]) == 0
    a = json.loads((top / "a.json").read_text())
    assert a["calls"]["cuInit"]["total"] == 43102 and len(a["processes"]) == 2     # parent + child
    assert a["steady"] == {"loop": {"iterations": 100, "per_iteration": {"cuInit": 1.0,
                                                                          "cuDriverGetVersion": 0.25}}}
    assert a["calls"]["cuMix"]["export"] == 200 and a["calls"]["cuMix"]["proc_address"] == 1
    assert a["proc_address"]["libcuother.so"]["symbols"]["cuHidden"]["count"] == 2
    md = (top / "summary.md").read_text()
    assert "| `cuInit` | device | 43102 | 43102 |" in md
    assert "| a | loop | 100 | 1.25 | cuInit 1.00, cuDriverGetVersion 0.25 |" in md
    assert "| b | libcuother.so | app 2 | 2 | 1 | 0 | [13000] | [0] | 1 |" in md
    assert "ab010203[2] 2" in md and "cuNope (app)" in md
    # the loaded library that asks cuGetProcAddress itself, read from its ELF file
    (facts,) = json.loads((top / "libraries.json").read_text())
    assert facts["library"] == "libcuother.so" and facts["needs"] == ["libcuda.so.1"]
    assert (facts["imports_runtime"], facts["imports_driver"]) == (0, 1) and facts["names_cuGetProcAddress"]
    assert "| libcuother.so |" in md
    summary = json.loads((top / "summary.json").read_text())
    assert summary["b"]["calls"]["ab010203[2]"] == 2 and "ab010203[2]" not in summary["a"]["calls"]


def test_workloads_take_snapshots_through_the_tracer(fake, tmp_path):
    """workloads.py's snapshot() reaches driver_trace_snapshot of the libcuda.so.1 it loads (the
    torch workloads themselves need a GPU: tests/gpu/driver_trace.sh)."""
    d, tracer = fake
    env = {**os.environ, "LD_LIBRARY_PATH": f"{tracer}:{d}", "DRIVER_TRACE_OUT": str(tmp_path / "w.%p.json")}
    code = "import workloads; workloads.snapshot('p:begin'); workloads.snapshot('p:end:3')"
    res = subprocess.run([sys.executable, "-c", code], cwd=DT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("w.*.json")]
    assert [s["label"] for s in doc["snapshots"]] == ["p:begin", "p:end:3"]
    assert summarize.steady_state(doc["snapshots"]) == {"p": {"iterations": 3, "per_iteration": {}}}
