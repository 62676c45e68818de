"""What a session holds of CUDA arrays, texture and surface objects (daemon/ops/arrays.py), and
how it gives them back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pilot.daemon.backends.base import ArrayShape, Backend


@dataclass
class ArrayRecord(ArrayShape):
    """One of the session's arrays, by its handle."""

    obj: Any = None  # the backend's array
    flags: int = 0
    charged: int = 0  # bytes the broker charged for it


def release_objects(s: Any, backend: Backend, stream: Any) -> list[tuple[int, int]]:
    """Destroy the session's texture and surface objects, then its arrays (zeroed on `stream`
    first); returns (handle, bytes charged) of each array freed, for the broker. The caller has
    let the session's streams finish."""
    for handle in list(s.textures):
        backend.texture_destroy(handle)
        del s.textures[handle]
    for handle in list(s.surfaces):
        backend.surface_destroy(handle)
        del s.surfaces[handle]
    freed = []
    for handle, rec in list(s.arrays.items()):
        del s.arrays[handle]
        backend.array_destroy(rec.obj, stream)
        freed.append((handle, rec.charged))
    return freed
