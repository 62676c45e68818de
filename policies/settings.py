"""Knobs of a policy: the fields of its `Settings` dataclass, read from the TOML table
`[policy.<name>]`.

A field may be annotated `bool`, `int`, `float`, `str`, `Bytes` (an int of bytes; TOML gives a
string with a unit such as "8GiB", or 0), `Seconds` (a float; a number or "250ms"), `X | None` of
those (None: not given; TOML has no null), or `tuple[X, ...]` of those (a TOML array). A field
with no default is required. Every mistake is a PolicyConfigError naming `policy.<name>.<key>`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Annotated, Any

from .errors import PolicyConfigError


class _Unit:
    __slots__ = ("unit",)

    def __init__(self, unit: str) -> None:
        self.unit = unit

    def __repr__(self) -> str:
        return f"<{self.unit}>"


_BYTES = _Unit("bytes")
_SECONDS = _Unit("seconds")
Bytes = Annotated[int, _BYTES]
"""A size knob: "512MiB", "8GiB", "1.5GB", "4096B", 0. As in pilotd's config, a number needs a
unit unless it is 0; KiB..TiB (1024) take any case, KB/MB/GB/TB (1000) and B only as written."""
Seconds = Annotated[float, _SECONDS]
"""A duration knob: 0.5, "500ms", "2s", "1m", "250us", "1h"."""

_BINARY_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # any case
_EXACT_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}  # as written
_DURATION_UNITS = {"": Decimal(1), "us": Decimal("1e-6"), "ms": Decimal("1e-3"), "s": Decimal(1),
                   "m": Decimal(60), "h": Decimal(3600)}
_NUMBER = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")

Converter = Callable[[Any], Any]  # value -> converted value; raises ValueError("expected ...")


def _expect(what: str, value: Any) -> ValueError:
    return ValueError(f"expected {what}, got {value!r} ({type(value).__name__})")


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise _expect("true or false", v)


def _int(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise _expect("an integer", v)


def _float(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    raise _expect("a finite number", v)


def _str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise _expect("a string", v)


def _bytes(v: Any) -> int:
    if v == 0 and not isinstance(v, bool):
        return 0
    m = _NUMBER.fullmatch(v) if isinstance(v, str) else None
    unit = m.group(2) if m else ""
    mult = _EXACT_UNITS.get(unit) or _BINARY_UNITS.get(unit.lower()) if m else None
    if m is not None and not unit and Decimal(m.group(1)) == 0:
        return 0
    if m is None or mult is None:
        raise _expect('a size with a unit (such as "512MiB", "8GiB", "8GB" or "4096B"; 0)', v)
    value = Decimal(m.group(1)) * mult
    if value != value.to_integral_value() and mult == 1:
        raise _expect("whole bytes", v)
    return int(value)  # toward zero: whole bytes


def parse_size(v: Any) -> int:
    """A size as the Bytes knobs take it ("512MiB", "8GiB", 0); ValueError otherwise."""
    return _bytes(v)


def _seconds(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
        return float(v)
    m = _NUMBER.fullmatch(v) if isinstance(v, str) else None
    mult = _DURATION_UNITS.get(m.group(2).lower()) if m else None
    if m is None or mult is None:
        raise _expect('a duration (seconds, or a string such as "500ms" or "2s")', v)
    return float(Decimal(m.group(1)) * mult)


def parse_duration(v: Any) -> float:
    """A duration as the duration knobs take it (seconds, "500ms", "2s"); ValueError otherwise."""
    return _seconds(v)


_SCALARS: dict[Any, Converter] = {bool: _bool, int: _int, float: _float, str: _str}


def _converter(tp: Any) -> Converter:
    """The converter for one field annotation; TypeError for one this module does not support."""
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated and args[1:] == (_BYTES,):
        return _bytes
    if origin is Annotated and args[1:] == (_SECONDS,):
        return _seconds
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return _converter(args[0] if args[1] is type(None) else args[1])
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _converter(args[0])

        def _tuple(v: Any) -> tuple[Any, ...]:
            if not isinstance(v, (list, tuple)):
                raise _expect("an array", v)
            try:
                return tuple(item(x) for x in v)
            except ValueError as e:
                raise ValueError(f"array item: {e}") from None

        return _tuple
    raise TypeError(f"unsupported knob type {tp!r} (use bool, int, float, str, Bytes, Seconds, "
                    "X | None or tuple[X, ...])")


def settings_converters(policy: type) -> dict[str, Converter]:
    """{field: converter} of `policy.Settings`, checking that it is a frozen dataclass whose
    fields all have supported types; PolicyConfigError otherwise. {} when there are no knobs."""
    settings = getattr(policy, "Settings", None)
    name = getattr(policy, "name", "") or policy.__name__
    if settings is None:
        return {}
    if not (isinstance(settings, type) and dataclasses.is_dataclass(settings)
            and settings.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise PolicyConfigError(f"policy {name}: Settings must be a frozen dataclass")
    try:
        hints = typing.get_type_hints(settings, include_extras=True)
        return {f.name: _converter(hints[f.name]) for f in dataclasses.fields(settings) if f.init}
    except Exception as e:  # NameError from a string annotation, TypeError from _converter
        raise PolicyConfigError(f"policy {name}: Settings: {e}") from None


def parse_settings(policy: type, table: Mapping[str, Any] | None) -> Any:
    """An instance of `policy.Settings` from the TOML table `[policy.<name>]` (None or {}: all
    defaults), or None for a policy without knobs and an empty table. Raises PolicyConfigError
    naming the key: an unknown key, a missing required one, a value of the wrong type, or what
    Settings' own __post_init__ refuses (ValueError/TypeError)."""
    name = getattr(policy, "name", "") or policy.__name__
    table = dict(table or {})
    converters = settings_converters(policy)
    for key in table:
        if key not in converters:
            near = difflib.get_close_matches(str(key), list(converters), n=1)
            hint = (f" (did you mean {near[0]!r}?)" if near else
                    f" (known: {', '.join(converters)})" if converters else
                    " (this policy has no settings)")
            raise PolicyConfigError(f"policy.{name}: unknown key {key!r}{hint}")
    settings = policy.Settings  # type: ignore[attr-defined]
    if settings is None:
        return None
    values: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        if not f.init:
            continue
        if f.name in table:
            try:
                values[f.name] = converters[f.name](table[f.name])
            except ValueError as e:
                raise PolicyConfigError(f"policy.{name}.{f.name}: {e}") from None
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PolicyConfigError(f"policy.{name}: missing key {f.name!r} (required)")
    try:
        return settings(**values)
    except (ValueError, TypeError) as e:
        raise PolicyConfigError(f"policy.{name}: {e}") from None
