"""`pilot run` picks the shim from the program's ELF NEEDED entries (cli/elf.py), and
`pilot shim-path --cuda`. The programs are tiny gcc builds linked against stand-in
libcudart.so.12/.13 (empty libraries with those SONAMEs): no CUDA needed."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from pilot.cli import pilot as pilot_cli
from pilot.cli.elf import NotElf, cudart_majors, find_cudart, read_dynamic
from pilot.shim import LIBRARY_STANDINS, driver_path, shim_path, standin_path

# The CUDA library stand-ins as `pilot run` preloads them.
STANDINS = " ".join(str(standin_path(soname)) for soname in LIBRARY_STANDINS)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


class Programs:
    def __init__(self, d: Path) -> None:
        self.d = d
        (d / "empty.c").write_text("int pilot_test_empty;\n")
        (d / "main.c").write_text("int main(void) { return 0; }\n")
        (d / "fatbin.c").write_text(  # kernels registered with a (here: static) runtime
            '__attribute__((section(".nv_fatbin"), used)) static const char fb[16] = {1};\n'
            '__attribute__((section(".nvFatBinSegment"), used)) static const char w[24] = {1};\n'
            "int main(void) { return 0; }\n")
        (d / "host_fatbin.c").write_text(  # what nvcc leaves in host code: nothing to register
            '__attribute__((section(".nv_fatbin"), used)) static const char fb[16] = {1};\n'
            "int main(void) { return 0; }\n")
        lib = d / "lib"
        lib.mkdir()
        for major in (12, 13):
            self.gcc("-shared", "-fPIC", f"-Wl,-soname,libcudart.so.{major}", "-o",
                     lib / f"libcudart.so.{major}", d / "empty.c")
        self.prog12 = self.program("prog12", "-l:libcudart.so.12")
        self.prog13 = self.program("prog13", "-l:libcudart.so.13")
        self.both = self.program("both", "-l:libcudart.so.12", "-l:libcudart.so.13")
        self.plain = self.program("plain")
        self.static = self.program("static", src=d / "fatbin.c")
        # a program whose own library (found through RUNPATH $ORIGIN/lib) links libcudart.so.12
        self.gcc("-shared", "-fPIC", "-Wl,-soname,libmine.so", "-o", lib / "libmine.so",
                 d / "empty.c", f"-L{lib}", "-Wl,--no-as-needed", "-l:libcudart.so.12")
        self.indirect = self.program("indirect", "-l:libmine.so", "-Wl,-rpath,$ORIGIN/lib",
                                     "-Wl,--enable-new-dtags")
        # the driver API and a CUDA library, directly and through a library of the program's
        for name in ("libcuda.so.1", "libcublas.so.13", "libcufft.so.12"):
            self.gcc("-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", lib / name, d / "empty.c")
        self.driver = self.program("driver", "-l:libcudart.so.13", "-l:libcuda.so.1")
        # a driver API program nvcc compiled (its kernels come from a file): libcuda alone
        self.driver_only = self.program("driver_only", "-l:libcuda.so.1", src=d / "host_fatbin.c")
        # the same with a static runtime in it (CMake's default for the CUDA samples)
        self.driver_static = self.program("driver_static", "-l:libcuda.so.1", src=d / "fatbin.c")
        self.gcc("-shared", "-fPIC", "-Wl,-soname,libgemm.so", "-o", lib / "libgemm.so",
                 d / "empty.c", f"-L{lib}", "-Wl,--no-as-needed", "-l:libcublas.so.13")
        self.blas = self.program("blas", "-l:libcudart.so.13", "-l:libgemm.so",
                                 "-Wl,-rpath,$ORIGIN/lib", "-Wl,--enable-new-dtags")
        self.gcc("-shared", "-fPIC", "-Wl,-soname,libfft.so", "-o", lib / "libfft.so",
                 d / "empty.c", f"-L{lib}", "-Wl,--no-as-needed", "-l:libcufft.so.12")
        self.fft = self.program("fft", "-l:libcudart.so.13", "-l:libfft.so",
                                "-Wl,-rpath,$ORIGIN/lib", "-Wl,--enable-new-dtags")
        self.blas12 = self.program("blas12", "-l:libcudart.so.12", "-l:libcublas.so.13")
        self.script = d / "script.sh"
        self.script.write_text("#!/bin/sh\nexit 0\n")
        self.script.chmod(0o755)
        self.env_script = d / "script.py"
        self.env_script.write_text("#!/usr/bin/env -S sh -e\nexit 0\n")
        self.env_script.chmod(0o755)
        self.data = d / "data.txt"
        self.data.write_text("not a program\n")
        self.data.chmod(0o755)

    def gcc(self, *args: object) -> None:
        subprocess.run(["gcc", *map(str, args)], check=True, capture_output=True)

    def program(self, name: str, *libs: str, src: Path | None = None) -> Path:
        exe = self.d / name
        self.gcc("-o", exe, src or self.d / "main.c", f"-L{self.d / 'lib'}", "-Wl,--no-as-needed",
                 *libs)
        return exe


@pytest.fixture(scope="module")
def progs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return Programs(tmp_path_factory.mktemp("elf"))


# ---- the reader ----

def test_reads_needed_and_runpath(progs: Programs) -> None:
    dyn = read_dynamic(progs.prog12)
    assert "libcudart.so.12" in dyn.needed and "libc.so.6" in dyn.needed
    dyn = read_dynamic(progs.indirect)
    assert "libmine.so" in dyn.needed and dyn.runpath == ["$ORIGIN/lib"] and dyn.rpath == []
    assert ".nv_fatbin" in read_dynamic(progs.static).sections


def test_reads_what_readelf_reads(progs: Programs) -> None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf not installed")
    for exe in ("/bin/ls", progs.both, progs.indirect):
        out = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
        assert read_dynamic(exe).needed == [
            line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def test_not_elf(progs: Programs, tmp_path: Path) -> None:
    with pytest.raises(NotElf, match="not an ELF file"):
        read_dynamic(progs.script)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(progs.prog12.read_bytes()[:40])
    with pytest.raises(NotElf, match="truncated"):
        read_dynamic(truncated)
    with pytest.raises(NotElf):
        read_dynamic(tmp_path / "missing")


def test_big_endian_32_bit_header_parses(tmp_path: Path) -> None:
    """A hand-made ELF32 big-endian file with one NEEDED entry (no gcc for such targets here)."""
    strtab = b"\0libcudart.so.12\0"
    ehdr_size, phdr_size = 52, 32
    phoff = ehdr_size
    dyn_off = phoff + 2 * phdr_size
    dyn = struct.pack(">iIiIiI", 1, 1, 5, 0x1000 + dyn_off + 24, 0, 0)  # NEEDED, STRTAB, NULL
    str_off = dyn_off + len(dyn)
    ident = b"\x7fELF" + bytes([1, 2, 1]) + bytes(9)
    ehdr = ident + struct.pack(">HHIIIIIHHHHHH", 2, 8, 1, 0, phoff, 0, 0, ehdr_size, phdr_size, 2,
                               40, 0, 0)
    total = str_off + len(strtab)
    load = struct.pack(">IIIIIIII", 1, 0, 0x1000, 0x1000, total, total, 5, 0x1000)
    dynamic = struct.pack(">IIIIIIII", 2, dyn_off, 0x1000 + dyn_off, 0, len(dyn), len(dyn), 6, 4)
    path = tmp_path / "be32"
    path.write_bytes(ehdr + load + dynamic + dyn + strtab)
    assert read_dynamic(path).needed == ["libcudart.so.12"]


def test_cudart_majors() -> None:
    assert cudart_majors(["libc.so.6", "libcudart.so.12"]) == {12}
    assert cudart_majors(["/opt/x/libcudart.so.13.0.88", "libcudart_static.a"]) == {13}
    assert cudart_majors(["libcudartx.so.12", "libcudart.so"]) == set()


def test_find_cudart_follows_the_programs_own_libraries(progs: Programs) -> None:
    assert find_cudart(progs.prog12, env={}).majors == {12}
    link = find_cudart(progs.indirect, env={})
    assert link.majors == {12} and link.via[12].name == "libmine.so"
    assert find_cudart(progs.both, env={}).majors == {12, 13}
    link = find_cudart(progs.static, env={})
    assert link.majors == set() and link.device_code


# ---- the CLI ----

@pytest.fixture
def exec_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str], dict[str, str]]]:
    """pilot run's exec, recorded instead of done."""
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def fake_exec(file: str, args: list[str], env: dict[str, str]) -> None:
        calls.append((file, args, env))

    monkeypatch.setattr(pilot_cli.os, "execvpe", fake_exec)
    return calls


