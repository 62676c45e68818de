"""Session: module variables (SYMBOL_GET) are memory of the session that looked them up, one
variable at a time, until their module goes away."""

from __future__ import annotations

from typing import Any

import pytest

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError
from pilot.daemon.sessions.session import Credentials, Session

MODULE = 0x10


def _session() -> Session:
    return Session(id=1, creds=Credentials(uid=0, gid=0, pid=0), vgpu=0, device=0)


def _refused(s: Session, ptr: int, count: int) -> bool:
    try:
        s.check_range(ptr, count)
    except BackendError as exc:
        assert exc.code == CUDA_ERROR_INVALID_VALUE
        return True
    return False


def test_variables_are_session_memory() -> None:
    s = _session()
    s.add_allocation(0x1000, 0x100)
    assert _refused(s, 0x5000, 4)
    s.add_symbol(MODULE, 0x5000, 64)
    s.add_symbol(MODULE, 0x5000, 64)  # looked up twice: recorded once
    s.add_symbol(MODULE, 0x5040, 4)
    assert len(s.symbols) == 2
    for ptr, count in ((0x5000, 64), (0x5010, 16), (0x5040, 4), (0x5044, 0), (0x1000, 0x100)):
        assert not _refused(s, ptr, count), (hex(ptr), count)
    # Past a variable's end (even into the next one), before the first, after the last.
    for ptr, count in ((0x5000, 65), (0x503C, 8), (0x4FFF, 2), (0x5044, 1), (0x10FF, 2)):
        assert _refused(s, ptr, count), (hex(ptr), count)
    assert 0x5000 not in s.allocations and s.device_bytes == 0x100  # never an allocation


def test_variables_go_with_their_module() -> None:
    s = _session()
    s.add_symbol(MODULE, 0x5000, 8)
    s.add_symbol(MODULE + 1, 0x9000, 8)
    s.forget_module_symbols(MODULE)
    assert _refused(s, 0x5000, 8) and not _refused(s, 0x9000, 8)


class _Recorder:
    def __init__(self) -> None:
        self.unloaded: list[Any] = []

    def module_unload(self, module: Any) -> None:
        self.unloaded.append(module)

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def test_release_forgets_variables() -> None:
    s = _session()
    s.modules[MODULE] = "module object"
    s.add_symbol(MODULE, 0x5000, 8)
    backend = _Recorder()
    s.release(backend, None)  # type: ignore[arg-type]
    assert backend.unloaded == ["module object"]
    assert not s.symbols and _refused(s, 0x5000, 8)


@pytest.mark.parametrize("count", [0, 1, 8])
def test_no_variables_no_change(count: int) -> None:
    s = _session()
    s.add_allocation(0x1000, 8)
    assert not _refused(s, 0x1000, count)
    assert _refused(s, 0x2000, max(count, 1))
