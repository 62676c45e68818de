"""Freeing what a session owns: one allocation (zeroed first), or everything at its end.
Mixed into Session."""

from __future__ import annotations

import logging
from typing import Any

from pilot.daemon.backends.base import Backend, BackendError
from pilot.daemon.sessions.arrays import release_objects

log = logging.getLogger("pilot.session")


class Teardown:
    """Methods of Session (its fields are declared there)."""

    def free_memory(self, backend: Backend, ptr: int, stream: Any) -> None:
        """Frees one of the session's allocations, device memory zeroed first: tenants share one
        CUDA context, whose allocator hands freed memory to the next allocation as it was, so a
        tenant could otherwise read what another freed (natively each process has its own
        context and gets scrubbed memory). Managed memory needs no zeroing: the driver zeroes
        the pages it populates (so neither does device memory served with it, driver_zeroed).
        The caller has synchronized the work that may still use ptr; the zeroing goes on
        `stream` and is waited for (cuMemFree waits for it anyway)."""
        size = self.allocations.get(ptr, 0)
        if size and ptr not in self.managed and ptr not in self.driver_zeroed:
            backend.memset_d8(ptr, 0, size, stream)
            backend.stream_synchronize(stream)
        backend.mem_free(ptr)

    def zero_module_globals(self, backend: Backend, handle: int, module: Any, stream: Any) -> None:
        """Zero a module's variables before it is unloaded: the driver hands the memory of an
        unloaded module to the next allocation in the shared context as it was, so another
        tenant's cudaMalloc could read this session's `__device__` data (natively a process's
        context goes with it). The names come from the image's ELF at load."""
        zeroed = 0
        for name in self.module_variables.pop(handle, ()):
            try:  # symbols the loader does not export by name (local ones) are skipped
                address, size = backend.module_get_global(module, name)
            except BackendError:
                continue
            if size:
                backend.memset_d8(address, 0, size, stream)
                zeroed += 1
        if zeroed:
            backend.stream_synchronize(stream)

    def release(self, backend: Backend, stream: Any) -> None:
        """Free everything the session owns (`stream`: the vGPU's, for zeroing freed memory).
        Best effort: one failure does not stop the rest."""

        def attempt(what: str, fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:
                log.warning("session %d: releasing %s failed: %s", self.id, what, exc)

        for st in self.streams.values():
            attempt("stream sync", backend.stream_synchronize, st.obj)
        if self.legacy is not None:
            attempt("stream sync", backend.stream_synchronize, self.legacy)
        for g in self.graphs.values():  # ops/graphs.py; the driver frees one still running later
            if g.graph_exec is not None:
                attempt("graph", backend.graph_exec_destroy, g.graph_exec)
        self.graphs.clear()
        for desc in list(self.dnn_descriptors.values()):  # cuDNN's, before their handles
            attempt("cuDNN descriptor", desc.destroy, backend)
        self.dnn_descriptors.clear()
        for handle in self.libraries.values():  # before the memory their workspaces may use
            attempt("library handle", handle.release, backend)
        self.libraries.clear()
        self.shadows.clear()
        self._shadow_bases.clear()
        for base in list(self.pinned):
            attempt("pinned memory", self.pop_pinned(base).close, backend)
        attempt("arrays and texture objects", release_objects, self, backend,
                self.legacy or stream)
        for ptr in list(self.allocations):
            attempt("memory", self.free_memory, backend, ptr, self.legacy or stream)
            self.remove_allocation(ptr)
        for ev in self.events.values():
            attempt("event", backend.event_destroy, ev)
        for st in self.streams.values():
            if st.join_event is not None:
                attempt("event", backend.event_destroy, st.join_event)
            attempt("stream", backend.stream_destroy, st.obj)
        if self.legacy_event is not None:
            attempt("event", backend.event_destroy, self.legacy_event)
        self.managed_vars.clear()
        if self.legacy is not None:
            attempt("stream", backend.stream_destroy, self.legacy)
            self.legacy = None
        for handle, mod in self.modules.items():
            self.forget_module_symbols(handle)
            attempt("module globals", self.zero_module_globals, backend, handle, mod, stream)
            attempt("module", backend.module_unload, mod)
        for area in (self.staging, self.fault_staging):
            if area is not None:
                attempt("staging", area.close, backend)
        if self.limits is not None:
            attempt("limits", self.limits.release, self.id)
            self.limits = None
        self.events.clear()
        self.streams.clear()
        self.modules.clear()
        self.functions.clear()
        self.staging = self.fault_staging = None
