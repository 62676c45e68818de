"""vgpu/device_output.py in a child process (it takes over that process's fd 1): what is written
to fd 1 (as the driver writes kernels' printf output) is captured, not what Python prints; it
goes to a session only while that session is the only one attached; `restore` gives fd 1
back; a process without a stdout captures nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
    out.attached(8)                               # two tenants: nobody gets it
    os.write(1, b"kernel line 2\\n")
    assert out.take(7) == b"" and not out.pending()
    out.released(8)
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
