"""Unified memory handlers (opcodes 500-599): managed allocations, the client's shadows of them,
and the managed API the daemon serves for real (advice, prefetch, range attributes, attach).

The coherence protocol itself runs in the client (shim/runtime/managed/coherence.c): it decides what to flush
and fetch. The daemon moves the bytes between pinned staging slots and the managed memory (the
session's staging area for flushes, the fault channel's for fetches), on a coherence stream of
the vGPU, and checks that every byte it moves lies inside managed memory of the requesting
session. It also keeps the per-session accounting the memory policies read:
managed bytes, host-written and fetched chunks per range, and which ranges launches reference.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_SYMBOL,
    CUDA_ERROR_INVALID_VALUE,
    MEM_LOCATION_DEVICE,
    RANGE_ATTR_DEVICE_IDS,
    RANGE_ATTR_ID_TYPE,
    BackendError,
)
from pilot.daemon.ops.memory import note_write
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import staging_slot, u64
from pilot.daemon.protocol import lib, new
from pilot.daemon.scheduling.streams import STREAM_NON_BLOCKING, stream_for_work
from pilot.daemon.sessions.session import Session
from pilot.daemon.sessions.shadow import Shadow

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("unified")
log = logging.getLogger("pilot.unified")

SMALL_MANAGED = 2 << 20  # managed allocations below this get a 2 MiB range of their own
# Managed allocations up to this size are prefetched to their GPU as they are made. pilotd's
# managed memory is only ever touched by the GPU and the copy engines, and a copy into pages no
# processor has touched yet first populates them: on the H100 a 2 MiB copy (and synchronize)
# took 121 us into a fresh managed range and 55 us into a prefetched one (bench/htod_managed.py,
# bench/RESULTS.md), which is the first shadow flush of every new allocation. Larger ones are
# left alone: a program may allocate more managed memory than the GPU holds.
PREFETCH_MANAGED = 64 << 20
# What the driver answers for a range never prefetched, by range attribute: LAST_PREFETCH_LOCATION
# (a device id; CU_DEVICE_INVALID), its _TYPE (CU_MEM_LOCATION_TYPE_INVALID) and _ID. Pages only
# pilotd prefetched answer so (cuMemRangeGetAttribute would show pilotd's own prefetch).
LAST_PREFETCH_NEVER = {4: -2, 7: 0, 8: 0}
MANAGED_FLAGS = {lib.PILOT_MANAGED_ATTACH_GLOBAL: 1, lib.PILOT_MANAGED_ATTACH_HOST: 2}
PACKED_RANGE = lib.PILOT_UM_PACK_RANGE  # a range the client packs small allocations into


def coherence_stream(vg: VGpu) -> Any:
    """The vGPU's stream for shadow traffic: waits for nothing but itself."""
    stream = vg.um_stream
    if stream is None:
        stream = vg.um_stream = vg.backend.stream_create(STREAM_NON_BLOCKING, 0)
    return stream


def _shadow(s: Session, address: int, count: int) -> Shadow:
    """The session's shadow holding all of [address, address+count)."""
    shadow = s.shadow_covering(address)
    if shadow is None or not shadow.covers(address, count):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"no shadow holds {address:#x}+{count}")
    return shadow


def _device(s: Session, location_type: int, location_id: int) -> int:
    """The backend device of a program's device location: the session sees its GPU as 0."""
    if location_type != MEM_LOCATION_DEVICE:
        return location_id
    if location_id != 0:
        raise BackendError(CUDA_ERROR_INVALID_DEVICE, f"device {location_id}")
    return s.device


def _check_managed(s: Session, ptr: int, count: int) -> None:
    s.check_range(ptr, count)
    if s.shadow_of(ptr) is None and not any(b <= ptr < b + size for b, (size, _m) in s.managed_vars.items()):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} is not managed memory")


