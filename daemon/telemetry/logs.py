"""pilotd's log lines: one record per line, as `key=value` text or JSON, on stderr.

Operators grep and ship these lines, so every record carries the same keys in the same order:

    ts=2026-11-22T05:00:00.123Z level=warning thread=vgpu-0 logger=pilot.vgpu session=3 \
tenant=user:alice call=cudaMalloc msg="quota: ... refused"

`session`, `tenant` and `call` appear only when the caller passed them with `extra=` (see
`session_extra`), so a line about a tenant's allocation can be found by tenant or session.
Values that contain spaces, quotes, '=', backslashes or control characters are quoted as JSON
strings (so a message with a newline stays one line); `msg` is always quoted. A traceback goes in
`exc`. The JSON format has the same keys, one object per line, for log collectors.

Under systemd stderr goes to the journal, which stamps each line itself and keeps a priority per
line: there the timestamp is left out and each line starts with `<N>`, the syslog priority
(sd-daemon(3)), so `journalctl -p warning -u pilotd` works.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

EXTRA_KEYS = ("session", "tenant", "call")
FORMATS = ("text", "json")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}

_NEEDS_QUOTES = frozenset(' "=\\')


def syslog_priority(levelno: int) -> int:
    """The syslog priority journald should file a record of this logging level under."""
    if levelno >= logging.CRITICAL:
        return 2  # crit
    if levelno >= logging.ERROR:
        return 3  # err
    if levelno >= logging.WARNING:
        return 4  # warning
    if levelno >= logging.INFO:
        return 6  # info
    return 7  # debug


def quote(value: str) -> str:
    """`value` as it appears after `key=`: bare when unambiguous, else a JSON string literal."""
    if value and value.isprintable() and not any(c in _NEEDS_QUOTES for c in value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _timestamp(record: logging.LogRecord) -> str:
    """UTC, ISO 8601 with milliseconds: sortable and unambiguous across hosts and DST."""
    ms = min(int(record.msecs), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{ms:03d}Z"


class StructuredFormatter(logging.Formatter):
    """Formats a record as one `key=value` line (fmt "text") or one JSON object (fmt "json");
    journal=True drops the timestamp and prefixes the syslog priority `<N>`."""

    def __init__(self, fmt: str = "text", journal: bool = False) -> None:
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.journal = journal

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """The record's keys in their fixed order; absent extras are left out."""
        out: dict[str, Any] = {}
        if not self.journal:
            out["ts"] = _timestamp(record)
        out["level"] = record.levelname.lower()
        out["thread"] = record.threadName
        out["logger"] = record.name
        for key in EXTRA_KEYS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        out["msg"] = record.getMessage()
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return out

    def format(self, record: logging.LogRecord) -> str:
        fields = self.fields(record)
        if self.fmt == "json":
            line = json.dumps(fields, ensure_ascii=False, default=str)
        else:
            line = " ".join(
                f"{k}={json.dumps(v, ensure_ascii=False) if k == 'msg' else quote(str(v))}"
                for k, v in fields.items())
        if self.journal:
            return f"<{syslog_priority(record.levelno)}>{line}"
        return line


def journal_connected(stream: TextIO) -> bool:
    """True when `stream` is the journal stream systemd connected (sd-daemon(3): $JOURNAL_STREAM
    holds "DEV:INODE" of that stream; comparing with fstat tells it apart from a stderr that a
    wrapper redirected elsewhere, where a `<N>` prefix would be noise)."""
    value = os.environ.get("JOURNAL_STREAM")
    if not value:
        return False
    try:
        dev, ino = (int(part) for part in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def setup_logging(level: str, fmt: str = "text", stream: TextIO | None = None,
                  journal: bool | None = None) -> logging.Handler:
    """Send the root logger's records at `level` (debug|info|warning|error) and above to stderr
    (or `stream`) as `fmt` ("text" or "json") lines. `journal` defaults to whether the stream is
    systemd's journal stream. Calling it again replaces the handler it installed before (and
    leaves other handlers, e.g. pytest's, alone). Returns the installed handler."""
    levelno = LEVELS.get(level.lower())
    if levelno is None:
        raise ValueError(f"log level {level!r}: use debug, info, warning or error")
    stream = sys.stderr if stream is None else stream
    if journal is None:
        journal = journal_connected(stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(StructuredFormatter(fmt, journal=journal))
    handler._pilot = True  # type: ignore[attr-defined]  # marks the handler to replace next time
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_pilot", False):
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    root.setLevel(levelno)
    return handler


def session_extra(session_id: int, tenant: str, call: str | None = None) -> dict[str, Any]:
    """`extra=` for a log call about a session: `log.warning("...", extra=session_extra(s.id,
    s.tenant, "cudaMalloc"))` puts session=, tenant= and call= on the line."""
    extra: dict[str, Any] = {"session": session_id, "tenant": tenant}
    if call is not None:
        extra["call"] = call
    return extra
