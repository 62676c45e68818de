"""The layers of the shim's libraries and of the daemon's C (shim/README-less: the folders say it):
no module calls up into a higher layer, and no modules call each other in a circle. Checked on the
compiled objects: every hand-written source of each artefact and its generated ones, compiled with
the build's flags; `nm` says which global symbols each object defines and which it references, so
calls hidden in macros or taken as function pointers count too. A module is one source file; a
cross-cutting event (fork, device reset, graph memory made or released, a free) reaches the
modules through shim/core/hooks.h, whose entries are data the linker gathers, not references."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"

# Layer of each module of an artefact, by its path (below shim/, daemon/native/ as native/,
# generated ones as gen/NAME); a module may reference symbols defined in its own layer or a lower
# one. Folder prefixes apply to every module below them; the longest prefix wins.
LIBPILOT_LAYERS = {
    "core/": 0,                      # the hook registry
    "transport/": 1,                 # log, socket path, ZMTP, error state
    "gen/errors.c": 1,               # from shim/tables/cuda_errors.tsv
    "transport/transport.c": 2,      # the session with pilotd
    "runtime/": 3,                   # the runtime API, by chapter
    "runtime/cuda12/": 4,            # the CUDA 12 build's own exports
    "gen/stubs.c": 4,                # every libcudart export the shim does not implement
    "bridge/driver_ops.c": 4,        # the runtime's table for libpilot-cuda.so
}
DRIVER_LAYERS = {
    "bridge/ops_lookup.c": 0,        # finds libpilot.so's table at run time
    "gen/drv_errors.c": 0,           # CUresult names
    "driver/drv_core.c": 1,          # init, devices, contexts, cuGetProcAddress
    "driver/drv_api.c": 2,           # memory, modules, launches, streams, events
    "driver/drv_link.c": 2,          # the linker (cuLink*), served by pilotd
    "driver/drv_host.c": 2,          # host registration, host functions, 2D copies
    "driver/drv_ptds.c": 3,          # the per-thread default stream forms (_ptsz, _ptds)
    "driver/drv_export.c": 3,        # cuGetExportTable
    "gen/drv_gen.c": 4,              # stubs and the table of every export
}
NATIVE_LAYERS = {
    "transport/socket_path.c": 0,
    "native/gates.c": 0,
    "native/spin_budget.c": 0,       # how many threads may spin at once
    "native/preempt_words.c": 0,     # retreat words raised and lowered (preemption)
    "native/vgpu_server.c": 0,       # the vGPU endpoint (ZMTP server)
    "native/fast_state.c": 0,        # the fast path's maps and tables
    "native/fast_library.c": 1,      # cuBLAS/cuDNN calls run in C
    "native/fast_words.c": 1,        # completion words the GPU writes into the rings' page
    "native/fast_launch.c": 2,       # launches and copies run in C; the endpoint's filter
}
Symbols = dict[str, tuple[set[str], set[str]]]  # module -> (defined, undefined)


def layer_of(module: str, layers: dict[str, int]) -> int:
    """The layer of the longest entry of `layers` that is module or a folder above it."""
    best = max((k for k in layers if module == k or (k.endswith("/") and module.startswith(k))),
               key=len, default=None)
    if best is None:
        raise KeyError(f"{module}: no layer (add it to the layer table)")
    return layers[best]


def reference_graph(symbols: Symbols) -> dict[str, dict[str, set[str]]]:
    """module -> {module it references: the symbols}, for references between modules."""
    owner = {sym: name for name, (defined, _) in symbols.items() for sym in defined}
    graph: dict[str, dict[str, set[str]]] = {name: {} for name in symbols}
    for name, (_, undefined) in symbols.items():
        for sym in undefined:
            at = owner.get(sym)
            if at is not None and at != name:
                graph[name].setdefault(at, set()).add(sym)
    return graph


def upward_references(symbols: Symbols, layers: dict[str, int]) -> list[str]:
    """'module -> symbol (defining module)' for each reference to a higher layer's symbol."""
    found = []
    for name, edges in sorted(reference_graph(symbols).items()):
        for at, syms in sorted(edges.items()):
            if layer_of(at, layers) > layer_of(name, layers):
                found += [f"{name} -> {sym} ({at})" for sym in sorted(syms)]
    return found


