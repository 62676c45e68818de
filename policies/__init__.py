"""Scheduling policies: the interface the daemon calls (views in, decisions out), the registry
of policies by name, and the built-ins. docs/POLICIES.md tells how to write one.

This module is the one place built-ins are registered; nothing else registers on import, except
plugins (load_plugin), which register their own policies.
"""

from __future__ import annotations

from .amfit import AMFit
from .api import (
    ALLOCATION_KINDS,
    DROP_REASONS,
    RUN,
    AllocationView,
    Controls,
    Decision,
    GpuView,
    KernelView,
    LaunchView,
    NvmlView,
    Policy,
    PreemptionView,
    RangeView,
    SessionView,
    Verdict,
    Watch,
)
from .errors import PolicyConfigError, UnknownPolicy
from .madvise import MAdvise
from .mfit import MFit
from .none import NonePolicy
from .registry import available, create, load_plugin, register
from .salus.policy import Salus
from .settings import Bytes, Seconds, parse_settings

DEFAULT = "none"

for _cls in (NonePolicy, MFit, AMFit, MAdvise, Salus):
    register(_cls)
del _cls

__all__ = [
    "ALLOCATION_KINDS",
    "DEFAULT",
    "DROP_REASONS",
    "RUN",
    "AMFit",
    "AllocationView",
    "Bytes",
    "Controls",
    "Decision",
    "GpuView",
    "KernelView",
    "LaunchView",
    "MAdvise",
    "MFit",
    "NonePolicy",
    "NvmlView",
    "Policy",
    "PolicyConfigError",
    "PreemptionView",
    "RangeView",
    "Salus",
    "Seconds",
    "SessionView",
    "UnknownPolicy",
    "Verdict",
    "Watch",
    "available",
    "create",
    "load_plugin",
    "parse_settings",
    "register",
]
