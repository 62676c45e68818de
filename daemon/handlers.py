"""One handler per opcode. Each takes (vgpu, session, request struct, payload) and returns None
(a plain status reply), a reply struct, or (reply struct, payload bytes). Errors are raised as
BackendError; the vGPU loop turns them into replies or deferred errors.

`synchronizing` handlers deliver the errors of earlier asynchronous calls, as CUDA's
synchronizing calls do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import streams
from .backend import (
    CUDA_ERROR_INVALID_DEVICE_FUNCTION,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_READY,
    BackendError,
)
from .protocol import ffi, lib, new
from .session import Session, StreamState
from .staging import Staging

if TYPE_CHECKING:
    from .vgpu import VGpu

Handler = Callable[["VGpu", Session, Any, memoryview], Any]


@dataclass(frozen=True)
class HandlerSpec:
    fn: Handler
    request: str | None  # struct name of the request body, None for an empty body
    synchronizing: bool


HANDLERS: dict[int, HandlerSpec] = {}
STREAM_NON_BLOCKING = 1


def handler(op: int, request: str | None = None, synchronizing: bool = False) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        if op in HANDLERS:
            raise RuntimeError(f"two handlers for opcode {op}")
        HANDLERS[op] = HandlerSpec(fn, request, synchronizing)
        return fn

    return register


def _u64(value: int, value2: int = 0) -> Any:
    rep = new("pilot_rep_u64")
    rep.value, rep.value2 = value, value2
    return rep


def _need(payload: memoryview, size: int, what: str) -> None:
    if len(payload) != size:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"{what}: payload of {len(payload)} bytes, expected {size}")


# ---- session and device ----

@handler(lib.PILOT_OP_DEVICE_INFO, "pilot_req_device")
def device_info(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    info = vg.device_info()
    rep = new("pilot_rep_device_info")
    rep.device_count = 1
    rep.driver_version = info.driver_version
    rep.total_mem = vg.memory_limits(s)[1]
    name = info.name.encode()[: lib.PILOT_NAME_MAX - 1]
    ffi.memmove(rep.name, name, len(name))
    ffi.memmove(rep.uuid, info.uuid[:16], min(16, len(info.uuid)))
    for attr, value in info.attrs.items():
        if 0 <= attr < lib.PILOT_ATTR_COUNT:
            rep.attrs[attr] = value
    return rep


@handler(lib.PILOT_OP_DEVICE_SYNCHRONIZE, synchronizing=True)
def device_synchronize(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    streams.synchronize_session(vg, s)


@handler(lib.PILOT_OP_DEVICE_RESET, synchronizing=True)
def device_reset(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """Frees the session's memory, streams and events; loaded modules stay (kernels relaunch)."""
    streams.synchronize_session(vg, s)
    backend = vg.backend
    for ptr in list(s.allocations):
        backend.mem_free(ptr)
        vg.unadmit(s, s.remove_allocation(ptr))
    for ev in s.events.values():
        backend.event_destroy(ev)
    for st in s.streams.values():
        if st.join_event is not None:
            backend.event_destroy(st.join_event)
        backend.stream_destroy(st.obj)
    s.events.clear()
    s.streams.clear()
    s.dirty_blocking.clear()
    s.deferred = 0