def circles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): the
    modules that reach each other through their references."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def describe(circle: list[str], graph: dict[str, dict[str, set[str]]]) -> str:
    members = set(circle)
    edges = [f"    {a} -> {b}: {', '.join(sorted(graph[a][b]))}"
             for a in circle for b in sorted(graph[a]) if b in members]
    return " <-> ".join(circle) + "\n" + "\n".join(edges)


def nm_symbols(obj: Path) -> tuple[set[str], set[str]]:
    out = subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        name, kind = line.split()[:2]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper() or kind in "vw":  # global (or weak) definitions; lower case: static
            defined.add(name)
    return defined, undefined


def _module_name(src: Path, gen: Path, build) -> str:
    if src.is_relative_to(gen):
        return f"gen/{src.name}"
    if src.is_relative_to(build.NATIVE_DIR):
        return f"native/{src.name}"
    return src.relative_to(SHIM).as_posix()


def _compile(build, sources: list[tuple[Path, list[str]]], includes: list[Path], gen: Path,
             out: Path) -> Symbols:
    out.mkdir(parents=True, exist_ok=True)
    base = ["gcc", *build.C_FLAGS, *(f"-I{d}" for d in includes), f"-I{gen}",
            f"-I{build.cuda_include_dir()}"]
    symbols: Symbols = {}
    for i, (src, flags) in enumerate(sources):
        obj = out / f"{i}_{src.stem}.o"
        subprocess.run([*base, *flags, "-c", str(src), "-o", str(obj)], check=True,
                       capture_output=True)
        symbols[_module_name(src, gen, build)] = nm_symbols(obj)
    return symbols


