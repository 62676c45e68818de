"""Small helpers every chapter's handlers use: u64 replies, payload and staging-slot checks."""

from __future__ import annotations

from typing import Any

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError
from pilot.daemon.protocol import new


def u64(value: int, value2: int = 0) -> Any:
    rep = new("pilot_rep_u64")
    rep.value, rep.value2 = value, value2
    return rep


def need_payload(payload: memoryview, size: int, what: str) -> None:
    if len(payload) != size:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"{what}: payload of {len(payload)} bytes, expected {size}")


def staging_slot(s: Any, req: Any, fault: bool = False) -> memoryview:
    """Slot req.slot of the session's staging area (fault: the fault channel's), req.count bytes."""
    area = s.fault_staging if fault else s.staging
    if area is None:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"no {'fault ' if fault else ''}staging area open")
    try:
        return area.slot(req.slot, req.count)
    except ValueError as exc:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, str(exc)) from None
