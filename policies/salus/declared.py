"""Sizes a job declares in its environment, read from /proc/<pid>/environ when its session
starts (never its identity: that comes from peer credentials). All optional:

    PILOT_SALUS_PERSISTENT=2GiB   # P, used until the detector recognizes the job
    PILOT_SALUS_EPHEMERAL=1GiB    # E, likewise
    PILOT_SALUS_ITERATIONS=500    # the iteration count, for SRTF's remaining time
    PILOT_SALUS_ITERATION_TIME=50ms  # one iteration's time, SRTF's guess until it is measured

A value that does not parse, or an environment pilotd may not read, is ignored (the job is then
measured only).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import parse_duration, parse_size


@dataclass(frozen=True, slots=True)
class Declared:
    persistent: int | None = None
    ephemeral: int | None = None
    iterations: int | None = None
    iteration_s: float | None = None


NONE = Declared()


def parse(env: dict[str, str]) -> Declared:
    def size(key: str) -> int | None:
        try:
            return parse_size(env[key].strip()) if key in env else None
        except ValueError:
            return None
    try:
        iterations = int(env["PILOT_SALUS_ITERATIONS"]) if "PILOT_SALUS_ITERATIONS" in env else None
    except ValueError:
        iterations = None
    if iterations is not None and iterations <= 0:
        iterations = None
    try:
        seconds = parse_duration(env["PILOT_SALUS_ITERATION_TIME"].strip()) \
            if "PILOT_SALUS_ITERATION_TIME" in env else None
    except ValueError:
        seconds = None
    return Declared(size("PILOT_SALUS_PERSISTENT"), size("PILOT_SALUS_EPHEMERAL"), iterations,
                    seconds or None)


def read(pid: int) -> Declared:
    """The declaration of process `pid`, or NONE."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return NONE
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith(b"PILOT_SALUS_"):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return parse(env) if env else NONE