@handler(lib.PILOT_OP_STAGING_OPEN, "pilot_req_staging_open")
def staging_open(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    if s.staging is None:
        s.staging = Staging(vg.backend, s.id, s.creds.uid, s.creds.gid)
    rep = new("pilot_rep_staging")
    rep.slot_bytes = s.staging.slot_bytes
    rep.slots = s.staging.slots
    path = s.staging.path.encode()
    ffi.memmove(rep.path, path, len(path))
    return rep


# ---- streams ----

@handler(lib.PILOT_OP_STREAM_CREATE, "pilot_req_stream_create")
def stream_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    # Every daemon stream is non-blocking towards CUDA's real null stream, which no tenant uses;
    # the program's blocking semantics are kept by streams.py.
    obj = vg.backend.stream_create(STREAM_NON_BLOCKING, req.priority)
    handle = s.new_handle()
    s.streams[handle] = StreamState(obj, blocking=not (req.flags & STREAM_NON_BLOCKING))
    return _u64(handle)


@handler(lib.PILOT_OP_STREAM_DESTROY, "pilot_req_handle")
def stream_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    st = s.stream(req.handle)
    del s.streams[req.handle]
    s.dirty_blocking.pop(req.handle, None)
    if st.join_event is not None:
        vg.backend.event_destroy(st.join_event)
    vg.backend.stream_destroy(st.obj)


@handler(lib.PILOT_OP_STREAM_SYNCHRONIZE, "pilot_req_handle", synchronizing=True)
def stream_synchronize(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    if req.handle == 0:
        streams.join_blocking_into_legacy(vg, s)
        vg.backend.stream_synchronize(vg.stream)
    else:
        st = s.stream(req.handle)
        vg.backend.stream_synchronize(st.obj)


@handler(lib.PILOT_OP_STREAM_QUERY, "pilot_req_handle")
def stream_query(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    obj = vg.stream if req.handle == 0 else s.stream(req.handle).obj
    if not vg.backend.stream_query(obj):
        raise BackendError(CUDA_ERROR_NOT_READY)


@handler(lib.PILOT_OP_STREAM_WAIT_EVENT, "pilot_req_stream_wait_event")
def stream_wait_event(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    ev = s.event(req.event)
    vg.backend.stream_wait_event(streams.stream_for_work(vg, s, req.stream), ev)


# ---- events ----

@handler(lib.PILOT_OP_EVENT_CREATE, "pilot_req_event_create")
def event_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    handle = s.new_handle()
    s.events[handle] = vg.backend.event_create(req.flags)
    return _u64(handle)


@handler(lib.PILOT_OP_EVENT_RECORD, "pilot_req_event_record")
def event_record(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    ev = s.event(req.event)
    vg.backend.event_record(ev, streams.stream_for_work(vg, s, req.stream))


@handler(lib.PILOT_OP_EVENT_SYNCHRONIZE, "pilot_req_handle", synchronizing=True)
def event_synchronize(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    vg.backend.event_synchronize(s.event(req.handle))


@handler(lib.PILOT_OP_EVENT_QUERY, "pilot_req_handle")
def event_query(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    if not vg.backend.event_query(s.event(req.handle)):
        raise BackendError(CUDA_ERROR_NOT_READY)


@handler(lib.PILOT_OP_EVENT_ELAPSED, "pilot_req_event_elapsed")
def event_elapsed(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    rep = new("pilot_rep_elapsed")
    rep.ms = vg.backend.event_elapsed_ms(s.event(req.start), s.event(req.end))
    return rep


@handler(lib.PILOT_OP_EVENT_DESTROY, "pilot_req_handle")
def event_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    ev = s.event(req.handle)
    del s.events[req.handle]
    vg.backend.event_destroy(ev)


# ---- execution control ----

@handler(lib.PILOT_OP_MODULE_LOAD, "pilot_req_module_load")
def module_load(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    _need(payload, req.image_size, "module image")
    handle = s.new_handle()
    s.modules[handle] = vg.backend.module_load(bytes(payload))
    return _u64(handle)


@handler(lib.PILOT_OP_FUNCTION_GET, "pilot_req_function_get")
def function_get(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    module = s.modules.get(req.module)
    if module is None:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no module {req.module:#x}")
    name = bytes(payload).decode(errors="strict")
    info = vg.backend.function_get(module, name)
    if len(info.params) > lib.PILOT_MAX_PARAMS:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{name}: {len(info.params)} parameters")
    handle = s.new_handle()
    s.functions[handle] = info
    rep = new("pilot_rep_function")
    rep.function = handle
    rep.nparams = len(info.params)
    rep.arg_bytes = info.arg_bytes
    rep.max_threads_per_block = info.max_threads_per_block
    rep.static_shared_bytes = info.static_shared_bytes
    rep.max_dynamic_shared_bytes = info.max_dynamic_shared_bytes
    params = ffi.new("pilot_param_info[]", max(1, len(info.params)))
    for i, (offset, size) in enumerate(info.params):
        params[i].offset, params[i].size = offset, size
    return rep, ffi.buffer(params, ffi.sizeof("pilot_param_info") * len(info.params))[:]


@handler(lib.PILOT_OP_LAUNCH, "pilot_req_launch")
def launch(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    info = s.functions.get(req.function)
    if info is None:
        raise BackendError(CUDA_ERROR_INVALID_DEVICE_FUNCTION, f"no function {req.function:#x}")
    if len(payload) != info.arg_bytes:
        _need(payload, info.arg_bytes, "kernel arguments")
    if req.stream == 0 and not s.dirty_blocking:  # the common case, inlined from stream_for_work
        s.legacy_gen += 1
        stream = vg.stream
    else:
        stream = streams.stream_for_work(vg, s, req.stream)
    g, b = req.grid, req.block
    vg.backend.launch(info.handle, (g[0], g[1], g[2]), (b[0], b[1], b[2]), req.shared_bytes, stream,
                      payload[:])
    vg.shard.kernels += 1


# ---- memory ----

@handler(lib.PILOT_OP_MALLOC, "pilot_req_malloc")
def malloc(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    size = req.size
    vg.admit(s, size)  # tenant quota and GPU capacity
    try:
        ptr = vg.backend.mem_alloc(size)
    except BaseException:
        vg.unadmit(s, size)
        raise
    s.add_allocation(ptr, size)
    return _u64(ptr)


@handler(lib.PILOT_OP_FREE, "pilot_req_free")
def free(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    if req.ptr not in s.allocations:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{req.ptr:#x} is not an allocation of this session")
    vg.backend.mem_free(req.ptr)
    vg.unadmit(s, s.remove_allocation(req.ptr))


@handler(lib.PILOT_OP_MEM_GET_INFO)
def mem_get_info(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    return _u64(*vg.memory_limits(s))


def _copy_stream(vg: VGpu, s: Session, req: Any) -> Any:
    return streams.stream_for_work(vg, s, req.stream)


@handler(lib.PILOT_OP_MEMCPY_H2D, "pilot_req_memcpy", synchronizing=True)
def memcpy_h2d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    _need(payload, req.count, "host-to-device data")
    s.check_range(req.dst, req.count)
    vg.backend.memcpy_htod(req.dst, payload, req.count, _copy_stream(vg, s, req))
    vg.metrics.bytes_copied("h2d", req.count)


@handler(lib.PILOT_OP_MEMCPY_D2H, "pilot_req_memcpy", synchronizing=True)
def memcpy_d2h(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    if req.count > lib.PILOT_INLINE_MAX:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "inline device-to-host copy too large")
    s.check_range(req.src, req.count)
    out = bytearray(req.count)
    vg.backend.memcpy_dtoh(out, req.src, req.count, _copy_stream(vg, s, req))
    vg.metrics.bytes_copied("d2h", req.count)
    return new("pilot_rep_status"), out


@handler(lib.PILOT_OP_MEMCPY_D2D, "pilot_req_memcpy", synchronizing=True)
def memcpy_d2d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.check_range(req.dst, req.count)
    s.check_range(req.src, req.count)
    vg.backend.memcpy_dtod(req.dst, req.src, req.count, _copy_stream(vg, s, req))
    vg.metrics.bytes_copied("d2d", req.count)


def _slot(s: Session, req: Any) -> memoryview:
    if s.staging is None:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "no staging area open")
    try:
        return s.staging.slot(req.slot, req.count)
    except ValueError as exc:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, str(exc)) from None


@handler(lib.PILOT_OP_MEMCPY_H2D_STAGED, "pilot_req_memcpy", synchronizing=True)
def memcpy_h2d_staged(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.check_range(req.dst, req.count)
    # The backend returns once the slot may be refilled (it waits for the DMA from pinned memory).
    vg.backend.memcpy_htod(req.dst, _slot(s, req), req.count, _copy_stream(vg, s, req))
    vg.metrics.bytes_copied("h2d", req.count)


@handler(lib.PILOT_OP_MEMCPY_D2H_STAGED, "pilot_req_memcpy", synchronizing=True)
def memcpy_d2h_staged(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.check_range(req.src, req.count)
    vg.backend.memcpy_dtoh(_slot(s, req), req.src, req.count, _copy_stream(vg, s, req))
    vg.metrics.bytes_copied("d2h", req.count)


@handler(lib.PILOT_OP_MEMSET, "pilot_req_memset")
def memset(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    s.check_range(req.ptr, req.count)
    vg.backend.memset_d8(req.ptr, req.value & 0xFF, req.count, _copy_stream(vg, s, req))
