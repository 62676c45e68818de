"""The shim's layering (the comment at the top of shim/transport/transport.c): the transport and the modules
below it never call up. Checked on the compiled objects: every hand-written source of the CUDA 13
build and the generated ones, compiled with the build's flags; `nm` says which global symbols
each object defines and which it references, so calls hidden in macros or taken as function
pointers count too."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"

# Layer of each bottom module; every other source of the shim is above (layer 2). A module may
# reference symbols defined in its own layer or a lower one.
LAYERS = {
    "log.c": 0,
    "socket_path.c": 0,
    "zmtp.c": 0,
    "error_state.c": 0,
    "errors.c": 0,  # generated from shim/tables/cuda_errors.tsv
    "transport.c": 1,
}
ABOVE = 2

Symbols = dict[str, tuple[set[str], set[str]]]  # object -> (defined, undefined)


def upward_references(symbols: Symbols, layers: dict[str, int]) -> list[str]:
    """'file -> symbol (defining file)' for each reference of a module to a symbol that a module
    of a higher layer defines."""
    owner = {sym: name for name, (defined, _) in symbols.items() for sym in defined}
    found = []
    for name, (_, undefined) in sorted(symbols.items()):
        for sym in sorted(undefined):
            at = owner.get(sym)
            if at is not None and layers.get(at, ABOVE) > layers.get(name, ABOVE):
                found.append(f"{name} -> {sym} ({at})")
    return found


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


@pytest.fixture(scope="module")
def shim_symbols(tmp_path_factory: pytest.TempPathFactory) -> Symbols:
    if not (shutil.which("gcc") and shutil.which("nm")):
        pytest.skip("gcc or nm not installed")
    spec = importlib.util.spec_from_file_location("pilot_shim_build", SHIM / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    tmp = tmp_path_factory.mktemp("shim_layers")
    gen = tmp / "gen"
    generated = build.generate_tables(gen, 13)
    base = ["gcc", *build.C_FLAGS, *(f"-I{d}" for d in build.INCLUDE_DIRS), f"-I{gen}",
            f"-I{build.cuda_include_dir()}"]
    symbols: Symbols = {}
    for src, flags in ([(p, build.shared_source_flags(13, gen)) for p in build.hand_written_sources(13)]
                       + [(p, []) for p in generated]):
        obj = tmp / f"{src.stem}.o"
        subprocess.run([*base, *flags, "-c", str(src), "-o", str(obj)], check=True,
                       capture_output=True)
        symbols[src.name] = nm_symbols(obj)
    return symbols


def test_every_bottom_module_is_built(shim_symbols: Symbols) -> None:
    """A renamed or dropped module must not leave the check vacuous."""
    assert set(LAYERS) <= set(shim_symbols), set(LAYERS) - set(shim_symbols)
    assert len(shim_symbols) > len(LAYERS) + 10


def test_no_module_calls_up(shim_symbols: Symbols) -> None:
    bad = upward_references(shim_symbols, LAYERS)
    assert not bad, ("modules of the shim's bottom layers reference modules above them (see the "
                     "comment at the top of shim/transport/transport.c):\n  " + "\n  ".join(bad))


def test_the_transport_uses_the_bottom_modules(shim_symbols: Symbols) -> None:
    """The symbol tables are read right: the known downward references are seen."""
    owner = {s: name for name, (defined, _) in shim_symbols.items() for s in defined}
    used = {owner.get(s) for s in shim_symbols["transport.c"][1]}
    assert {"zmtp.c", "log.c", "socket_path.c", "error_state.c"} <= used
    assert "pilot_ensure_session" in shim_symbols["api_device.c"][1]
    assert "pilot_ensure_session" in shim_symbols["transport.c"][0]


def test_an_upward_reference_is_reported() -> None:
    symbols: Symbols = {
        "transport.c": ({"pilot_call"}, {"zmtp_send", "pilot_um_forget_session"}),
        "zmtp.c": ({"zmtp_send"}, {"pilot_call"}),
        "coherence.c": ({"pilot_um_forget_session"}, {"pilot_call", "memcpy"}),
    }
    assert upward_references(symbols, LAYERS) == [
        "transport.c -> pilot_um_forget_session (coherence.c)",
        "zmtp.c -> pilot_call (transport.c)",
    ]
