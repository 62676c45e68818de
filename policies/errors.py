"""The two errors of the policy layer. Both are ValueErrors whose message is one line for the
operator; the daemon stops its start with it."""

from __future__ import annotations


class PolicyConfigError(ValueError):
    """A policy, its knobs (`[policy.<name>]`) or a plugin that pilotd refuses to start with."""


class UnknownPolicy(PolicyConfigError):
    """`[policy] name` names no registered policy, or one not implemented in this version."""
