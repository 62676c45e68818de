"""CUDA arrays, texture and surface objects (chapters 6.10 "memory management", 6.27 "texture
object management", 6.28 "surface object management").

An array is the backend's; the client knows it by a handle of its session (with the device
bits, like stream handles), never by an address, and every call naming one is looked up in the
session's own table: another session's handle is an unknown handle. Arrays are charged to the
tenant through the resource broker (kind "array", at width x height x depth elements of the
format; the driver's tiled layout may take somewhat more) and freed, zeroed first, at
cudaFreeArray, cudaDeviceReset and the session's end.

Texture and surface objects are the driver's own values (kernels use them), created only over a
resource of the session (one of its arrays, or a range inside its memory) and recorded as the
session's, so only it may destroy them; they go at the session's end too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    ARRAY_CUBEMAP,
    ARRAY_FLAGS,
    ARRAY_LAYERED,
    ARRAY_SURFACE_LOAD_STORE,
    CUDA_ERROR_INVALID_PITCH_VALUE,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED,
    RESOURCE_ARRAY,
    RESOURCE_LINEAR,
    RESOURCE_PITCH2D,
    BackendError,
    ChannelDesc,
    CopySide,
    Resource,
    TextureDesc,
    ViewDesc,
)
from pilot.daemon.ops.memory import note_write
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import need_payload, u64
from pilot.daemon.protocol import lib, new
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.arrays import ArrayRecord
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.arrays")
OPS = OpTable("arrays")
CHARGE_ALIGNMENT = 512  # an array is charged in whole 512-byte units


def _desc(d: Any) -> ChannelDesc:
    desc = ChannelDesc(d.x, d.y, d.z, d.w, d.f)
    desc.check()
    return desc


def array_of(s: Session, handle: int) -> ArrayRecord:
    rec = s.arrays.get(handle)
    if rec is None:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE,
                           f"{handle:#x} is not an array of this session")
    return rec


@OPS.handler(lib.PILOT_OP_ARRAY_CREATE, "pilot_req_array_create")
def array_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    desc = _desc(req.desc)
    width, height, depth, flags = req.width, req.height, req.depth, req.flags
    if flags & ~ARRAY_FLAGS:
        raise BackendError(CUDA_ERROR_NOT_SUPPORTED, f"array flags {flags:#x} (sparse, deferred "
                           "mapping) are not carried by pilot")
    if width == 0 or (depth and not height and not flags & ARRAY_LAYERED):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"array extent {width}x{height}x{depth}")
    if flags & ARRAY_CUBEMAP and (width != height or depth % 6 or not depth):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "a cubemap is square with 6 faces per layer")
    size = width * max(height, 1) * max(depth, 1) * desc.element_size
    charged = -(-size // CHARGE_ALIGNMENT) * CHARGE_ALIGNMENT
    obj = vg.broker.allocate(s, "array", charged,
                             lambda: vg.backend.array_create(width, height, depth, desc, flags))
    handle = s.new_handle()
    s.arrays[handle] = ArrayRecord(width, height, depth, desc, obj, flags, charged)
    return u64(handle, desc.element_size)


@OPS.handler(lib.PILOT_OP_ARRAY_DESTROY, "pilot_req_handle")
def array_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """cudaFreeArray waits for the device, as cudaFree does (a copy may still use it)."""
    rec = array_of(s, req.handle)
    streams.synchronize_session(vg, s)
    del s.arrays[req.handle]
    try:
        vg.backend.array_destroy(rec.obj, s.legacy or vg.stream)
    finally:
        vg.broker.release(s, "array", rec.charged, req.handle)


# ---- copies ----

def _side(vg: VGpu, s: Session, w: Any, width: int, height: int, depth: int,
          host: Any) -> CopySide:
    """A wire side checked against the session's tables; `host` is the buffer of a host side."""
    if w.type == lib.PILOT_MEM_HOST:
        return CopySide("host", buffer=host, pitch=width, rows=height)
    if w.type == lib.PILOT_MEM_ARRAY:
        rec = array_of(s, w.array)
        if (w.x + width > rec.row_bytes or w.y + height > rec.rows or w.z + depth > rec.slices):
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"box {width}x{height}x{depth} at ({w.x}, {w.y}, {w.z}) is outside "
                               f"the array ({rec.row_bytes} bytes x {rec.rows} x {rec.slices})")
        return CopySide("array", array=rec.obj, x=w.x, y=w.y, z=w.z)
    if w.type == lib.PILOT_MEM_DEVICE:
        rows = w.rows or height
        if (height > 1 or depth > 1) and width > w.pitch:
            raise BackendError(CUDA_ERROR_INVALID_PITCH_VALUE, f"width {width} > pitch {w.pitch}")
        if rows < height and depth > 1:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{height} rows in slices of {rows}")
        first = (w.z * rows + w.y) * w.pitch + w.x
        span = ((depth - 1) * rows + height - 1) * w.pitch + width
        s.check_range(w.ptr + first, span)
        return CopySide("device", ptr=w.ptr, pitch=w.pitch, rows=rows, x=w.x, y=w.y, z=w.z)
    raise BackendError(CUDA_ERROR_INVALID_VALUE, f"copy side type {w.type}")


