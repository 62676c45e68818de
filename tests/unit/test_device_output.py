"""vgpu/device_output.py in a child process (it takes over that process's fd 1): what is written
to fd 1 (as the driver writes kernels' printf output) is captured, not what Python prints; it
goes to a session only while no other attached session may print; `restore` gives fd 1 back; a
process without a stdout captures nothing. And which module images may print (fatbin.may_print)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent("""
    import os, sys
    from pilot.daemon.vgpu.device_output import DeviceOutput
    out = DeviceOutput()
    print("python's own line")                    # not captured: the original stdout
    os.write(1, b"kernel line 1\\n")               # as the driver writes
    out.attached(7)
    assert out.pending()
    got = out.take(7)
    assert got == b"kernel line 1\\n", got
    assert not out.pending() and out.take(7) == b""
    out.attached(8)                               # a tenant that cannot print: still 7's
    os.write(1, b"kernel line 1b\\n")
    assert out.take(7) == b"kernel line 1b\\n"
    out.printer(7)
    out.printer(8)                                # two tenants that may print: nobody gets it
    assert out.prints(8)
    os.write(1, b"kernel line 2\\n")
    assert out.take(7) == b"" and not out.pending()
    out.released(8)
    assert not out.prints(8)
    os.write(1, b"x" * 3000000)                   # large: in pieces, each at most 1 MiB
    sizes = []
    while out.pending():
        sizes.append(len(out.take(7)))
    assert sizes == [1 << 20, 1 << 20, 3000000 - (2 << 20)], sizes
    os.write(1, b"left behind\\n")
    out.drain()                                   # for nobody
    assert not out.pending()
    out.restore()
    os.write(1, b"after restore\\n")
""")


def test_capture_attribution_and_restore() -> None:
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "python's own line\nafter restore\n", res.stdout
    # what nobody may have is logged, with its start
    assert "kernel line 2" in res.stderr and "left behind" in res.stderr


def test_no_capture_without_a_stdout() -> None:
    code = ("from pilot.daemon.vgpu.device_output import DeviceOutput\n"
            "try:\n    DeviceOutput()\nexcept OSError as e:\n    import sys; sys.stderr.write(str(e))\n")
    res = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, timeout=60, close_fds=True,
                         preexec_fn=lambda: __import__("os").close(1))
    assert res.returncode == 0 and "without a standard output" in res.stderr, res.stderr


def test_which_images_may_print(tmp_path: Path) -> None:
    from pilot.daemon.backends.fatbin import may_print
    assert may_print(b".version 9.0\n.extern .func (.param .b32 r) vprintf(...)\n")
    assert may_print(b"... call.uni __assertfail, (...)")
    assert not may_print(b".version 9.0\n.target sm_90\n.visible .entry k()\n{\n\tret;\n}\n")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    images = {}
    for name, body in (("prints", 'printf("%d", threadIdx.x);'), ("asserts", "assert(x[0] == 0);"),
                       ("silent", "x[threadIdx.x] += 1;")):
        src = tmp_path / f"{name}.cu"
        src.write_text(f"#include <cassert>\n#include <cstdio>\n__global__ void k(int *x) {{ {body} }}\n")
        out = tmp_path / f"{name}.fatbin"
        subprocess.run([nvcc, "-fatbin", "-arch=sm_90", "-o", str(out), str(src)], check=True, timeout=300)
        images[name] = out.read_bytes()
    assert may_print(images["prints"]) and may_print(images["asserts"])
    assert not may_print(images["silent"])
