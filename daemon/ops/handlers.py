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

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_DEVICE_FUNCTION,
    CUDA_ERROR_INVALID_MEMCPY_DIRECTION,
    CUDA_ERROR_INVALID_PITCH_VALUE,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_SYMBOL,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_UNSUPPORTED_LIMIT,
    BackendError,
)
from pilot.daemon.protocol import ffi, lib, new
from pilot.daemon.resources import limits
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.session import Session, StreamState
from pilot.daemon.sessions.staging import Staging

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

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
    rep = new("pilot_rep_device_info")
    info = devices.fill_device_info(vg, s, req.device, rep)  # count, capacity, peers
    rep.driver_version = info.driver_version
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
        s.drop_shadow(ptr)
        s.free_memory(backend, ptr, s.legacy or vg.stream)
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
    """The session's staging area, or (fault = 1) the unified-memory fault channel's: one slot,
    so a fetch never waits for a slot a copy on the main connection holds."""
    if req.fault:
        if s.fault_staging is None:
            s.fault_staging = Staging(vg.backend, s.id, s.creds.uid, s.creds.gid, slots=1)
        area = s.fault_staging
    else:
        if s.staging is None:
            s.staging = Staging(vg.backend, s.id, s.creds.uid, s.creds.gid)
        area = s.staging
    rep = new("pilot_rep_staging")
    rep.slot_bytes = area.slot_bytes
    rep.slots = area.slots
    path = area.path.encode()
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
        vg.backend.stream_synchronize(s.legacy or vg.stream)
    else:
        st = s.stream(req.handle)
        vg.backend.stream_synchronize(st.obj)