def _run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(pilot_cli.main, list(args), env=env)


def test_run_picks_the_shim_from_needed(progs: Programs, exec_calls: list) -> None:
    for prog, major in ((progs.prog12, 12), (progs.prog13, 13), (progs.indirect, 12)):
        res = _run("run", "--", str(prog), "arg", env={"LD_PRELOAD": ""})
        assert res.exit_code == 0, res.output
        file, args, env = exec_calls[-1]
        assert (file, args) == (str(prog), [str(prog), "arg"])
        assert env["LD_PRELOAD"] == str(shim_path(major))


def test_run_replaces_the_other_shim_and_keeps_other_preloads(progs: Programs,
                                                              exec_calls: list) -> None:
    inherited = f"{shim_path(13)} /opt/other.so"
    res = _run("run", "--", str(progs.prog12), env={"LD_PRELOAD": inherited})
    assert res.exit_code == 0, res.output
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(12)} /opt/other.so"
    res = _run("run", "--", str(progs.prog13), env={"LD_PRELOAD": f"/opt/other.so:{shim_path(13)}"})
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(13)} /opt/other.so"


def test_run_finds_programs_on_path_and_takes_cuda_override(progs: Programs,
                                                            exec_calls: list) -> None:
    res = _run("run", "--", "prog12", env={"PATH": str(progs.d), "LD_PRELOAD": ""})
    assert res.exit_code == 0, res.output
    assert exec_calls[-1][2]["LD_PRELOAD"] == str(shim_path(12))
    res = _run("run", "--cuda", "12", "--", str(progs.script), env={"LD_PRELOAD": ""})
    assert res.exit_code == 0, res.output
    # told, not read: the driver API library too, in case the program loads libcuda itself
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(12)} {driver_path()}"