@OPS.handler(lib.PILOT_OP_MALLOC_MANAGED, "pilot_req_malloc_managed")
def malloc_managed(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    packed = bool(req.flags & lib.PILOT_MANAGED_PACKED_RANGE)
    flags = MANAGED_FLAGS.get(req.flags & ~lib.PILOT_MANAGED_PACKED_RANGE)
    if flags is None or req.size == 0 or (packed and (req.size != PACKED_RANGE or flags != 1)):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"managed allocation {req.size} flags {req.flags}")
    # Reads as zero without a memset: the driver zeroes managed pages when it first populates
    # them (tests/apps/managed.cu `zeroed` checks it on the H100 after other frees).
    # The driver packs small managed allocations at 512-byte granularity, so two sessions' could
    # share a page (the client shadows whole pages, and the enforcer moves whole ranges): each
    # gets a 2 MiB range of its own. The client packs its small allocations into ranges it asks
    # for as `packed` ones (shim/runtime/managed/um_pack.c), charged in full: what the program
    # asked for plus the session's slack; any other allocation is charged at the size asked for.
    size = max(req.size, SMALL_MANAGED)
    ptr = vg.broker.allocate(s, "managed", size if packed else req.size,
                             lambda: vg.backend.mem_alloc_managed(size, flags), span=size)
    s.add_allocation(ptr, size if packed else req.size, managed=True)
    if packed:
        vg.broker.packed_range(s, ptr, size)
    res, host = vg.broker.residency, vg.policy
    if size <= PREFETCH_MANAGED and req.flags == lib.PILOT_MANAGED_ATTACH_GLOBAL and \
            (host is None or not host.moves_memory) and (res is None or s.id not in res.sessions):
        # asynchronous, on the stream shadow flushes use (where memory lives is the enforcer's
        # and the policies' business when they are on; memory attached to the host stays there)
        try:
            vg.backend.mem_prefetch(ptr, size, MEM_LOCATION_DEVICE, s.device, 0, coherence_stream(vg))
            s.pilot_prefetched(ptr)
        except BackendError as exc:  # a hint only: the allocation stands
            log.info("session %d: prefetch of new managed memory %#x+%d: %s", s.id, ptr, size, exc)
    return u64(ptr)


@OPS.handler(lib.PILOT_OP_SHADOW_ATTACH, "pilot_req_shadow_attach")
def shadow_attach(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """The client mapped a shadow at [base, base+length) over one managed range of the session:
    an allocation starting in its first page, or the range holding __managed__ variables."""
    end = req.base + req.length
    if req.base in s.shadows or any(sh.base < end and req.base < sh.base + sh.length
                                    for sh in s.shadows.values()):
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"a shadow already covers {req.base:#x}")
    lo = next((p for p in s.managed if req.base <= p < end), None)
    if lo is not None:
        segments, kind = [(lo, lo + s.allocations[lo])], "allocation"
    else:
        segments = [(b, b + size) for b, (size, _m) in s.managed_vars.items()
                    if b < end and req.base < b + size]
        kind = "variable"
    s.add_shadow(Shadow.attach(req.base, req.length, segments, kind, req.chunk))


