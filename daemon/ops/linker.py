"""The driver's linker for cuLink* (shim/driver/drv_link.c): the client gathers its inputs and
sends them at cuLinkComplete; pilotd's driver links them on the vGPU thread (backends/linker.py)
and keeps the cubin and the log in the session until the next link, for LINK_FETCH to read in
pieces. Linking reads no device memory and loads nothing: the program loads the cubin with
cuModuleLoadData afterwards, checked and charged as any image."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError
from pilot.daemon.backends.linker import LinkInput
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.protocol import lib, new
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("linker")
_INPUT = struct.Struct("<IIQ")  # pilot_link_input: type, name_len, size
INPUT_TYPES = 5  # CUjitInputType: cubin, PTX, fatbinary, object, library


def _padded(n: int) -> int:
    return (n + 7) & ~7


def parse_inputs(payload: memoryview, count: int) -> list[LinkInput]:
    """frame 2 of PILOT_OP_LINK: `count` records, each a pilot_link_input, its name and its data,
    each padded to 8 bytes; nothing may be left over."""
    inputs, at = [], 0
    for _ in range(count):
        if at + _INPUT.size > len(payload):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, "PILOT_OP_LINK: inputs cut short")
        kind, name_len, size = _INPUT.unpack_from(payload, at)
        at += _INPUT.size
        end = at + _padded(name_len) + _padded(size)
        if kind >= INPUT_TYPES or not size or end > len(payload):
            raise BackendError(CUDA_ERROR_INVALID_VALUE, "PILOT_OP_LINK: a malformed input")
        name = bytes(payload[at:at + name_len]).decode(errors="replace")
        at += _padded(name_len)
        inputs.append(LinkInput(kind, name, bytes(payload[at:at + size])))
        at += _padded(size)
    if at != len(payload):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, "PILOT_OP_LINK: bytes after the inputs")
    return inputs


@OPS.handler(lib.PILOT_OP_LINK, "pilot_req_link")
def link(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    if req.noptions > lib.PILOT_LINK_OPTIONS:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"PILOT_OP_LINK: {req.noptions} options")
    inputs = parse_inputs(payload, req.count)
    options = [(int(req.options[i].option), int(req.options[i].value)) for i in range(req.noptions)]
    s.link_output = b""  # the last link's output goes, whatever this one gives
    rep = new("pilot_rep_link")
    try:
        image, text = vg.backend.link(inputs, options)
        rep.result = 0
    except BackendError as exc:  # the link failed: its code and error log go to the program
        image, text = b"", getattr(exc, "log", str(exc))
        rep.result = exc.code
    log = text.encode()
    s.link_output = image + log
    rep.image_bytes, rep.log_bytes = len(image), len(log)
    return rep


@OPS.handler(lib.PILOT_OP_LINK_FETCH, "pilot_req_link_fetch")
def link_fetch(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    out = s.link_output
    if req.count > lib.PILOT_INLINE_MAX or req.offset + req.count > len(out):
        raise BackendError(CUDA_ERROR_INVALID_VALUE,
                           f"PILOT_OP_LINK_FETCH: [{req.offset}, +{req.count}) of {len(out)} bytes")
    return new("pilot_rep_status"), out[req.offset:req.offset + req.count]