@OPS.handler(lib.PILOT_OP_MEMCPY_3D, "pilot_req_memcpy_3d", synchronizing=True)
def memcpy_3d(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """A box between two sides, one of them at least an array (the shim sends linear-only copies
    as 2D copies). Host rows come packed in the payload, or go back packed in the reply."""
    width, height, depth = req.width, req.height, req.depth
    if not (width and height and depth):
        return None
    if req.dst.type == lib.PILOT_MEM_HOST and req.src.type == lib.PILOT_MEM_HOST:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "host to host")
    nbytes = width * height * depth
    out = None
    if req.src.type == lib.PILOT_MEM_HOST:
        need_payload(payload, nbytes, "host rows")
    if req.dst.type == lib.PILOT_MEM_HOST:
        if nbytes > lib.PILOT_INLINE_MAX:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, "inline device-to-host rows too large")
        out = bytearray(nbytes)
    dst = _side(vg, s, req.dst, width, height, depth, out)
    src = _side(vg, s, req.src, width, height, depth, payload)
    stream = streams.stream_for_work(vg, s, req.stream)
    if dst.kind == "device":
        rows = dst.rows
        note_write(vg, s, dst.ptr + (dst.z * rows + dst.y) * dst.pitch + dst.x,
                   ((depth - 1) * rows + height - 1) * dst.pitch + width, stream)
    vg.backend.memcpy_3d(dst, src, width, height, depth, stream)
    direction = "d2h" if out is not None else "h2d" if src.kind == "host" else "d2d"
    vg.metrics.bytes_copied(direction, nbytes, s.tenant)
    return (new("pilot_rep_status"), out) if out is not None else None


# ---- texture and surface objects ----

def _resource(s: Session, r: Any) -> Resource:
    if r.flags:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"resource flags {r.flags:#x}")
    if r.type == RESOURCE_ARRAY:
        return Resource(RESOURCE_ARRAY, array=array_of(s, r.array).obj)
    if r.type == RESOURCE_LINEAR:
        desc = _desc(r.desc)
        s.check_range(r.ptr, max(r.size, 1))
        return Resource(RESOURCE_LINEAR, ptr=r.ptr, size=r.size, desc=desc)
    if r.type == RESOURCE_PITCH2D:
        desc = _desc(r.desc)
        row = r.width * desc.element_size
        if r.width == 0 or r.height == 0 or r.pitch < row:
            raise BackendError(CUDA_ERROR_INVALID_VALUE,
                               f"pitch2D texture {r.width}x{r.height}, pitch {r.pitch}")
        s.check_range(r.ptr, (r.height - 1) * r.pitch + row)
        return Resource(RESOURCE_PITCH2D, ptr=r.ptr, width=r.width, height=r.height,
                        pitch=r.pitch, desc=desc)
    if r.type == 1:
        raise BackendError(CUDA_ERROR_NOT_SUPPORTED, "mipmapped arrays are not carried by pilot")
    raise BackendError(CUDA_ERROR_INVALID_VALUE, f"resource type {r.type}")


def _texture_desc(t: Any) -> TextureDesc:
    return TextureDesc(tuple(t.address_mode), t.filter_mode, t.read_mode, t.srgb,
                       tuple(t.border_color), t.normalized_coords, t.max_anisotropy,
                       t.mipmap_filter_mode, t.mipmap_level_bias, t.min_mipmap_level_clamp,
                       t.max_mipmap_level_clamp, t.disable_trilinear_optimization,
                       t.seamless_cubemap)


@OPS.handler(lib.PILOT_OP_TEXTURE_CREATE, "pilot_req_texture_create")
def texture_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    resource = _resource(s, req.res)
    v = req.view
    view = (ViewDesc(v.format, v.width, v.height, v.depth, v.first_mipmap_level,
                     v.last_mipmap_level, v.first_layer, v.last_layer) if req.has_view else None)
    handle = vg.backend.texture_create(resource, _texture_desc(req.tex), view)
    s.textures[handle] = resource
    return u64(handle)


def _destroy(vg: VGpu, objects: dict[int, Any], handle: int, what: str) -> None:
    """Destroy one of the session's texture or surface objects (`objects`: its table)."""
    if handle not in objects:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"{handle:#x} is not a {what} object of this session")
    (vg.backend.texture_destroy if what == "texture" else vg.backend.surface_destroy)(handle)
    del objects[handle]


@OPS.handler(lib.PILOT_OP_TEXTURE_DESTROY, "pilot_req_handle")
def texture_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    _destroy(vg, s.textures, req.handle, "texture")


@OPS.handler(lib.PILOT_OP_SURFACE_CREATE, "pilot_req_texture_create")
def surface_create(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    if req.res.type != RESOURCE_ARRAY:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "a surface is made over an array")
    resource = _resource(s, req.res)
    if not array_of(s, req.res.array).flags & ARRAY_SURFACE_LOAD_STORE:
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           "the array was not made with cudaArraySurfaceLoadStore")
    handle = vg.backend.surface_create(resource.array)
    s.surfaces[handle] = resource
    return u64(handle)


@OPS.handler(lib.PILOT_OP_SURFACE_DESTROY, "pilot_req_handle")
def surface_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    _destroy(vg, s.surfaces, req.handle, "surface")
