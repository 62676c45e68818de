"""Policies by name: register, list, create, and load plugins that register more.

The registry is filled at import (the built-ins, in pilot.policies) and at start (plugins);
it is not meant to change while the daemon runs.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from .api import Policy
from .errors import PolicyConfigError, UnknownPolicy
from .settings import settings_converters

NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")  # also a bare TOML key: [policy.<name>]
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

_registry: dict[str, type[Policy]] = {}
_plugin_modules: dict[str, str] = {}  # resolved plugin path -> the module name it was loaded as

P = TypeVar("P", bound=type[Policy])


def register(cls: P) -> P:
    """Class decorator: make a Policy subclass available under `cls.name`. Refuses (with
    PolicyConfigError) a name taken by another class, a malformed name, and a Settings class
    with a knob type pilot.policies.settings does not support."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise PolicyConfigError(f"register: {cls!r} is not a Policy subclass")
    name = cls.name
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise PolicyConfigError(f"register: {cls.__module__}.{cls.__qualname__}: name {name!r} must be "
                                "lower case letters, digits, '-' or '_'")
    other = _registry.get(name)
    if other is not None and other is not cls:
        raise PolicyConfigError(f"register: policy name {name!r} of {cls.__module__}.{cls.__qualname__} "
                                f"is taken by {other.__module__}.{other.__qualname__}")
    settings_converters(cls)
    _registry[name] = cls
    return cls


def available() -> dict[str, type[Policy]]:
    """Every registered policy by name, sorted; implemented or not (see Policy.implemented)."""
    return dict(sorted(_registry.items()))


def _names(implemented: bool) -> str:
    return ", ".join(repr(n) for n, c in sorted(_registry.items()) if c.implemented is implemented)


def create(name: str, table: Mapping[str, Any] | None = None) -> Policy:
    """A new instance of the policy `name` with its knobs from `table` (`[policy.<name>]`).
    UnknownPolicy for a name not registered or not implemented in this version;
    PolicyConfigError for a wrong table."""
    cls = _registry.get(name)
    if cls is None:
        near = difflib.get_close_matches(str(name), list(_registry), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        planned = _names(False)
        planned = f" (not implemented yet: {planned})" if planned else ""
        raise UnknownPolicy(f"unknown policy {name!r}{hint}; available: {_names(True)}{planned}")
    if not cls.implemented:
        what = f" ({cls.summary})" if cls.summary else ""
        raise UnknownPolicy(f"policy {name!r}{what} is not implemented in this version of pilot; "
                            f"available: {_names(True)}")
    return cls(cls.parse_settings(table))


def load_plugin(spec: str) -> tuple[str, ...]:
    """Import a plugin: a dotted module name ("site_policies.fair") or the path of a .py file;
    it defines Policy subclasses decorated with @register. Returns the names it registered.
    Loading the same plugin again does nothing more. A plugin that fails to import, or registers
    nothing, is a PolicyConfigError naming `spec`; what it registered before failing is undone."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyConfigError(f"policy plugin {spec!r}: expected a module name or a .py path")
    is_path = spec.endswith(".py") or "/" in spec or spec.startswith("~")
    if not is_path and not _MODULE.fullmatch(spec):
        raise PolicyConfigError(f"policy plugin {spec!r}: not a module name nor a .py path")
    path = Path(spec).expanduser().resolve() if is_path else None
    if path is not None and str(path) not in _plugin_modules and not path.is_file():
        raise PolicyConfigError(f"policy plugin {spec}: no such file")
    before = dict(_registry)
    try:
        module_name = _import_path(path) if path is not None else importlib.import_module(spec).__name__
    except BaseException as e:
        _registry.clear()
        _registry.update(before)
        if isinstance(e, KeyboardInterrupt):
            raise
        what = str(e) if isinstance(e, PolicyConfigError) else f"{type(e).__name__}: {e}"
        raise PolicyConfigError(f"policy plugin {spec}: {what}") from e
    names = tuple(sorted(set(_registry) - set(before)
                         | {n for n, c in _registry.items() if c.__module__ == module_name}))
    if not names:
        raise PolicyConfigError(f"policy plugin {spec}: registers no policy (decorate a Policy "
                                "subclass with @pilot.policies.register)")
    return names


def _import_path(path: Path) -> str:
    key = str(path)
    if key in _plugin_modules:
        return _plugin_modules[key]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"pilot_policy_plugin_{stem}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ImportError("not an importable .py file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # before running it: dataclasses and typing look the module up
    try:
        loader_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _plugin_modules[key] = name
    return name
