"""pilotd's threads carry their names to the OS (telemetry/thread_names.py), where `top -H`,
/proc and profilers read them."""

from __future__ import annotations

import threading
from pathlib import Path

from pilot.daemon.telemetry.thread_names import NamedThread


def test_a_named_thread_is_named_in_proc_too():
    seen: list[str] = []
    done = threading.Event()

    def look() -> None:
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())
        done.set()

    t = NamedThread(target=look, name="vgpu-12345678901234", daemon=True)
    t.start()
    assert done.wait(5)
    t.join(5)
    assert seen == ["vgpu-1234567890"]  # the kernel keeps 15 bytes


def test_a_plain_thread_is_not_renamed_so_the_test_above_can_fail():
    seen: list[str] = []
    t = threading.Thread(target=lambda: seen.append(
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()), name="vgpu-x")
    t.start()
    t.join(5)
    assert seen and seen[0] != "vgpu-x"
