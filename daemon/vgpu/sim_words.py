"""The sim backend's side of the fast path's completion words (daemon/native/fast_words.c):
registering a ring's GPU page, writing its word in stream order, and the markers that say when a
write has happened. C calls `call` through cffi (pilot_fast_word_fn) on the vGPU thread."""

from __future__ import annotations

import itertools
from typing import Any

from pilot.daemon.backends.base import BackendError
from pilot.daemon.protocol import lib

CUDA_ERROR_UNKNOWN = 999


class SimWords:
    def __init__(self, backend: Any, objects: dict[int, Any]) -> None:
        """objects: the fast path's raw stream values -> the sim's stream objects."""
        self._backend = backend
        self._objects = objects
        self._markers: dict[int, list[bool]] = {}
        self._next = itertools.count(1)

    def call(self, op: int, a: int, b: int, value: int, out: Any) -> int:
        """One pilot_fast_word_op; 0, a CUresult, or for DONE 1 (written) / 0 (not yet)."""
        try:
            if op == lib.PILOT_WORD_REGISTER:
                self._backend.map_host(a, b)
                out[0] = self._backend.host_device_pointer(a)
            elif op == lib.PILOT_WORD_WRITE:
                marker = next(self._next)
                self._markers[marker] = self._backend.stream_write_value32(self._objects[a],
                                                                           b, value)
                out[0] = marker
            elif op == lib.PILOT_WORD_DONE:
                written = self._markers.get(a)
                return 1 if written is None or written[0] else 0
            elif op == lib.PILOT_WORD_FORGET:
                self._markers.pop(a, None)
            elif op == lib.PILOT_WORD_UNREGISTER:
                self._backend.host_unregister(a)
            else:
                return CUDA_ERROR_UNKNOWN
        except BackendError as exc:
            return exc.code or CUDA_ERROR_UNKNOWN
        return 0
