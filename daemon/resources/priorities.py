"""Per-tenant priority classes: `high`, `normal` (everyone's default) and `low`.

`PriorityStore` keeps each tenant's class in `<state_dir>/priorities.json`, written like
shares.json (atomic replace, survives restarts). A named tenant's `priority` in the config file
is its default; what pilotctl sets wins. Reads take no lock (writers swap in a new table).
What a class does is scheduling/priority.py's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from pilot.daemon.config import PRIORITIES, check_priority
from pilot.daemon.resources.tenants import _check_tenant, read_state_file, write_json_atomic

PRIORITIES_FILE = "priorities.json"
PRIORITIES_VERSION = 1

# class name -> level; a session is gated while a tenant of a higher level is active on its GPU
LEVELS: dict[str, int] = {name: level for level, name in enumerate(PRIORITIES)}
NAMES: dict[int, str] = {level: name for name, level in LEVELS.items()}
DEFAULT = "normal"


class PriorityFileError(ValueError):
    """priorities.json cannot be read or holds an unknown class; pilotd does not start so."""


class PriorityStore:
    """Per-tenant priority classes persisted in `<state_dir>/priorities.json`."""

    def __init__(self, state_dir: str, defaults: Mapping[str, str] | None = None) -> None:
        self.path = os.path.join(state_dir, PRIORITIES_FILE)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.defaults = {t: check_priority(p) for t, p in (defaults or {}).items()}
        self._lock = threading.Lock()
        self._set: dict[str, str] = self._read()

    def name(self, tenant: str) -> str:
        """The tenant's class: pilotctl's entry, else the config's, else normal."""
        return self._set.get(tenant) or self.defaults.get(tenant) or DEFAULT

    def level(self, tenant: str) -> int:
        return LEVELS[self.name(tenant)]

    def uniform(self) -> bool:
        """Every tenant is normal: no one gates anyone."""
        return all(p == DEFAULT for p in (*self.defaults.values(), *self._set.values()))

    def set(self, tenant: str, priority: str) -> None:
        _check_tenant(tenant)
        priority = check_priority(priority)
        with self._lock:
            self._commit({**self._set, tenant: priority})

    def unset(self, tenant: str) -> bool:
        """Remove the tenant's pilotctl entry (the config's default applies again); False if none."""
        with self._lock:
            if tenant not in self._set:
                return False
            self._commit({t: p for t, p in self._set.items() if t != tenant})
        return True

    def list(self) -> dict[str, dict[str, str]]:
        """Every tenant with a class other than the default or an entry: its class and where it
        comes from (pilotctl or config)."""
        out = {t: {"priority": p, "from": "config"} for t, p in self.defaults.items()}
        out.update({t: {"priority": p, "from": "pilotctl"} for t, p in self._set.items()})
        return dict(sorted(out.items()))

    def reload(self) -> None:
        with self._lock:
            self._set = self._read()

    def _commit(self, table: dict[str, str]) -> None:
        write_json_atomic(self.path, {"version": PRIORITIES_VERSION, "priorities": table})
        self._set = table

    def _read(self) -> dict[str, str]:
        return read_state_file(self.path, _parse, PriorityFileError) or {}


def _parse(doc: Any) -> dict[str, str]:
    if not isinstance(doc, dict) or doc.get("version") != PRIORITIES_VERSION:
        raise ValueError(f"expected version {PRIORITIES_VERSION}")
    table = doc.get("priorities")
    if not isinstance(table, dict):
        raise ValueError("priorities must be an object")
    return {_check_tenant(t): check_priority(p) for t, p in table.items()}
