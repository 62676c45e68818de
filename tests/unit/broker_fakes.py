"""Stand-ins for what the resource broker and the policy host read, for unit tests that drive
them without a daemon: the quota store, and a session as far as they look at it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class Quotas:
    """Every tenant has the same hard quota (`hard`, None: none) and nothing provisioned."""

    def __init__(self, hard: int | None = None) -> None:
        self.hard = hard

    def get(self, tenant: str, gpu: int) -> Any:
        return SimpleNamespace(hard=self.hard, provisioned=None)

    def provisioned_on(self, gpu: int) -> dict[str, int]:
        return {}


def session(sid: int = 1, tenant: str = "user:a", gpu: int = 0) -> Any:
    """A session part on `gpu`, holding nothing yet and not held by a policy."""
    return SimpleNamespace(id=sid, tenant=tenant, device=gpu, vgpu=0, charged={}, packed_ranges=set(),
                           kernels=0, creds=SimpleNamespace(pid=100 + sid), policy_hold=None)
