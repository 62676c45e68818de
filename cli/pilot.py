"""`pilot`: run programs under the shim and look at the daemon from a user's side."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import click

from pilot import __version__
from pilot.cli.elf import NotElf, find_cudart
from pilot.shim import (
    CUDA_MAJORS,
    DRIVER_LIBRARY,
    LIBRARIES,
    LIBRARY_STANDINS,
    driver_path,
    shim_path,
    standin_path,
)

CUDA_OPTION = click.Choice([str(m) for m in CUDA_MAJORS])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="pilot", message="%(prog)s %(version)s")
def main() -> None:
    """Run CUDA programs through pilotd."""


def _shim(cuda: int) -> Path:
    try:
        return shim_path(cuda)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc


def _driver() -> Path:
    try:
        return driver_path()
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command("shim-path")
@click.option("--cuda", type=CUDA_OPTION, default="13", show_default=True,
              help="The CUDA major version the program was built with: libpilot.so stands in "
                   "for libcudart.so.13, libpilot12.so for libcudart.so.12.")
def shim_path_cmd(cuda: str) -> None:
    """Print the absolute path of the shim (for LD_PRELOAD)."""
    click.echo(str(_shim(int(cuda))))


class NotCarried(click.ClickException):
    """A program pilot would not carry whole: part of its GPU work would bypass pilot."""

    exit_code = 3


# The driver API, which pilot carries (libpilot-cuda.so stands in for it).
DRIVER_SONAME = "libcuda.so.1"


def _standins() -> list[str]:
    try:
        return [str(standin_path(soname)) for soname in LIBRARY_STANDINS]
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc


def _refuse_bypass(program: str, bypass: dict[str, Path]) -> None:
    """A program (or one of its libraries) that links a CUDA library pilot has no stand-in for
    would use the GPU outside pilot: no quota, no isolation, pointers pilot gave it meaningless
    there."""
    what = ", ".join(f"{name} (needed by {obj})" for name, obj in sorted(bypass.items()))
    carried = ", ".join(sorted(LIBRARY_STANDINS))
    raise NotCarried(
        f"{program} links {what}: that code talks to the GPU through the CUDA driver directly, "
        "not through the CUDA runtime and driver API pilot interposes, so it would run outside "
        "pilot (no quota, no isolation, and pilot's device pointers mean nothing there). Of the "
        f"CUDA libraries pilot carries {carried} only. Run it without pilot, or force it with "
        "--cuda 12|13 at your own risk")


def _script_interpreter(path: str, env: dict[str, str]) -> str | None:
    """The ELF interpreter a `#!` script names (`/usr/bin/env NAME` looked up on PATH), or
    None for anything else (including a script whose interpreter is itself a script)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        found = shutil.which(names[0], path=env.get("PATH")) if names else None
    else:
        found = words[0] if os.path.isfile(words[0]) else None
    if found is None:
        return None
    try:
        with open(found, "rb") as f:
            return found if f.read(4) == b"\x7fELF" else None
    except OSError:  # unreadable: not one pilot can look into
        return None


def program_cuda_major(program: str, env: dict[str, str]) -> tuple[int, bool, bool]:
    """The CUDA major version whose libcudart `program` (a name on PATH or a path) links, from
    its ELF NEEDED entries, whether it gets the driver API library (libcuda.so.1) too, and
    whether it gets the CUDA library stand-ins (it links cuBLAS, cuBLASLt or cuDNN). A program of the
    driver API alone, or with no CUDA in its ELF at all (python3 running PyTorch, which may load
    any of them), is served with the CUDA 13 shim (its session) and the driver, the latter with
    the stand-ins too; a `#!` script as its interpreter is. Raises ClickException when that
    cannot be told or served."""
    path = shutil.which(program, path=env.get("PATH")) if "/" not in program else program
    if path is None or not os.path.isfile(path):
        raise click.ClickException(f"cannot run {program}: No such file or directory")
    hint = "--cuda 12 or --cuda 13 (pilot run --cuda 12 -- ...)"
    try:
        link = find_cudart(path, env)
    except NotElf as exc:
        interpreter = _script_interpreter(path, env)
        if interpreter is not None:  # a script: its interpreter loads whatever CUDA it uses
            return program_cuda_major(interpreter, env)
        raise click.ClickException(
            f"{exc}: pilot cannot tell which CUDA runtime it loads; if it loads libcudart "
            f"itself, say which with {hint}") from exc
    driver = DRIVER_SONAME in link.bypass
    standins = any(name in LIBRARY_STANDINS for name in link.bypass)
    others = {name: obj for name, obj in link.bypass.items()
              if name != DRIVER_SONAME and name not in LIBRARY_STANDINS}
    if others:
        _refuse_bypass(program, others)
    served = sorted(link.majors & set(CUDA_MAJORS))
    if standins and served != [13]:
        linked = ", ".join(sorted(n for n in link.bypass if n in LIBRARY_STANDINS))
        raise NotCarried(f"{program} links {linked} but not libcudart.so.13: pilot's stand-ins "
                         "for CUDA's libraries serve CUDA 13 programs only")
    if len(served) == 1:
        return served[0], driver, standins
    if driver and not link.majors:
        if link.device_code:  # its libcuda will be pilot's: the static runtime fails there
            click.echo(f"pilot: {program} links the CUDA runtime statically and the driver API: "
                       "its driver API calls run under pilot, its runtime calls fail (rebuild it "
                       "with `nvcc -cudart shared` to run them too)", err=True)
        return 13, True, False
    if len(served) > 1:
        via = ", ".join(f"libcudart.so.{m} (needed by {link.via[m]})" for m in served)
        raise click.ClickException(f"{program} loads two CUDA runtimes, {via}: one process can "
                                   "only run under one of them")
    if link.majors:
        names = ", ".join(f"libcudart.so.{m}" for m in sorted(link.majors))
        raise click.ClickException(
            f"{program} links {names}: pilot serves CUDA "
            f"{' and '.join(map(str, CUDA_MAJORS))} programs only")
    if link.device_code:
        raise NotCarried(
            f"{program} has CUDA device code but links no shared libcudart: its CUDA runtime is "
            "linked statically (nvcc's default), which pilot cannot interpose (or carry: "
            "docs/design/frameworks.md); rebuild it with `nvcc -cudart shared`")
    # No CUDA in its ELF at all: an interpreter or a program that loads CUDA at run time
    # (python3 with PyTorch). It gets the CUDA 13 shim, the driver API library and the CUDA
    # library stand-ins; a CUDA 12 program of that kind must say so with --cuda 12.
    return 13, True, True


