#!/usr/bin/env python3
"""Merges the tracer's per-process JSON files into one JSON per workload and a markdown summary.

    python3 summarize.py DIR [--runs DIR/runs.tsv]

DIR/raw/<workload>.<pid>.json (written by the tracing libcuda, DRIVER_TRACE_OUT=DIR/raw/<workload>.%p.json)
-> DIR/<workload>.json, DIR/summary.md, DIR/summary.json. Standalone (stdlib only).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import gen_trace

# Libraries whose way to the driver the summary describes (basename patterns).
CUDA_NEEDED = ("libcudart", "libcuda.", "libcublas", "libcudnn", "libnvrtc")
CUDA_LIB = re.compile(r"^(lib(cu|nv|cudnn|torch_cuda|c10_cuda|triton|nccl)|cuda_utils|__triton_launcher)")

# Prefix -> category, first match wins (for the design note's roll-up).
CATEGORIES = [
    ("vmm", ("cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemGetAccess",
             "cuMemAddressReserve", "cuMemAddressFree", "cuMemGetAllocationGranularity",
             "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemRetainAllocationHandle",
             "cuMemGetAllocationPropertiesFromHandle", "cuMemMapArrayAsync")),
    ("mem pools", ("cuMemPool", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync",
                   "cuDeviceGetMemPool", "cuDeviceGetDefaultMemPool", "cuDeviceSetMemPool")),
    ("memory", ("cuMem", "cuPointer", "cuIpc")),
    ("launch", ("cuLaunch", "cuFunc", "cuKernel", "cuOccupancy")),
    ("modules", ("cuModule", "cuLibrary", "cuLink")),
    ("streams/events", ("cuStream", "cuEvent")),
    ("graphs", ("cuGraph", "cuUserObject")),
    ("context", ("cuCtx", "cuDevicePrimaryCtx", "cuGreenCtx")),
    ("device", ("cuDevice", "cuInit", "cuDriverGetVersion")),
    ("entry points", ("cuGetProcAddress", "cuGetExportTable", "cuGetErrorString", "cuGetErrorName")),
]


# Export-table UUIDs (bytes in order) named as ZLUDA's dark_api names them (public reimplementation).
KNOWN_TABLES = {
    "6bd5fb6c5bf4e74a8987d93912fd9df9": "CUDART_INTERFACE",
    "42d85a8123f6cb478298f6e78a3aecdc": "TOOLS_TLS",
    "a094798c2e742e7493f20800200c0a66": "TOOLS_RUNTIME_CALLBACK_HOOKS",
    "c693336e1121df11a8c368f355d89593": "CONTEXT_LOCAL_STORAGE_INTERFACE_V0301",
    "0ca50b8c1004929a89a7d0df10e77286": "CTX_CREATE_BYPASS",
    "195bcbf4d67d024aacc51d29cea631ae": "HEAP_ACCESS",
    "b10541e1f7c7c74a9f64f223be99f1e2": "DEVICE_EXTENDED_RT",
}


def category(fn: str) -> str:
    if "[" in fn:
        return "export tables"
    for cat, prefixes in CATEGORIES:
        if fn.startswith(prefixes):
            return cat
    return "other"


def short(lib: str | None) -> str:
    if not lib:
        return "-"
    return lib if lib.startswith("(") else os.path.basename(lib)


def steady_state(snapshots: list[dict]) -> dict[str, dict]:
    """Calls per iteration of each phase a workload bracketed with snapshots `<phase>:begin` and
    `<phase>:end:<iterations>` (counts summed by function name over its slots)."""
    totals = {}
    for snap in snapshots:
        per_fn: Counter = Counter()
        for fn, n in snap["calls"]:
            per_fn[fn] += n
        totals[snap["label"]] = per_fn
    out = {}
    for label, end in totals.items():
        phase, _, rest = label.partition(":end:")
        begin = totals.get(f"{phase}:begin")
        if not rest.isdigit() or begin is None or int(rest) <= 0:
            continue
        n = int(rest)
        per = {fn: round((c - begin.get(fn, 0)) / n, 3) for fn, c in end.items() if c > begin.get(fn, 0)}
        ordered = dict(sorted(per.items(), key=lambda kv: (-kv[1], kv[0])))
        out[phase] = {"iterations": n, "per_iteration": ordered}
    return out


def merge(files: list[Path]) -> dict:
    calls: dict[str, dict] = {}
    gpa: dict[str, dict] = defaultdict(lambda: {"requests": 0, "symbols": {}, "via": Counter()})
    tables: dict[str, dict] = {}
    procs, needs, loaded, first_use = [], set(), set(), []
    pool_used = pool_exhausted = 0
    steady: dict[str, dict] = {}
    real = None
    for path in sorted(files):
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            procs.append({"file": path.name, "error": str(e)})
            continue
        real = d.get("real", real)
        procs.append({"pid": d["pid"], "cmdline": d["cmdline"][:200], "total_calls": d["total_calls"],
                      "forked_from": d.get("forked_from", 0)})
        pool_used = max(pool_used, d["pool_used"])
        pool_exhausted += d["pool_exhausted"]
        if len(d["first_use"]) > len(first_use):
            first_use = d["first_use"]
        for c in d["calls"]:
            e = calls.setdefault(c["fn"], {"total": 0, "export": 0, "proc_address": 0, "export_table": 0,
                                           "callers": Counter(), "requested_by": Counter()})
            e["total"] += c["calls"]
            e[c["through"]] += c["calls"]
            for lib, n in c["callers"].items():
                e["callers"][short(lib)] += n
            if c["requested_by"]:
                e["requested_by"][short(c["requested_by"])] += c["calls"]
        for r in d["proc_address"]:
            g = gpa[short(r["lib"])]
            g["requests"] += 1
            if r["via"]:
                g["via"][short(r["via"])] += 1
            s = g["symbols"].setdefault(r["symbol"], {"count": 0, "versions": set(), "flags": set(),
                                                      "rc": set(), "resolved": r["resolved"]})
            s["count"] += 1
            s["versions"].add(r["version"])
            s["flags"].add(r["flags"])
            s["rc"].add(r["rc"])
        for t in d["export_tables"]:
            e = tables.setdefault(t["uuid"], {"libs": Counter(), "via": Counter(), "rc": set(),
                                              "first_word": t["first_word"], "entries_wrapped": 0})
            e["libs"][short(t["lib"])] += 1
            if t["via"]:
                e["via"][short(t["via"])] += 1
            e["rc"].add(t["rc"])
            e["entries_wrapped"] = max(e["entries_wrapped"], t["entries_wrapped"])
        steady.update(steady_state(d.get("snapshots", [])))
        needs.update(short(x["path"]) for x in d["loaded"] if x["needs_libcuda"])
        loaded.update(x["path"] for x in d["loaded"])
    for g in gpa.values():
        for s in g["symbols"].values():
            for k in ("versions", "flags", "rc"):
                s[k] = sorted(s[k])
    for t in tables.values():
        t["rc"] = sorted(t["rc"])
    return {"real": real, "processes": procs, "calls": calls, "proc_address": dict(gpa),
            "export_tables": tables, "first_use": first_use, "libraries_needing_libcuda": sorted(needs),
            "loaded": sorted(loaded), "steady": steady,
            "pool_used": pool_used, "pool_exhausted": pool_exhausted}


def library_facts(paths: list[str]) -> list[dict]:
    """How each loaded CUDA library reaches the driver, read from its ELF file: runtime (cuda*) and
    driver (cu*) functions it imports, whether it needs libcudart / libcuda.so.1, and whether it
    names cuGetProcAddress / libcuda.so (it loads the driver itself and asks for entry points)."""
    facts = []
    for path in paths:
        name = os.path.basename(path)
        if not CUDA_LIB.match(name) or name.startswith("libcuda.so"):
            continue
        try:
            data = Path(path).read_bytes()
            info = gen_trace.elf_dynamic(path, data)
        except (OSError, ValueError) as e:
            facts.append({"library": name, "path": path, "error": str(e)})
            continue
        und = info["undefined"]
        facts.append({"library": name, "path": path, "mib": round(len(data) / 2**20, 1),
                      "imports_runtime": sum(1 for u in und if u.startswith("cuda")),
                      "imports_driver": sum(1 for u in und if re.match(r"cu[A-Z]", u)),
                      "needs": [n for n in info["needed"] if n.startswith(CUDA_NEEDED)],
                      "names_cuGetProcAddress": b"cuGetProcAddress" in data,
                      "names_libcuda": b"libcuda.so" in data})
    return facts


def read_runs(path: Path) -> dict[str, dict]:
    runs = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 3:
                result = parts[3] if len(parts) > 3 else ""
                runs[parts[0]] = {"rc": parts[1], "seconds": parts[2], "result": result}
    return runs


def table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |" for r in rows]
    return out


def top(counter: Counter, n: int = 4) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common(n)) + (" ..." if len(counter) > n else "")


def markdown(merged: dict[str, dict], runs: dict[str, dict], facts: list[dict]) -> str:
    names = list(merged)
    md = ["# Driver API calls per workload (tracing libcuda.so.1)", ""]
    real = next((m["real"] for m in merged.values() if m["real"]), "?")
    md += [f"Real library: `{real}`. Counts are exact (every call through an export, a cuGetProcAddress "
           "pointer or a wrapped export-table entry); callers are sampled (first 64 calls of each slot and "
           "every 1024th). Calls of libraries that dlopen libcuda.so.1 and dlsym a name are in `export`. "
           "Teardown calls after the tracer's destructor are not counted.", ""]
    rows = []
    for w in names:
        m, r = merged[w], runs.get(w, {})
        rows.append([w, r.get("rc", "?"), r.get("seconds", "?"), len(m["processes"]),
                     sum(e["total"] for e in m["calls"].values()), len(m["calls"]),
                     sum(g["requests"] for g in m["proc_address"].values()), len(m["export_tables"]),
                     m["pool_used"], r.get("result", "")[:90]])
    head = ["workload", "rc", "s", "procs", "calls", "functions", "GPA requests", "export tables", "pool",
            "result"]
    md += ["## Runs", "", *table(head, rows), ""]
    rows = []
    for w in names:
        for phase, st in merged[w]["steady"].items():
            per = st["per_iteration"]
            rows.append([w, phase, st["iterations"], f"{sum(per.values()):.2f}",
                         ", ".join(f"{fn} {x:.2f}" for fn, x in list(per.items())[:12])
                         + (" ..." if len(per) > 12 else "")])
    md += ["## Steady state: driver calls per iteration", "",
           "Between two snapshots a workload took around a loop (after warm-up), divided by its "
           "iterations: what each GEMM, conv step, kernel launch or training step costs in driver calls.", ""]
    md += [*table(["workload", "phase", "iterations", "calls/iteration", "per function"], rows), ""]
    cats = defaultdict(Counter)
    for w in names:
        for fn, e in merged[w]["calls"].items():
            cats[category(fn)][w] += e["total"]
    md += ["## Calls by category", ""]
    md += [*table(["category", *names], [[c, *(cats[c][w] for w in names)] for c in sorted(cats)]), ""]
    fns = sorted({fn for m in merged.values() for fn in m["calls"]},
                 key=lambda f: (-sum(m["calls"].get(f, {}).get("total", 0) for m in merged.values()), f))
    rows = []
    for fn in fns:
        how, callers = Counter(), Counter()
        for m in merged.values():
            e = m["calls"].get(fn)
            if e:
                for k in ("export", "proc_address", "export_table"):
                    how[k] += e[k]
                callers.update(e["callers"])
        per = [merged[w]["calls"].get(fn, {}).get("total", "") for w in names]
        rows.append([f"`{fn}`", category(fn), *per,
                     ", ".join(f"{k} {v}" for k, v in how.items() if v), top(callers, 3)])
    md += ["## Functions called (sorted by total calls)", ""]
    md += [*table(["function", "category", *names, "through", "callers (sampled)"], rows), ""]
    rows = []
    for w in names:
        for lib, g in sorted(merged[w]["proc_address"].items()):
            syms = g["symbols"]
            called = {fn for fn, e in merged[w]["calls"].items() if e["requested_by"].get(lib)}
            rows.append([w, lib, top(g["via"], 2), g["requests"], len(syms),
                         sum(1 for s in syms.values() if 0 not in s["rc"]),
                         sorted({v for s in syms.values() for v in s["versions"]})[:4],
                         sorted({f for s in syms.values() for f in s["flags"]}), len(called)])
    md += ["## cuGetProcAddress requests by calling library", "",
           "`via`: the first other library up the stack (e.g. who called cudaGetDriverEntryPoint); "
           "`not found`: symbols the driver did not resolve; `called`: functions called through the "
           "pointers this library got.", ""]
    head = ["workload", "library", "via", "requests", "symbols", "not found", "versions", "flags", "called"]
    md += [*table(head, rows), ""]
    rows = []
    uuids = sorted({u for m in merged.values() for u in m["export_tables"]})
    for u in uuids:
        libs, via, seen_in, first_word, wrapped = Counter(), Counter(), [], 0, 0
        for w in names:
            t = merged[w]["export_tables"].get(u)
            if t:
                libs.update(t["libs"])
                via.update(t["via"])
                seen_in.append(w)
                first_word, wrapped = t["first_word"], max(wrapped, t["entries_wrapped"])
        entry_calls = Counter()
        for m in merged.values():
            for fn, e in m["calls"].items():
                if "[" in fn and u.startswith(fn.split("[")[0]):
                    entry_calls[fn] += e["total"]
        rows.append([f"`{u}`", KNOWN_TABLES.get(u, "?"), first_word, top(libs, 4), top(via, 2),
                     " ".join(seen_in), wrapped, top(entry_calls, 6) or "-"])
    md += ["## Export tables (cuGetExportTable)", "",
           "`first word`: the table's first 8 bytes (often its size); entries are counted only in runs "
           "with DRIVER_TRACE_WRAP_TABLES=1.", ""]
    head = ["uuid", "name (ZLUDA's)", "first word", "requested by", "via", "workloads", "entries wrapped",
            "entry calls (uuid prefix[index])"]
    md += [*table(head, rows), ""]
    rows = [[f["library"], f.get("mib", "-"), f.get("imports_runtime", "-"), f.get("imports_driver", "-"),
             " ".join(f.get("needs", [])) or "-", "yes" if f.get("names_cuGetProcAddress") else "no",
             "yes" if f.get("names_libcuda") else "no"] for f in facts]
    md += ["## How each loaded CUDA library reaches the driver (its ELF file)", "",
           "`runtime imports`: undefined cuda* symbols (0 with a static runtime); `driver imports`: "
           "undefined cu* symbols (linked against libcuda); the last two: the file names the string "
           "(loads libcuda itself / asks cuGetProcAddress for entry points).", ""]
    head = ["library", "MiB", "runtime imports", "driver imports", "needs", "names cuGetProcAddress",
            "names libcuda.so"]
    md += [*table(head, rows), ""]
    needs = sorted({x for m in merged.values() for x in m["libraries_needing_libcuda"]})
    md += ["## Libraries linked against libcuda.so.1 (DT_NEEDED)", "", ", ".join(needs) or "none", ""]
    not_found = sorted({(lib, s) for m in merged.values() for lib, g in m["proc_address"].items()
                        for s, e in g["symbols"].items() if 0 not in e["rc"]})
    md += ["## cuGetProcAddress symbols not resolved by the driver", "",
           ", ".join(f"{s} ({lib})" for lib, s in not_found) or "none", ""]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--runs")
    args = ap.parse_args(argv)
    top_dir = Path(args.dir)
    groups: dict[str, list[Path]] = defaultdict(list)
    for f in (top_dir / "raw").glob("*.json"):
        groups[f.name.split(".")[0]].append(f)
    runs = read_runs(Path(args.runs) if args.runs else top_dir / "runs.tsv")
    order = [w for w in runs if w in groups] + sorted(w for w in groups if w not in runs)
    merged = {w: merge(groups[w]) for w in order}
    for w in runs:
        if w not in merged:
            print(f"summarize: no trace from workload {w}", file=sys.stderr)
    for w, m in merged.items():
        (top_dir / f"{w}.json").write_text(json.dumps(m, indent=1, default=dict))
    facts = library_facts(sorted({p for m in merged.values() for p in m["loaded"]}))
    (top_dir / "summary.md").write_text(markdown(merged, runs, facts))
    (top_dir / "libraries.json").write_text(json.dumps(facts, indent=1))
    (top_dir / "summary.json").write_text(json.dumps(
        {w: {"calls": {fn: e["total"] for fn, e in m["calls"].items()},
             "proc_address_symbols": {lib: sorted(g["symbols"]) for lib, g in m["proc_address"].items()},
             "export_tables": {u: sorted(t["libs"]) for u, t in m["export_tables"].items()}}
         for w, m in merged.items()}, indent=1))
    print(f"summarize: {len(merged)} workloads -> {top_dir / 'summary.md'}")
    return 0 if merged else 1


if __name__ == "__main__":
    sys.exit(main())