def test_run_serves_a_driver_api_program_nvcc_compiled(progs: Programs, exec_calls: list) -> None:
    """nvcc leaves a `.nv_fatbin` with nothing to register in host code it compiles: a program
    of the driver API alone (kernels loaded from a file) is served, not taken for a static
    runtime."""
    assert not find_cudart(progs.driver_only, env={}).device_code
    res = _run("run", "--", str(progs.driver_only), env={"LD_PRELOAD": ""})
    assert res.exit_code == 0, res.output
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(13)} {driver_path()}"


def test_run_serves_a_driver_api_program_with_a_static_runtime(progs: Programs,
                                                               exec_calls: list) -> None:
    """Its libcuda will be pilot's driver: the driver API calls run under pilot and the static
    runtime, if the program uses it, stops at the integrity check pilot's driver cannot pass
    (tests/apps: test_a_static_runtime_on_pilots_driver_fails_cleanly). Said, then run."""
    res = _run("run", "--", str(progs.driver_static), env={"LD_PRELOAD": ""})
    assert res.exit_code == 0, res.output
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(13)} {driver_path()}"
    assert "its runtime calls fail" in " ".join(res.output.split()), res.output


def test_run_refuses_a_static_runtime_with_status_3(progs: Programs, exec_calls: list) -> None:
    res = _run("run", "--", str(progs.static))
    assert res.exit_code == 3 and not exec_calls, res.output
    assert "linked statically (nvcc's default), which pilot cannot interpose" in \
        " ".join(res.output.split()), res.output


def test_run_serves_a_script_as_its_interpreter(progs: Programs, exec_calls: list) -> None:
    """A `#!` script (also through /usr/bin/env) is served as its interpreter is: /bin/sh has
    no CUDA in its ELF, so the CUDA 13 shim and the driver API library."""
    for script in (progs.script, progs.env_script):
        res = _run("run", "--", str(script), env={"LD_PRELOAD": "", "PATH": "/usr/bin:/bin"})
        assert res.exit_code == 0, res.output
        assert exec_calls[-1][1] == [str(script)]
        assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(13)} {driver_path()} {STANDINS}"


def test_run_serves_a_program_without_cuda_as_cuda_13(progs: Programs, exec_calls: list) -> None:
    """No libcudart, no device code, no CUDA library in its ELF: an interpreter that may load
    CUDA at run time (python3 with PyTorch) gets the CUDA 13 shim, the driver API library and
    the CUDA library stand-ins (PyTorch links cuBLAS)."""
    res = _run("run", "--", str(progs.plain), "x.py", env={"LD_PRELOAD": ""})
    assert res.exit_code == 0, res.output
    assert exec_calls[-1][1] == [str(progs.plain), "x.py"]
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(13)} {driver_path()} {STANDINS}"


