"""Design names whose code comes in later issues. They are registered (so the config and
`pilotctl status` list them, and asking for one stops the start with "not implemented in this
version") but cannot be created. The PILOT paper's memory policies and Salus lane admission;
each will move to its own module when it is implemented."""

from __future__ import annotations

from .api import Policy


class MFit(Policy):
    name = "mfit"
    summary = "MFit: launch a kernel only when its memory footprint fits the GPU's free capacity"
    implemented = False


class AMFit(Policy):
    name = "amfit"
    summary = ("AMFit: launch at once; when active memory exceeds capacity, hold the tenant "
               "with the most active memory")
    implemented = False


class MAdvise(Policy):
    name = "madvise"
    summary = ("MAdvise: keep each process within a device-memory budget and advise the rest "
               "to host memory")
    implemented = False


class Salus(Policy):
    name = "salus"
    summary = "Salus: admit sessions to GPU lanes whose memory fits; the others wait for a lane"
    implemented = False