@handler(lib.PILOT_OP_STREAM_QUERY, "pilot_req_handle")
def stream_query(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    obj = (s.legacy or vg.stream) if req.handle == 0 else s.stream(req.handle).obj
    if not vg.backend.stream_query(obj):
        raise BackendError(CUDA_ERROR_NOT_READY)


@handler(lib.PILOT_OP_STREAM_WAIT_EVENT, "pilot_req_stream_wait_event")
def stream_wait_event(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    ev = devices.any_event(s, req.event)  # may be another device's
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
        stream = s.legacy or vg.stream
    else:
        stream = streams.stream_for_work(vg, s, req.stream)
    g, b = req.grid, req.block
    vg.backend.launch(info.handle, (g[0], g[1], g[2]), (b[0], b[1], b[2]), req.shared_bytes, stream,
                      payload[:])
    vg.shard.kernels += 1
    if s.shadows:
        s.note_managed_launch(payload)


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
    s.drop_shadow(req.ptr)
    streams.synchronize_session(vg, s)  # cudaFree waits for the device; the zeroing must too
    s.free_memory(vg.backend, req.ptr, s.legacy or vg.stream)
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


def _slot(s: Session, req: Any, fault: bool = False) -> memoryview:
    """Slot req.slot of the session's staging area (fault: the fault channel's), req.count bytes."""
    area = s.fault_staging if fault else s.staging
    if area is None:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"no {'fault ' if fault else ''}staging area open")
    try:
        return area.slot(req.slot, req.count)
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


# ---- symbols (__device__ and __constant__ variables) ----

@handler(lib.PILOT_OP_SYMBOL_GET, "pilot_req_symbol_get")
def symbol_get(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """Address and size of a variable of one of the session's modules, which become memory the
    session may copy to and from (the shim then copies at address + offset)."""
    module = s.modules.get(req.module)
    if module is None:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no module {req.module:#x}")
    try:
        name = bytes(payload).decode()
    except UnicodeDecodeError:
        name = ""
    if not name or "\0" in name or len(name) > 4096:
        raise BackendError(CUDA_ERROR_INVALID_SYMBOL, f"bad variable name {bytes(payload)[:64]!r}")
    address, size = vg.backend.module_get_global(module, name)
    s.add_symbol(req.module, address, size)
    return _u64(address, size)


# ---- limits, stream queries, function attributes, occupancy, 2D memory (shim/api_misc.c) ----

LIMIT_MAX = 6  # cudaLimitPersistingL2CacheSize, the last cudaLimit of CUDA 13.0
TEXTURE_ALIGNMENT_ATTR = 14  # cudaDevAttrTextureAlignment: cudaMallocPitch's pitch unit (512)


@handler(lib.PILOT_OP_DEVICE_SET_LIMIT, "pilot_req_limit")
def device_set_limit(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """The context is every tenant's: limits.py applies the largest request of any live session
    and the reply reports the effective value."""
    if req.limit > LIMIT_MAX:
        raise BackendError(CUDA_ERROR_UNSUPPORTED_LIMIT, f"no limit {req.limit}")
    table = limits.for_context(vg.backend, vg.device)
    value = table.request(s.id, req.limit, req.value)
    s.limits = table  # Session.release drops the session's requests
    return _u64(value)


@handler(lib.PILOT_OP_DEVICE_GET_LIMIT, "pilot_req_limit")
def device_get_limit(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    if req.limit > LIMIT_MAX:
        raise BackendError(CUDA_ERROR_UNSUPPORTED_LIMIT, f"no limit {req.limit}")
    return _u64(vg.backend.ctx_get_limit(req.limit))


@handler(lib.PILOT_OP_DEVICE_PRIORITY_RANGE)
def device_priority_range(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    rep = new("pilot_rep_priority_range")
    rep.least, rep.greatest = vg.backend.stream_priority_range()
    return rep


@handler(lib.PILOT_OP_STREAM_GET_INFO, "pilot_req_handle")
def stream_get_info(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """Flags as the program created the stream (every daemon stream is non-blocking towards
    CUDA's null stream; `blocking` is what the program asked for); priority as clamped."""
    st = s.stream(req.handle)
    rep = new("pilot_rep_stream_info")
    rep.flags = 0 if st.blocking else STREAM_NON_BLOCKING
    rep.priority = vg.backend.stream_priority(st.obj)
    return rep


def _function(s: Session, handle: int) -> Any:
    info = s.functions.get(handle)
    if info is None:
        raise BackendError(CUDA_ERROR_INVALID_DEVICE_FUNCTION, f"no function {handle:#x}")
    return info


def _func_attrs(vg: VGpu, info: Any) -> Any:
    values = vg.backend.function_attributes(info.handle)
    rep = new("pilot_rep_func_attrs")
    for i, value in enumerate(values[: lib.PILOT_FUNC_ATTR_COUNT]):
        rep.values[i] = value
    info.max_dynamic_shared_bytes = values[8]  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    return rep


@handler(lib.PILOT_OP_FUNC_GET_ATTRIBUTES, "pilot_req_handle")
def func_get_attributes(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    return _func_attrs(vg, _function(s, req.handle))


@handler(lib.PILOT_OP_FUNC_SET_ATTRIBUTE, "pilot_req_func_attr")
def func_set_attribute(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """On the session's own CUfunction (each session loads its own modules), so no other
    tenant's kernels change."""
    info = _function(s, req.function)
    vg.backend.function_set_attribute(info.handle, req.attr, req.value)
    return _func_attrs(vg, info)


@handler(lib.PILOT_OP_OCCUPANCY, "pilot_req_occupancy")
def occupancy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    info = _function(s, req.function)
    return _u64(vg.backend.occupancy(info.handle, req.block_size, req.dynamic_smem, req.flags))


@handler(lib.PILOT_OP_MALLOC_PITCH, "pilot_req_malloc_pitch")
def malloc_pitch(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """Admitted like cudaMalloc. The backend chooses the pitch (cuMemAllocPitch), so the quota
    first reserves the expected size (width rounded up to the texture alignment) and then
    corrects by the difference, if any."""
    width, height = req.width, req.height
    if width == 0 or height == 0:
        return _u64(0, 0)
    align = vg.device_info().attrs.get(TEXTURE_ALIGNMENT_ATTR) or 512
    expected = -(-width // align) * align * height
    vg.admit(s, expected)
    try:
        ptr, pitch = vg.backend.mem_alloc_pitch(width, height)
    except BaseException:
        vg.unadmit(s, expected)
        raise
    size = pitch * height
    if size > expected:
        try:
            vg.admit(s, size - expected)
        except BaseException:
            vg.backend.mem_free(ptr)
            vg.unadmit(s, expected)
            raise
    elif size < expected:
        vg.unadmit(s, expected - size)
    s.add_allocation(ptr, size)
    return _u64(ptr, pitch)


def _rows_span(pitch: int, width: int, height: int) -> int:
    """Bytes from the first row's start to the last row's end; every row is inside the range
    [ptr, ptr + span) that Session.check_range then checks."""
    if height > 1 and width > pitch:
        raise BackendError(CUDA_ERROR_INVALID_PITCH_VALUE, f"width {width} > pitch {pitch}")
    return (height - 1) * pitch + width


@handler(lib.PILOT_OP_MEMCPY_2D, "pilot_req_memcpy_2d", synchronizing=True)
def memcpy_2d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """H2D: the rows come packed in the payload; D2H: they go back packed (at most
    PILOT_INLINE_MAX bytes; the shim cuts larger copies); D2D: device to device."""
    width, height, kind = req.width, req.height, req.kind
    if width == 0 or height == 0:
        return None
    dpitch = req.dpitch if height > 1 else max(req.dpitch, width)
    spitch = req.spitch if height > 1 else max(req.spitch, width)
    backend, stream = vg.backend, None
    if kind == lib.PILOT_COPY_H2D:
        _need(payload, width * height, "host-to-device rows")
        s.check_range(req.dst, _rows_span(dpitch, width, height))
        stream = _copy_stream(vg, s, req)
        backend.memcpy_2d_htod(req.dst, dpitch, payload, width, width, height, stream)
        vg.metrics.bytes_copied("h2d", width * height)
        return None
    if kind == lib.PILOT_COPY_D2H:
        if width * height > lib.PILOT_INLINE_MAX:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, "inline device-to-host rows too large")
        s.check_range(req.src, _rows_span(spitch, width, height))
        out = bytearray(width * height)
        backend.memcpy_2d_dtoh(out, width, req.src, spitch, width, height, _copy_stream(vg, s, req))
        vg.metrics.bytes_copied("d2h", width * height)
        return new("pilot_rep_status"), out
    if kind == lib.PILOT_COPY_D2D:
        s.check_range(req.dst, _rows_span(dpitch, width, height))
        s.check_range(req.src, _rows_span(spitch, width, height))
        backend.memcpy_2d_dtod(req.dst, dpitch, req.src, spitch, width, height,
                               _copy_stream(vg, s, req))
        vg.metrics.bytes_copied("d2d", width * height)
        return None
    raise BackendError(CUDA_ERROR_INVALID_MEMCPY_DIRECTION, f"2D copy kind {kind}")


@handler(lib.PILOT_OP_MEMSET_2D, "pilot_req_memset_2d")
def memset_2d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    width, height = req.width, req.height
    if width == 0 or height == 0:
        return
    pitch = req.pitch if height > 1 else max(req.pitch, width)
    s.check_range(req.ptr, _rows_span(pitch, width, height))
    vg.backend.memset_2d_d8(req.ptr, pitch, req.value & 0xFF, width, height,
                            _copy_stream(vg, s, req))


# Handlers of other modules register into HANDLERS as they are imported.
from pilot.daemon.ops import execution  # noqa: E402, F401
from pilot.daemon.scheduling import callbacks  # noqa: E402, F401
from pilot.daemon.sessions import devices  # noqa: E402