@pytest.fixture(scope="module")
def build():
    if not (shutil.which("gcc") and shutil.which("nm")):
        pytest.skip("gcc or nm not installed")
    spec = importlib.util.spec_from_file_location("pilot_shim_build", SHIM / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def libpilot(build, tmp_path_factory: pytest.TempPathFactory) -> Symbols:
    tmp = tmp_path_factory.mktemp("libpilot")
    gen = tmp / "gen"
    generated = build.generate_tables(gen, 13)
    sources = ([(p, build.shared_source_flags(13, gen)) for p in build.hand_written_sources(13)]
               + [(p, []) for p in generated])
    return _compile(build, sources, build.INCLUDE_DIRS, gen, tmp / "obj")


@pytest.fixture(scope="module")
def driver(build, tmp_path_factory: pytest.TempPathFactory) -> Symbols:
    tmp = tmp_path_factory.mktemp("driver")
    gen = tmp / "gen"
    gen.mkdir()
    subprocess.run([sys.executable, str(REPO / "hack" / "gen_shim_tables.py"), str(gen),
                    "--driver", str(build.cuda_include_dir())], check=True)
    sources = [(SHIM / s, []) for s in build.DRIVER_SOURCES] + [
        (gen / "drv_errors.c", []), (gen / "drv_gen.c", [])]
    return _compile(build, sources, build.INCLUDE_DIRS, gen, tmp / "obj")


@pytest.fixture(scope="module")
def native(build, tmp_path_factory: pytest.TempPathFactory) -> Symbols:
    tmp = tmp_path_factory.mktemp("native")
    sources = [(Path(s), []) for s in build.PROTO_SOURCES]
    return _compile(build, sources, [build.NATIVE_DIR, build.TRANSPORT_DIR], tmp, tmp / "obj")


ARTEFACTS = {"libpilot": LIBPILOT_LAYERS, "driver": DRIVER_LAYERS, "native": NATIVE_LAYERS}


@pytest.fixture(params=sorted(ARTEFACTS))
def artefact(request: pytest.FixtureRequest) -> tuple[Symbols, dict[str, int]]:
    return request.getfixturevalue(request.param), ARTEFACTS[request.param]


def test_every_module_has_a_layer(artefact) -> None:
    """A new or renamed module must be placed (and the check is not vacuous)."""
    symbols, layers = artefact
    assert len(symbols) >= 5
    for name in symbols:
        layer_of(name, layers)


def test_no_module_calls_up(artefact) -> None:
    symbols, layers = artefact
    bad = upward_references(symbols, layers)
    assert not bad, "modules reference modules of a higher layer:\n  " + "\n  ".join(bad)


def test_no_modules_call_each_other_in_a_circle(artefact) -> None:
    symbols, _ = artefact
    graph = reference_graph(symbols)
    bad = circles(graph)
    assert not bad, "modules in a circle:\n" + "\n".join(describe(c, graph) for c in bad)


def test_the_references_are_read_right(libpilot: Symbols, driver: Symbols, native: Symbols) -> None:
    """The known downward references are seen, and the hooks are not references."""
    graph = reference_graph(libpilot)
    assert {"transport/zmtp.c", "transport/log.c", "transport/socket_path.c",
            "transport/error_state.c"} <= set(graph["transport/transport.c"])
    assert "transport/transport.c" in graph["runtime/device/api_device.c"]
    assert set(graph["runtime/device/api_device.c"]) & {"core/hooks.c"}
    assert not graph["core/hooks.c"]  # it names no module: the linker gathers the entries
    # capture reaches graph memory, and cudaFree the graph and pool allocations, through hooks
    assert "runtime/graph/graph_mem.c" not in graph["runtime/graph/graph_capture.c"]
    assert "runtime/graph/graph_mem.c" not in graph["runtime/memory/api_memory.c"]
    assert "runtime/graph/graph_model.c" in graph["runtime/graph/graph_capture.c"]
    assert "driver/drv_core.c" in reference_graph(driver)["driver/drv_api.c"]
    assert "native/fast_state.c" in reference_graph(native)["native/fast_library.c"]


def test_an_upward_reference_is_reported() -> None:
    symbols: Symbols = {
        "transport/transport.c": ({"pilot_call"}, {"zmtp_send", "pilot_um_forget_session"}),
        "transport/zmtp.c": ({"zmtp_send"}, {"pilot_call"}),
        "runtime/managed/coherence.c": ({"pilot_um_forget_session"}, {"pilot_call", "memcpy"}),
    }
    assert upward_references(symbols, LIBPILOT_LAYERS) == [
        "transport/transport.c -> pilot_um_forget_session (runtime/managed/coherence.c)",
        "transport/zmtp.c -> pilot_call (transport/transport.c)",
    ]


def test_a_circle_is_reported() -> None:
    """Three modules in one circle and a fourth beside it: one circle of three."""
    symbols: Symbols = {
        "a.c": ({"a"}, {"b"}),
        "b.c": ({"b"}, {"c", "d"}),
        "c.c": ({"c"}, {"a"}),
        "d.c": ({"d"}, set()),
    }
    graph = reference_graph(symbols)
    assert circles(graph) == [["a.c", "b.c", "c.c"]]
    assert "c.c -> a.c: a" in describe(circles(graph)[0], graph)
    symbols["c.c"] = ({"c"}, set())  # cut the circle
    assert circles(reference_graph(symbols)) == []


def test_a_layer_is_found_by_its_folder() -> None:
    assert layer_of("runtime/stream/api_stream.c", LIBPILOT_LAYERS) == 3
    assert layer_of("runtime/cuda12/cuda12_compat.c", LIBPILOT_LAYERS) == 4
    assert layer_of("transport/transport.c", LIBPILOT_LAYERS) == 2
    with pytest.raises(KeyError):
        layer_of("elsewhere/x.c", LIBPILOT_LAYERS)
