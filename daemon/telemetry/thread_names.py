"""pilotd's threads named for the OS as well as for Python, so that `top -H`, `ps -L`,
/proc/PID/task/*/comm and profilers show which thread (vgpu-3, pilot-router, gate-0) uses the
CPU. Python before 3.14 names a thread for itself only; the kernel keeps 15 bytes of a name."""

from __future__ import annotations

import ctypes
import threading

_PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)


def name_this_thread(name: str) -> None:
    """The calling thread's name for the OS (best effort: a failure changes nothing else)."""
    try:
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (AttributeError, OSError):
        pass


class NamedThread(threading.Thread):
    """A threading.Thread whose name the OS sees too."""

    def run(self) -> None:
        name_this_thread(self.name)
        super().run()
