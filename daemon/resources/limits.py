"""cudaDeviceSetLimit on a context every tenant shares.

A GPU's CUDA context (the primary context, used by every vGPU of that GPU) has one value per
limit (stack size, printf FIFO, malloc heap, ...). A tenant lowering one would break the kernels
of every other tenant, so pilot does not apply requests as they come:

- the effective value of a limit is the largest of the context's own default (read before the
  first request) and the values that live sessions asked for;
- a request always succeeds when the driver accepts the resulting value, and the reply (like
  every cudaDeviceGetLimit) reports the context's effective value, which may be larger than
  what the session asked for (or rounded by the driver: a stack of 1000 bytes reads back 1008);
- when a session ends, its requests are dropped and the limit goes back down to what the
  remaining sessions asked for, or to the default.

Limits the driver only accepts before some work ran (the printf FIFO and malloc heap sizes
cannot change once a kernel used printf or malloc in the context) fail as the driver says,
whichever tenant launched that kernel. A device reset does not drop a session's requests.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from pilot.daemon.backends.base import Backend

log = logging.getLogger("pilot.limits")

# cudaLimit values of CUDA 13.0 (driver_types.h); the driver's CUlimit numbers are the same.
LIMIT_NAMES = {
    0: "stack_size",
    1: "printf_fifo_size",
    2: "malloc_heap_size",
    3: "dev_runtime_sync_depth",
    4: "dev_runtime_pending_launch_count",
    5: "max_l2_fetch_granularity",
    6: "persisting_l2_cache_size",
}


class ContextLimits:
    """The limits of one context: its defaults, and each session's requests. Thread-safe (the
    vGPU threads of one GPU share it); backend calls act on the calling thread's context, so
    every call must come from a thread bound to this context's device."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._default: dict[int, int] = {}  # limit -> the context's value before any request
        self._applied: dict[int, int] = {}  # limit -> value pilot last set
        self._requests: dict[int, dict[int, int]] = {}  # limit -> session id -> value

    def get(self, limit: int) -> int:
        return self._backend.ctx_get_limit(limit)

    def default(self, limit: int) -> int:
        """The context's own value of the limit, before any request."""
        with self._lock:
            if limit not in self._default:
                self._default[limit] = self._backend.ctx_get_limit(limit)
            return self._default[limit]

    def request(self, session: int, limit: int, value: int) -> int:
        """Record `session`'s request and apply the largest one; returns the effective value.
        Raises BackendError (and records nothing) if the driver refuses the value."""
        with self._lock:
            if limit not in self._default:
                self._default[limit] = self._backend.ctx_get_limit(limit)
            others = self._requests.get(limit, {})
            target = max([value, self._default[limit],
                          *(v for sid, v in others.items() if sid != session)])
            self._apply(limit, target)
            self._requests.setdefault(limit, {})[session] = value
            return self._backend.ctx_get_limit(limit)

    def release(self, session: int) -> None:
        """Drop the session's requests; lower the limits it alone held up. Best effort: a
        driver that refuses is logged, and the value stays."""
        with self._lock:
            for limit, requests in self._requests.items():
                if requests.pop(session, None) is None:
                    continue
                target = max([self._default[limit], *requests.values()])
                try:
                    self._apply(limit, target)
                except Exception as exc:
                    log.warning("limit %s: cannot go back to %d: %s",
                                LIMIT_NAMES.get(limit, limit), target, exc)

    def _apply(self, limit: int, target: int) -> None:
        if self._applied.get(limit, self._default[limit]) != target:
            self._backend.ctx_set_limit(limit, target)
            self._applied[limit] = target


# Limits that size device memory: stack (per thread), printf FIFO and malloc heap (bytes).
STACK, PRINTF_FIFO, MALLOC_HEAP = 0, 1, 2
CHARGED = (STACK, PRINTF_FIFO, MALLOC_HEAP)  # the others are raised by admins only (ops/device.py)
_ATTR_SM_COUNT, _ATTR_THREADS_PER_SM = 16, 39  # cudaDevAttrMultiProcessorCount, MaxThreadsPerMultiProcessor


def request_bytes(limit: int, value: int, default: int, info: Any) -> int:
    """Device memory a request of `value` takes beyond the context's `default`: the FIFO and
    the heap are that many bytes; a stack is reserved for every thread the GPU can hold at once
    (SMs x threads per SM). Other limits take none."""
    extra = max(0, value - default)
    if limit == STACK:
        attrs = getattr(info, "attrs", {}) or {}
        return extra * (attrs.get(_ATTR_SM_COUNT) or 1) * (attrs.get(_ATTR_THREADS_PER_SM) or 2048)
    return extra if limit in (PRINTF_FIFO, MALLOC_HEAP) else 0


_tables: weakref.WeakKeyDictionary[Any, dict[int, ContextLimits]] = weakref.WeakKeyDictionary()
_tables_lock = threading.Lock()


def for_context(backend: Backend, device: int) -> ContextLimits:
    """The one ContextLimits of `backend`'s device `device` (its context)."""
    with _tables_lock:
        per_device = _tables.setdefault(backend, {})
        table = per_device.get(device)
        if table is None:
            table = per_device[device] = ContextLimits(backend)
        return table