@OPS.handler(lib.PILOT_OP_SHADOW_FLUSH, "pilot_req_memcpy")
def shadow_flush(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """Host-written bytes of a shadow, [dst, dst+count) in a staging slot, to the device; returns
    once the device holds them, so any later work on any stream sees them. Bytes of the shadow
    outside managed memory (between __managed__ variables) are skipped."""
    shadow = _shadow(s, req.dst, req.count)
    slot = staging_slot(s, req)
    stream = coherence_stream(vg)
    note_write(vg, s, req.dst, req.count, stream)
    moved = 0
    for dev, count in shadow.pieces(req.dst, req.count):
        at = dev - req.dst
        vg.backend.memcpy_htod(dev, slot[at:at + count], count, stream)
        moved += count
    vg.backend.stream_synchronize(stream)
    shadow.flushes += 1
    shadow.flushed_bytes += moved
    shadow.dirty_chunks += shadow.chunks_starting_in(req.dst, req.count)
    vg.metrics.bytes_copied("h2d", moved, s.tenant)


@OPS.handler(lib.PILOT_OP_SHADOW_FETCH, "pilot_req_memcpy")
def shadow_fetch(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """Device data of [src, src+count), a range of a shadow, into the fault channel's staging
    slot for a host access; bytes outside managed memory read as zero."""
    shadow = _shadow(s, req.src, req.count)
    slot = staging_slot(s, req, fault=True)
    pieces = shadow.pieces(req.src, req.count)
    if sum(count for _dev, count in pieces) != req.count:
        slot[:] = bytes(req.count)
    moved = 0
    for dev, count in pieces:
        at = dev - req.src
        vg.backend.memcpy_dtoh(slot[at:at + count], dev, count, coherence_stream(vg))
        moved += count
    shadow.fetches += 1
    shadow.fetched_bytes += moved
    vg.metrics.bytes_copied("d2h", moved, s.tenant)


@OPS.handler(lib.PILOT_OP_MANAGED_VAR, "pilot_req_symbol_get")
def managed_var(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """A __managed__ variable of one of the session's modules, and the managed range holding it
    (which the client shadows)."""
    module = s.modules.get(req.module)
    if module is None:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no module {req.module:#x}")
    name = bytes(payload).decode(errors="replace")
    if not name or "\0" in name or len(name) > 4096:
        raise BackendError(CUDA_ERROR_INVALID_SYMBOL, f"bad variable name {bytes(payload)[:64]!r}")
    address, size = vg.backend.module_get_global(module, name)
    base, range_size = vg.backend.mem_address_range(address)
    s.add_symbol(req.module, address, size)
    s.managed_vars[base] = (range_size, req.module)
    for shadow in s.shadows.values():  # a shadow the client already maps over this range
        if shadow.kind == "variable":
            s.add_shadow_segment(shadow, base, base + range_size)
    rep = new("pilot_rep_managed_var")
    rep.address, rep.size, rep.range_base, rep.range_size = address, size, base, range_size
    return rep


@OPS.handler(lib.PILOT_OP_MEM_ADVISE, "pilot_req_mem_advise")
def mem_advise(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    _check_managed(s, req.ptr, req.count)
    vg.backend.mem_advise(req.ptr, req.count, req.advice, req.location_type,
                          _device(s, req.location_type, req.location_id))


@OPS.handler(lib.PILOT_OP_MEM_PREFETCH, "pilot_req_mem_prefetch")
def mem_prefetch(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    _check_managed(s, req.ptr, req.count)
    stream = stream_for_work(vg, s, req.stream)
    if req.location_type == MEM_LOCATION_DEVICE:
        note_write(vg, s, req.ptr, req.count, stream)
    elif vg.broker.residency is not None:
        vg.broker.residency.moved_to_host(s, req.ptr, req.count)
    vg.backend.mem_prefetch(req.ptr, req.count, req.location_type,
                            _device(s, req.location_type, req.location_id), req.flags, stream)
    s.program_prefetched(req.ptr, req.count)


@OPS.handler(lib.PILOT_OP_MEM_RANGE_ATTR, "pilot_req_mem_range_attr")
def mem_range_attr(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    _check_managed(s, req.ptr, req.count)
    if not 0 < req.data_size <= 4096 or req.data_size % 4:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"attribute size {req.data_size}")
    data = vg.backend.mem_range_attribute(req.ptr, req.count, req.attribute, req.data_size)
    if req.attribute in LAST_PREFETCH_NEVER and s.prefetch_hidden(req.ptr, req.count):
        # pages only pilotd prefetched (malloc_managed): as if never prefetched
        return new("pilot_rep_status"), struct.pack("<i", LAST_PREFETCH_NEVER[req.attribute])
    translate = req.attribute in RANGE_ATTR_DEVICE_IDS
    if req.attribute in RANGE_ATTR_ID_TYPE:
        kind = vg.backend.mem_range_attribute(req.ptr, req.count, RANGE_ATTR_ID_TYPE[req.attribute], 4)
        translate = int.from_bytes(kind, "little", signed=True) == MEM_LOCATION_DEVICE
    if translate:  # the session's GPU is its device 0; other GPUs do not exist for it
        values = [v if v < 0 else 0 if v == s.device else -2 for (v,) in struct.iter_unpack("<i", data)]
        data = struct.pack(f"<{len(values)}i", *values)
    return new("pilot_rep_status"), data


@OPS.handler(lib.PILOT_OP_STREAM_ATTACH_MEM, "pilot_req_stream_attach_mem")
def stream_attach_mem(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    _check_managed(s, req.ptr, max(req.length, 1))
    vg.backend.stream_attach_mem(stream_for_work(vg, s, req.stream), req.ptr, req.length, req.flags)
