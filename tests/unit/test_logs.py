"""pilotd's structured log lines: text and JSON formats, quoting, extras, journald priorities."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pilot.daemon.telemetry.logs import (
    StructuredFormatter,
    journal_connected,
    quote,
    session_extra,
    setup_logging,
    syslog_priority,
)

CREATED = 1795323600.123  # 2026-11-22T05:00:00.123Z


def record(msg: str, *args: object, level: int = logging.INFO, extra: dict | None = None,
           exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("pilot.vgpu", level, __file__, 1, msg, args, exc_info)
    rec.created, rec.msecs, rec.threadName = CREATED, 123.0, "vgpu-0"
    for k, v in (extra or {}).items():
        setattr(rec, k, v)
    return rec


def test_text_line_has_fixed_keys_in_order() -> None:
    line = StructuredFormatter("text").format(
        record("quota: %s refused", "alice", level=logging.WARNING,
               extra=session_extra(3, "user:alice", "cudaMalloc")))
    assert line == ('ts=2026-11-22T05:00:00.123Z level=warning thread=vgpu-0 logger=pilot.vgpu '
                    'session=3 tenant=user:alice call=cudaMalloc msg="quota: alice refused"')


def test_extras_only_when_present() -> None:
    fmt = StructuredFormatter("text")
    assert fmt.format(record("hi")) == ('ts=2026-11-22T05:00:00.123Z level=info thread=vgpu-0 '
                                        'logger=pilot.vgpu msg="hi"')
    line = fmt.format(record("hi", extra=session_extra(7, "ml-team")))
    assert "session=7 tenant=ml-team msg=" in line and "call=" not in line


@pytest.mark.parametrize("value, expected", [
    ("plain", "plain"),
    ("user:alice", "user:alice"),
    ("two words", '"two words"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("a=b", '"a=b"'),
    ("back\\slash", '"back\\\\slash"'),
    ("line\nbreak", '"line\\nbreak"'),
    ("tab\there", '"tab\\there"'),
    ("", '""'),
    ("café", "café"),
])
def test_quote(value: str, expected: str) -> None:
    assert quote(value) == expected
    if expected.startswith('"'):
        assert json.loads(expected) == value  # quoted values read back as JSON strings


def test_message_with_newline_and_quotes_stays_one_line() -> None:
    line = StructuredFormatter("text").format(record('bad "frame"\nnext', extra={"tenant": "a b"}))
    assert "\n" not in line
    assert line.endswith('tenant="a b" msg="bad \\"frame\\"\\nnext"')


def test_exception_text_is_kept_on_the_line() -> None:
    text = StructuredFormatter("text").format(record("failed", level=logging.ERROR, exc=True))
    assert "\n" not in text
    m = re.search(r' exc=(".*")$', text)
    assert m is not None
    exc = json.loads(m.group(1))
    assert exc.startswith("Traceback") and "RuntimeError: boom" in exc


def test_json_format() -> None:
    fmt = StructuredFormatter("json")
    obj = json.loads(fmt.format(record("alloc %d", 4096, extra=session_extra(3, "user:alice", "cudaMalloc"))))
    assert obj == {"ts": "2026-11-22T05:00:00.123Z", "level": "info", "thread": "vgpu-0",
                   "logger": "pilot.vgpu", "session": 3, "tenant": "user:alice", "call": "cudaMalloc",
                   "msg": "alloc 4096"}
    assert list(obj) == ["ts", "level", "thread", "logger", "session", "tenant", "call", "msg"]
    obj = json.loads(fmt.format(record("failed", level=logging.ERROR, exc=True)))
    assert "RuntimeError: boom" in obj["exc"] and "session" not in obj


@pytest.mark.parametrize("level, prio", [
    (logging.DEBUG, 7), (logging.INFO, 6), (logging.WARNING, 4), (logging.ERROR, 3),
    (logging.CRITICAL, 2), (logging.INFO + 5, 6), (5, 7),
])
def test_syslog_priority(level: int, prio: int) -> None:
    assert syslog_priority(level) == prio


def test_journal_mode_prefixes_priority_and_drops_timestamp() -> None:
    text = StructuredFormatter("text", journal=True)
    assert text.format(record("x", level=logging.WARNING)) == \
        '<4>level=warning thread=vgpu-0 logger=pilot.vgpu msg="x"'
    assert text.format(record("x", level=logging.ERROR)).startswith("<3>level=error ")
    assert text.format(record("x", level=logging.DEBUG)).startswith("<7>level=debug ")
    line = StructuredFormatter("json", journal=True).format(record("x"))
    assert line.startswith("<6>{")
    assert "ts" not in json.loads(line[3:])


def test_unknown_format_and_level() -> None:
    with pytest.raises(ValueError):
        StructuredFormatter("xml")
    with pytest.raises(ValueError):
        setup_logging("loud")


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root")
def test_setup_logging_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    out = io.StringIO()
    setup_logging("warning", "text", stream=out)
    log = logging.getLogger("pilot.test")
    log.info("hidden")
    log.warning("shown %d", 1, extra=session_extra(9, "user:bob"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert re.fullmatch(r'ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=warning thread=\S+ '
                        r'logger=pilot\.test session=9 tenant=user:bob msg="shown 1"', lines[0])
    # a second call replaces the first handler instead of doubling every line
    out2 = io.StringIO()
    setup_logging("debug", "json", stream=out2, journal=True)
    log.debug("d")
    assert out.getvalue().splitlines() == lines
    assert json.loads(out2.getvalue()[3:])["msg"] == "d" and out2.getvalue().startswith("<7>")


def test_journal_connected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(tmp_path / "stream", "w") as f, open(tmp_path / "other", "w") as g:
        st = os.fstat(f.fileno())
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
        assert not journal_connected(f)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert journal_connected(f)
        assert not journal_connected(g)              # stderr redirected away from the journal
        assert not journal_connected(io.StringIO())  # no file descriptor
        monkeypatch.setenv("JOURNAL_STREAM", "junk")
        assert not journal_connected(f)


@pytest.mark.usefixtures("restore_root")
def test_setup_logging_detects_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(tmp_path / "journal", "w") as f:
        st = os.fstat(f.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        setup_logging("info", stream=f)
        logging.getLogger("pilot.test").error("oops")
    assert (tmp_path / "journal").read_text() == \
        '<3>level=error thread=MainThread logger=pilot.test msg="oops"\n'
