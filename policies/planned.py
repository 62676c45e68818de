"""Design names whose code comes in later issues. They are registered (so the config and
`pilotctl status` list them, and asking for one stops the start with "not implemented in this
version") but cannot be created: Salus lane admission; it moves to its own module when it is
implemented."""

from __future__ import annotations

from .api import Policy


class Salus(Policy):
    name = "salus"
    summary = "Salus: admit sessions to GPU lanes whose memory fits; the others wait for a lane"
    implemented = False