# PyTorch's allocator settings (the older and the newer variable name).
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _without_expandable_segments(env: dict[str, str]) -> None:
    """PyTorch's `expandable_segments:True` maps memory with the CUDA virtual memory calls
    (cuMemCreate, cuMemMap), which pilot does not carry: the program would fail at its first
    allocation. Run it with PyTorch's ordinary caching allocator instead (same results, other
    fragmentation), and say so."""
    for name in ALLOC_CONF_VARIABLES:
        value = env.get(name)
        if not value:
            continue
        options = [o for o in value.split(",") if o.strip()]
        kept = [o for o in options if o.replace(" ", "").lower() != "expandable_segments:true"]
        if kept != options:
            click.echo(f"pilot: {name}: expandable_segments is not supported under pilot (the CUDA "
                       "virtual memory calls are not carried); running with PyTorch's ordinary "
                       "caching allocator", err=True)
            if kept:
                env[name] = ",".join(kept)
            else:
                del env[name]


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--cuda", type=CUDA_OPTION,
              help="Preload the shim for this CUDA version instead of reading it from COMMAND's "
                   "ELF NEEDED entries (libcudart.so.12 or libcudart.so.13), with the driver API "
                   "library and the CUDA library stand-ins; this also runs a program that links a "
                   "CUDA library pilot does not carry (cuDNN, cuFFT, ...), which pilot refuses "
                   "otherwise (exit status 3).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(cuda: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with the right shim preloaded: pilot run -- ./app args..."""
    env = dict(os.environ)
    major, driver, standins = ((int(cuda), True, int(cuda) == 13) if cuda
                               else program_cuda_major(command[0], env))
    lib = str(_shim(major))
    # The driver API library after the shim (it serves through the shim's session), then the
    # CUDA library stand-ins (cuBLAS, cuBLASLt: by SONAME they take the place of NVIDIA's, which
    # are never loaded; a program that does not use them ignores them); the other shim out of
    # an inherited LD_PRELOAD: one process, one libcudart.
    preload = [lib] + ([str(_driver())] if driver else []) + (_standins() if standins else [])
    others = {str(Path(lib).with_name(name))
              for name in [*LIBRARIES.values(), DRIVER_LIBRARY, *LIBRARY_STANDINS.values()]}
    kept = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p not in others]
    env["LD_PRELOAD"] = " ".join(preload + kept)
    _without_expandable_segments(env)
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        raise click.ClickException(f"cannot run {command[0]}: {exc.strerror}") from exc


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def sessions(as_json: bool) -> None:
    """List the daemon's sessions."""
    from pilot.cli.client import DaemonUnreachable, query_sessions

    try:
        rows = query_sessions(os.environ.get("PILOT_SOCKET") or None)
    except DaemonUnreachable as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        json.dump(rows, sys.stdout)
        sys.stdout.write("\n")
        return
    click.echo(f"{'SESSION':>7} {'PID':>7} {'UID':>6} {'VGPU':>4} {'DEVICE MiB':>10} {'CALLS':>8}  COMMAND")
    for r in rows:
        click.echo(f"{r['session']:>7} {r['pid']:>7} {r['uid']:>6} {r['vgpu']:>4} "
                   f"{r['device_bytes'] / 2**20:>10.1f} {r['calls']:>8}  {r['cmdline'][:60]}")


if __name__ == "__main__":
    main()
