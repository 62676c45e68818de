"""`none`: no policy, the default. Every launch runs at once and nothing is tracked, so the daemon
skips the policy on its hot path entirely (decides_launches, needs_footprint, needs_kernel_end
are all False)."""

from __future__ import annotations

from .api import Policy


class NonePolicy(Policy):
    name = "none"
    summary = "no policy: every launch runs at once (the default)"