@pytest.mark.parametrize(("prog", "message"), [
    ("both", "loads two CUDA runtimes"),
    ("data", "not an ELF file: pilot cannot tell which CUDA runtime it loads"),
])
def test_run_refuses_what_it_cannot_serve(progs: Programs, exec_calls: list, prog: str,
                                          message: str) -> None:
    path = getattr(progs, prog)
    res = _run("run", "--", str(path))
    assert res.exit_code == 1 and not exec_calls
    assert message in " ".join(res.output.split()), res.output
    assert res.output.startswith("Error: ")


def test_run_refuses_programs_that_would_bypass_pilot(progs: Programs, exec_calls: list) -> None:
    """A program whose GPU work would partly go around pilot (a CUDA library pilot has no
    stand-in for, even through a library of its own) is refused with exit status 3; --cuda
    forces it (with the driver API library and the stand-ins preloaded too)."""
    res = _run("run", "--", str(progs.fft))
    assert res.exit_code == 3 and not exec_calls, res.output
    text = " ".join(res.output.split())
    assert "libcufft.so.12 (needed by" in text and "would run outside pilot" in text, res.output
    res = _run("run", "--cuda", "13", "--", str(progs.fft), env={"LD_PRELOAD": ""})
    assert res.exit_code == 0
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(13)} {driver_path()} {STANDINS}"
    res = _run("run", "--", str(progs.blas12))
    assert res.exit_code == 3 and "CUDA 13 programs only" in " ".join(res.output.split())


def test_run_carries_cublas_with_its_stand_ins(progs: Programs, exec_calls: list) -> None:
    """cuBLAS (here through a library of the program's) is carried: the stand-ins are preloaded
    after the shim, an inherited copy is not doubled."""
    res = _run("run", "--", str(progs.blas), env={"LD_PRELOAD": STANDINS.split()[0]})
    assert res.exit_code == 0, res.output
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(13)} {STANDINS}"


def test_run_carries_the_driver_api(progs: Programs, exec_calls: list) -> None:
    """A program linking libcuda.so.1 beside libcudart runs with both libraries preloaded, the
    driver API library after the shim whose session it uses; an inherited copy is not doubled."""
    res = _run("run", "--", str(progs.driver), env={"LD_PRELOAD": str(driver_path())})
    assert res.exit_code == 0, res.output
    assert exec_calls[-1][2]["LD_PRELOAD"] == f"{shim_path(13)} {driver_path()}"
    res = _run("run", "--", str(progs.prog13), env={"LD_PRELOAD": ""})
    assert exec_calls[-1][2]["LD_PRELOAD"] == str(shim_path(13))


def test_run_missing_program() -> None:
    res = _run("run", "--", "/nonexistent/app")
    assert res.exit_code == 1 and "cannot run /nonexistent/app: No such file" in res.output


def test_shim_path_cuda_option() -> None:
    assert _run("shim-path").output.strip() == str(shim_path(13))
    assert _run("shim-path", "--cuda", "13").output.strip() == str(shim_path(13))
    assert _run("shim-path", "--cuda", "12").output.strip() == str(shim_path(12))
    res = _run("shim-path", "--cuda", "11")
    assert res.exit_code == 2 and "'11' is not one of '12', '13'" in res.output


def test_run_drops_pytorchs_expandable_segments_with_a_notice(progs: Programs,
                                                             exec_calls: list) -> None:
    """expandable_segments needs the CUDA virtual memory calls pilot does not carry: the program
    runs with PyTorch's ordinary allocator, the rest of the setting is kept."""
    res = _run("run", "--", str(progs.plain), env={
        "LD_PRELOAD": "", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:true"})
    assert res.exit_code == 0, res.output
    env = exec_calls[-1][2]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    assert "PYTORCH_ALLOC_CONF" not in env
    assert "expandable_segments is not supported under pilot" in res.output
    res = _run("run", "--", str(progs.plain), env={"LD_PRELOAD": "",
                                                   "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert exec_calls[-1][2]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"
    assert "expandable_segments" not in res.output
