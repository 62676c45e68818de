"""Kernels' printf output, back to the program that printed it.

A kernel's `printf` writes into its context's FIFO; the driver formats it and writes it to the
process's standard output when the context is synchronized (a synchronize, a blocking copy, a
launch...). Here the process is pilotd, so the driver's stdout is captured: fd 1 becomes a
memfd (a file: a large flush never blocks the driver, as a pipe could), the C library's stdout
is made unbuffered so every flush reaches it at once, and Python's own `sys.stdout` keeps the
original fd 1.

The output is the program's data, so it goes to a session only when it cannot be another's: no
other session attached to this pilotd may print (tenants share one context per GPU, whose FIFO
mixes their kernels' output). A session may print once it loaded a module whose code names
`vprintf` or `__assertfail` (a device-side assert prints too: backends/fatbin.py `may_print`);
other sessions' kernels cannot write into the FIFO. Otherwise the output goes to pilotd's log,
with a warning, and to nobody. C's fast path knows which of its sessions may print
(pilot_fast_printer): it answers their synchronizations after launches by the completion word only
while their output could not be delivered anyway.
It is taken after each synchronizing call Python handles (vgpu/dispatch.py) and sent with that
call's reply (PILOT_F_DEVICE_OUTPUT), which the shim writes to the program's stdout: in order
with the program's own output, where the driver would have printed it natively. The C fast path
gives such calls to Python whenever the file has grown (daemon/native/fast_launch.c).

Before pilotd re-executes itself after a GPU fault, fd 1 is given back its original file
(`restore`), so the new process starts as the first one did and captures afresh.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

from pilot.daemon.protocol import lib

log = logging.getLogger("pilot.vgpu")

_IONBF = 2
_PUNCH_HOLE = 0x03  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_PUNCH_EVERY = 1 << 20  # consumed bytes given back to the kernel once this many accumulate
MAX_PER_REPLY = 1 << 20  # more waits for the next call (the shim writes it all in order)


class DeviceOutput:
    """The capture (one per pilotd process) and who may receive it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attached: set[int] = set()  # session ids attached to any vGPU
        self._printers: set[int] = set()  # sessions that loaded code that may print
        # Started with fd 1 closed, Python has no stdout and fd 1 may be anything pilotd opened
        # since: then nothing is captured (the Daemon logs why).
        if sys.stdout is None or sys.stdout.fileno() != 1:
            raise OSError("pilotd was started without a standard output")
        self.fd = os.memfd_create("pilot-device-output", os.MFD_CLOEXEC)
        real = self.real = os.dup(1)
        sys.stdout.flush()
        sys.stdout = os.fdopen(real, "w", buffering=1, closefd=False)
        libc = ctypes.CDLL(None, use_errno=True)
        c_stdout = ctypes.c_void_p.in_dll(libc, "stdout")
        libc.fflush(c_stdout)
        os.dup2(self.fd, 1)
        libc.setvbuf(c_stdout, None, _IONBF, 0)
        self._fallocate = libc.fallocate
        self._fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        self.taken = 0  # bytes of the file read so far
        self._punched = 0

    # ---- sessions ----
    def attached(self, session_id: int) -> None:
        with self._lock:
            self._attached.add(session_id)
            self._tell_c()

    def printer(self, session_id: int) -> None:
        """The session loaded code that may print."""
        with self._lock:
            if session_id not in self._printers:
                self._printers.add(session_id)
                self._tell_c()

    def prints(self, session_id: int) -> bool:
        return session_id in self._printers

    def released(self, session_id: int) -> None:
        with self._lock:
            self._attached.discard(session_id)
            self._printers.discard(session_id)
            self._tell_c()

    def _tell_c(self) -> None:
        lib.pilot_fast_output_sessions(len(self._attached & self._printers))

    # ---- output ----
    def pending(self) -> bool:
        return os.fstat(self.fd).st_size > self.taken

    def take(self, session_id: int) -> bytes:
        """What the kernels printed since the last take, for session_id if it may have it (no
        other attached session may print), else logged and b""."""
        with self._lock:
            size = os.fstat(self.fd).st_size
            if size <= self.taken:
                return b""
            data = os.pread(self.fd, min(size - self.taken, MAX_PER_REPLY), self.taken)
            self.taken += len(data)
            if self.taken - self._punched >= _PUNCH_EVERY:
                self._fallocate(self.fd, _PUNCH_HOLE, 0, self.taken)
                self._punched = self.taken
            others = len((self._attached & self._printers) - {session_id})
            mine = session_id in self._attached and not others
        if mine:
            return data
        log.warning("kernel printf output of %d bytes not delivered (%d other sessions attached "
                    "may print: it could be any of theirs): %r", len(data), others, data[:200])
        return b""

    def drain(self) -> None:
        """Take what is there for nobody (logged): a session attaching never gets what was
        printed before it, one leaving leaves what it printed after its last reply."""
        while self.pending():
            self.take(-1)

    def restore(self) -> None:
        """fd 1 back to what it was (before an exec: the new process starts as this one did)."""
        os.dup2(self.real, 1)
