"""The vGPU's fast path (daemon/native/fast_launch.c): posted launches, small cudaMemcpy H2D/D2H of the
program's device memory, and cudaDeviceSynchronize / cudaStreamSynchronize, that need nothing of
Python run in C as the endpoint receives them, on the vGPU thread, without the GIL (copies and
synchronizations are answered from C too).

Python decides everything: which sessions qualify (`update`), which of their kernels and streams
C may launch on (registered when Python itself launches them the first time, `launched`), which
device memory C may copy (the session's device allocations, told as they are made and freed:
Session.fast_ranges), and after each wait it folds the counts of what C did into the session,
the metrics and the fault bookkeeping (`fold`).

A session qualifies while no per-launch work of the daemon applies to it: no policy that sees
launches (a policy that decides launches of the sessions it watches only, Policy.watches_launches
such as salus's, keeps the fast path for the others: asked in `update`), no hold of the policy,
no capacity enforcement of its memory, no kernel timing, no waiting launch, no sticky error, no
priority gate (a tenant of a higher class active on its GPU: scheduling/priority.py).
For a session with unified memory C also counts each launch per shadow it reaches (as
Session.note_managed_launch does) and does the shadow flushes (SHADOW_FLUSH) whose shadow,
staging area and coherence stream it knows (`ShadowsInC`, `update`). Work on the program's
legacy stream goes to C only while none of its blocking streams has work the legacy stream must
wait for; blocking streams themselves always go through Python (their implicit ordering with the
legacy stream is Python's, scheduling/streams.py). Copies go to Python while an asynchronous
error waits to be reported (the next synchronizing call reports it), and for any memory but the
session's own device allocations (module variables, other devices' memory). A synchronization
goes to C only on the same conditions and while no blocking stream has work the legacy stream
must wait for; C is told every stream of the session (`update`), and one that fails (a kernel
fault) goes to Python, which synchronizes again and reports the error.

With the CUDA backend C calls the driver's cuLaunchKernel and copies itself; with the sim
backend it calls back into the sim (cffi callbacks), so CI exercises the same C path.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import BackendError
from pilot.daemon.backends.dnn import (
    ATTR_VARIANT_PACK_DATA_POINTERS,
    ATTR_VARIANT_PACK_UNIQUE_IDS,
    ATTR_VARIANT_PACK_WORKSPACE,
    BN_FUNCTIONS,
    TYPE_INT64,
    TYPE_VOID_PTR,
    VARIANT_PACK,
)
from pilot.daemon.backends.libraries import (
    GEMM_FUNCTIONS,
    LIB_CUBLAS,
    LIB_CUBLASLT,
    LIB_CUDNN,
    LT_A,
    LT_B,
    LT_C,
    LT_D,
    TYPE_SIZES,
    BlasSettings,
)
from pilot.daemon.ops.dnn import batchnorm_call
from pilot.daemon.ops.libraries import LtRanges, gemm_call, library_handle, lt_call
from pilot.daemon.ops.unified import coherence_stream
from pilot.daemon.protocol import ffi, lib
from pilot.daemon.scheduling.launch import launches_seen_one_by_one
from pilot.daemon.telemetry.metrics import LATENCY_BUCKETS
from pilot.daemon.vgpu.sim_words import SimWords
from pilot.policies import Watch

if TYPE_CHECKING:
    from pilot.daemon.scheduling.launch import Launch
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.vgpu")

CUDA_ERROR_UNKNOWN = 999
COUNTS = 64  # connections folded per take


class FastLaunches:
    def __init__(self, vg: VGpu, native: tuple[int, int, int, int] | None) -> None:
        """native: the addresses of the driver's cuLaunchKernel, cuMemcpyDtoHAsync_v2,
        cuMemcpyHtoDAsync_v2 and cuStreamSynchronize, or None to call back into the backend
        (sim)."""
        self.vg = vg
        self._objects: dict[int, Any] = {}  # generic mode: raw value -> backend object
        self._states: dict[int, tuple[int, ...]] = {}  # session id -> what C was told
        self._syncs: dict[int, tuple[Any, ...]] = {}  # session id -> its streams as C was told
        self._staging: dict[int, tuple[int, int, int]] = {}  # session id -> its area as C was told
        self._coherence: int | None = None  # the coherence stream, once C was told it
        self._counts = ffi.new("pilot_fast_count[]", COUNTS)
        self._bounds = ffi.new("double[]", list(LATENCY_BUCKETS))
        self._callbacks: tuple[Any, ...] = ()
        version = lib.PILOT_PROTO_VERSION
        if native:
            self._raw = _native_value
            launch, dtoh, htod, sync = (ffi.cast("void *", a) for a in native)
            self.ptr = lib.pilot_fast_new(launch, dtoh, htod, sync, ffi.NULL, ffi.NULL, ffi.NULL,
                                          self._bounds, len(LATENCY_BUCKETS), version)
            waits = getattr(vg.backend, "native_wait_functions", lambda: None)()
            if self.ptr != ffi.NULL and waits:
                lib.pilot_fast_waits(self.ptr, *(ffi.cast("void *", a) for a in waits))
                words = getattr(vg.backend, "native_word_functions", lambda: None)()
                if words:
                    lib.pilot_fast_words(self.ptr, *(ffi.cast("void *", a) for a in words))
        else:
            self._raw = self._registered
            self._callbacks = (
                ffi.callback("pilot_fast_launch_fn", self._generic_launch, onerror=_callback_failed),
                ffi.callback("pilot_fast_copy_fn", self._generic_copy, onerror=_callback_failed),
                ffi.callback("pilot_fast_sync_fn", self._generic_sync, onerror=_callback_failed))
            self.ptr = lib.pilot_fast_new(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, *self._callbacks,
                                          self._bounds, len(LATENCY_BUCKETS), version)
            self._words = SimWords(vg.backend, self._objects)
            self._callbacks += (ffi.callback("pilot_fast_word_fn", self._words.call,
                                             onerror=_callback_failed),)
            if self.ptr != ffi.NULL:
                lib.pilot_fast_words_generic(self.ptr, self._callbacks[-1])
        if self.ptr == ffi.NULL:
            raise MemoryError("pilot_fast_new")
        sizes = bytearray(128)
        for dtype, size in TYPE_SIZES.items():
            if 0 <= dtype < len(sizes):
                sizes[dtype] = size
        self._type_sizes = ffi.new("uint8_t[]", bytes(sizes))
        lib.pilot_fast_dnn_constants(self.ptr, VARIANT_PACK, ATTR_VARIANT_PACK_UNIQUE_IDS,
                                     ATTR_VARIANT_PACK_DATA_POINTERS, ATTR_VARIANT_PACK_WORKSPACE,
                                     TYPE_INT64, TYPE_VOID_PTR)
        self._libfns: dict[int, int] | None = None
        if native:
            self._library_functions()
        else:
            self._callbacks += (ffi.callback("pilot_fast_call_fn", self._generic_call,
                                             onerror=_callback_failed),)
            lib.pilot_fast_libraries(self.ptr, ffi.NULL, 0, self._type_sizes, len(sizes),
                                     self._callbacks[-1])

    @classmethod
    def create(cls, vg: VGpu) -> FastLaunches | None:
        """For a vGPU whose every launch needs Python (a policy that sees launches, kernel
        timing) or a backend that offers neither path: None."""
        if launches_seen_one_by_one(vg, per_session=True):
            return None
        backend = vg.backend
        native = backend.native_fast_functions() if hasattr(backend, "native_fast_functions") else None
        if native is None and getattr(backend, "name", "") != "sim":
            return None
        return cls(vg, native)

    def close(self) -> None:
        if self.ptr != ffi.NULL:
            lib.pilot_fast_free(self.ptr)
            self.ptr = ffi.NULL

    # ---- handles ----
    def _registered(self, obj: Any) -> int:
        """Generic mode: a value standing for a backend object (kept alive here)."""
        key = id(obj)
        self._objects[key] = obj
        return key

    def _generic_launch(self, function: int, grid: Any, block: Any, shared_bytes: int, stream: int,
                        args: Any, arg_bytes: int) -> int:
        """The sim's launch, called from C (with the GIL taken by cffi)."""
        data = bytes(ffi.buffer(args, arg_bytes)) if arg_bytes else b""
        try:
            self.vg.backend.launch(self._objects[function], (grid[0], grid[1], grid[2]),
                                   (block[0], block[1], block[2]), shared_bytes,
                                   self._objects[stream], data)
        except BackendError as exc:
            return exc.code or CUDA_ERROR_UNKNOWN
        return 0

    def _generic_copy(self, to_host: int, dst: int, src: int, count: int, stream: int) -> int:
        """The sim's copies, called from C: to_host, device src to the host buffer at dst; else
        the host bytes at src to device dst."""
        try:
            if to_host:
                data = bytearray(count)
                self.vg.backend.memcpy_dtoh(data, src, count, self._objects[stream])
                ffi.buffer(ffi.cast("uint8_t *", dst), count)[:] = data
            else:
                data = bytes(ffi.buffer(ffi.cast("uint8_t *", src), count))
                self.vg.backend.memcpy_htod(dst, data, count, self._objects[stream])
        except BackendError as exc:
            return exc.code or CUDA_ERROR_UNKNOWN
        return 0

    def _generic_sync(self, stream: int) -> int:
        """The sim's cuStreamSynchronize, called from C."""
        try:
            self.vg.backend.stream_synchronize(self._objects[stream])
        except BackendError as exc:
            return exc.code or CUDA_ERROR_UNKNOWN
        return 0

    def _generic_call(self, conn: int, opcode: int, stream: int, req: Any, req_len: int,
                      payload: Any, payload_len: int) -> int:
        """The sim's library calls and memsets, called from C after its checks (with the GIL
        taken by cffi), made as the Python handlers make them."""
        vg = self.vg
        s = vg._by_conn.get(conn)
        if s is None:
            return CUDA_ERROR_UNKNOWN
        st = self._objects[stream]
        try:
            if opcode == lib.PILOT_OP_MEMSET:
                r = ffi.cast("pilot_req_memset *", req)
                vg.backend.memset_d8(r.ptr, r.value & 0xFF, r.count, st)
            elif opcode == lib.PILOT_OP_BLAS_GEMM:
                r = ffi.cast("pilot_req_blas_gemm *", req)
                h = library_handle(s, r.handle, LIB_CUBLAS)
                settings = BlasSettings(r.workspace, r.workspace_size, bool(r.workspace_set),
                                        r.math_mode, r.pointer_mode, r.atomics_mode,
                                        r.sm_count_target)
                vg.backend.blas_gemm(h.obj, gemm_call(r), settings, st)
            elif opcode == lib.PILOT_OP_DNN_BATCHNORM:
                r = ffi.cast("pilot_req_dnn_bn *", req)
                vg.backend.dnn_batchnorm(s.libraries[r.handle].obj, batchnorm_call(r), st)
            elif opcode == lib.PILOT_OP_GRAPH_LAUNCH:
                vg.backend.graph_launch(self._objects[ffi.cast("uint64_t *", req)[0]], st)
            elif opcode == lib.PILOT_OP_DNN_EXECUTE:
                r = ffi.cast("pilot_req_dnn_execute *", req)
                pack = list(struct.iter_unpack("<qQ", ffi.buffer(payload, payload_len)))
                vg.backend.dnn_execute(s.libraries[r.handle].obj, s.dnn_descriptors[r.plan].obj,
                                       [u for u, _ in pack], [p for _, p in pack], r.workspace, st)
            else:
                r = ffi.cast("pilot_req_blaslt_matmul *", req)
                h = s.libraries[r.handle]
                key, attrs = h.records(ffi.buffer(payload, payload_len))
                vg.backend.blaslt_matmul(h.obj, lt_call(r, attrs), key, st)
        except BackendError as exc:
            return exc.code or CUDA_ERROR_UNKNOWN
        return 0

    def _library_functions(self) -> None:
        """Native mode: tell C the library functions loaded so far (cuBLAS loads with the first
        handle); calls whose functions C lacks go to Python."""
        fns = self.vg.backend.fast_library_functions()
        if fns == self._libfns:
            return
        self._libfns = fns
        table = ffi.new("void *[]", lib.PILOT_FAST_LIBFNS)
        for index, address in fns.items():
            table[index] = ffi.cast("void *", address)
        lib.pilot_fast_libraries(self.ptr, table, lib.PILOT_FAST_LIBFNS, self._type_sizes,
                                 len(self._type_sizes), ffi.NULL)

    # ---- library handles (ops/libraries.py and ops/dnn.py tell) ----
    def handle_used(self, s: Session, token: int, h: Any) -> None:
        """Python used the session's library handle `token`: C may use it from now on (and
        applies every setting again first)."""
        if s.identity is None or s.id not in self._states:
            return
        if self._libfns is not None and _FIRST_FUNCTION[h.library] not in self._libfns:
            self._library_functions()  # its library has loaded since C was told (once each)
        handle = self.vg.backend.fast_library_handle(h.obj)
        if lib.pilot_fast_library_handle(self.ptr, s.identity, token, handle,
                                         _HANDLE_KINDS[h.library]) != 0:
            raise MemoryError("pilot_fast_library_handle")

    def dnn_plan(self, s: Session, token: int, plan: Any) -> None:
        """Python ran an execution of the session's plan `token` (a finalized DnnDescriptor):
        C may run its next ones, with the tensors and workspace the plan gives (a plan whose
        tensors pilot cannot size stays with Python, and C is told so)."""
        if s.identity is None or s.id not in self._states:
            return
        tensors = plan.tensors
        sized = tensors is not None and not any(t.by_value for t in tensors.values())
        kept = [(uid, t.span) for uid, t in (tensors or {}).items() if not t.virtual] if sized else []
        if len(kept) > 64:
            sized, kept = False, []
        handle = self.vg.backend.fast_dnn_plan(plan.obj) if sized else 0
        if lib.pilot_fast_dnn_plan(self.ptr, s.identity, token, handle, plan.workspace_size,
                                   [u for u, _ in kept] or ffi.NULL,
                                   [n for _, n in kept] or ffi.NULL, len(kept), int(not sized)) != 0:
            raise MemoryError("pilot_fast_dnn_plan")

    def dnn_bn(self, s: Session, req: Any, call: Any) -> None:
        """Python ran a batch normalization (ForwardTrainingEx or BackwardEx): C may run the
        next ones of the same shape, checking the ranges the shape gives."""
        if s.identity is None or s.id not in self._states or \
                req.fn not in (lib.PILOT_BN_FORWARD_TRAINING_EX, lib.PILOT_BN_BACKWARD_EX):
            return
        spans = [call.x.span(), call.y.span() if call.y is not None else 0,
                 call.dx.span() if call.dx is not None else 0, call.bn.span()]
        if lib.pilot_fast_dnn_bn(self.ptr, s.identity, req, spans) != 0:
            log.debug("session %d: batch normalization stays with Python", s.id)
        self.stream_used(s, req.stream)

    def stream_used(self, s: Session, token: int) -> None:
        """Python put a library call on the program's stream `token`: C may put the next ones
        there too (a stream that only library calls use is never taught by a launch)."""
        if not token or s.identity is None or s.id not in self._states:
            return
        st = s.streams.get(token)
        if st is not None:  # a blocking stream's calls stay with Python
            lib.pilot_fast_stream(self.ptr, s.identity, token, self._raw(st.obj), int(st.blocking))

    def why_python(self, s: Session, token: int, ptr: int, count: int) -> str:
        """Why C left a memset of the session to Python, as far as Python can tell (logged at
        debug level: which calls still cost the interpreter lock, issue 25)."""
        state = self._states.get(s.id)
        if state is None or not state[1]:
            return "the session is off the fast path (policy, gate, residency or sticky error)"
        if not count:
            return "empty"
        if not s.owns_allocation_range(ptr, count):
            return "not inside one device allocation C knows (a module variable, managed memory)"
        if not token:
            return "legacy stream, behind blocking-stream work" if s.dirty_blocking else "legacy stream"
        st = s.streams.get(token)
        if st is None:
            return "unknown stream"
        return "blocking stream" if st.blocking else "first call on this stream"

    def why_python_lt(self, s: Session, req: Any, ranges: LtRanges) -> str:
        """Why C left a cuBLASLt matmul to Python, as far as Python can tell: try_lt's checks
        (fast_library.c) in its order; "not taught yet" when every one passes."""
        state = self._states.get(s.id)
        if state is None or not state[1]:
            return "the session is off the fast path"
        if ranges.device_scalars:
            return "device scalars (Python only)"
        spans = [ranges.spans[obj] for obj in (LT_A, LT_B, LT_C, LT_D)]
        for name, ptr, span in zip("ABCD", (req.a, req.b, req.c, req.d), spans, strict=True):
            if (ptr or name == "D") and span and not s.owns_allocation_range(ptr, span):
                return f"{name} [{ptr:#x}, +{span}) not inside one device allocation"
        for ptr, span in ranges.fixed:
            if span and not s.owns_allocation_range(ptr, span):
                return f"descriptor pointer [{ptr:#x}, +{span}) not inside one device allocation"
        if req.workspace_size and not s.owns_allocation_range(req.workspace, req.workspace_size):
            return "workspace not inside one device allocation"
        if req.stream and req.stream not in s.streams:
            return "unknown stream"
        return "not taught yet (or evicted)"

    def dnn_plan_gone(self, s: Session, token: int) -> None:
        if s.identity is not None and s.id in self._states:
            lib.pilot_fast_dnn_plan(self.ptr, s.identity, token, 0, 0, ffi.NULL, ffi.NULL, 0, 0)

    def lt_plan(self, s: Session, token: int, h: Any, key: bytes, ranges: LtRanges) -> None:
        """Python ran a cuBLASLt matmul with these descriptor records: C may run the same
        records from now on, checking the ranges they give (sets with scalars in device memory
        stay with Python: C is told so, not to send each one back to learn)."""
        if s.identity is None or s.id not in self._states:
            return
        self.handle_used(s, token, h)
        self.lt_forget_evicted(s, token, h)
        descs = None if ranges.device_scalars else self.vg.backend.fast_lt_descriptors(h.obj, key)
        spans = [ranges.spans[obj] for obj in (LT_A, LT_B, LT_C, LT_D)]
        # each pointer attribute's span: C checks and applies every call's value of it
        fixed = [v for pair in ranges.pointer_spans for v in pair]
        if lib.pilot_fast_lt_plan(self.ptr, s.identity, token, key, len(key), descs or [0] * 5,
                                  spans, fixed or ffi.NULL, len(ranges.pointer_spans)) != 0:
            raise MemoryError("pilot_fast_lt_plan")

    def lt_forget_evicted(self, s: Session, token: int, h: Any) -> None:
        """Descriptor sets the backend destroyed to make room: C forgets them."""
        for key in self.vg.backend.fast_lt_evicted(h.obj):
            if s.identity is not None and s.id in self._states:
                lib.pilot_fast_lt_plan(self.ptr, s.identity, token, key, len(key), ffi.NULL,
                                       ffi.NULL, ffi.NULL, 0)

    def graph(self, s: Session, token: int, graph_exec: Any) -> None:
        """The session's executable graph `token` is pilotd's `graph_exec` (None: forget it):
        C launches it from now on."""
        if s.identity is None or s.id not in self._states:
            return
        if graph_exec is None:
            value = 0
        elif self._libfns is None:  # generic mode: C calls back with a value standing for it
            value = self._registered(graph_exec)
        else:
            if lib.PILOT_FAST_GRAPH_LAUNCH not in self._libfns:
                self._library_functions()
            value = self.vg.backend.fast_graph_exec(graph_exec)
        if lib.pilot_fast_graph(self.ptr, s.identity, token, value) != 0:
            raise MemoryError("pilot_fast_graph")

    def library_gone(self, s: Session, token: int) -> None:
        if s.identity is not None and s.id in self._states:
            lib.pilot_fast_library_handle(self.ptr, s.identity, token, 0, 0)  # and its sets

    # ---- what Python tells C ----
    def output(self, fd: int, taken: int) -> None:
        """The kernels' printf output file and how much of it has been taken: C leaves calls
        to Python while there is more (device_output.py)."""
        lib.pilot_fast_output(self.ptr, fd, taken)

    def context(self, partition: Any) -> None:
        """The SM partition now current on the vGPU thread."""
        lib.pilot_fast_context(self.ptr, 0 if partition is None else id(partition))

    def update(self, s: Session) -> None:
        """After Python handled calls of the session: whether C may launch for it now."""
        conn = s.identity
        if conn is None:
            return
        lib.pilot_fast_python_work(self.ptr, conn)
        res = self.vg.broker.residency
        host = self.vg.policy
        watch = host.watches_launches(s.id) if host is not None and host.selective else Watch.NONE
        enabled = 0 if (s.sticky or s.waiting is not None or s.gated or s.gate_held
                        or s.policy_hold is not None or watch is Watch.ALL or s.preemptible
                        or (res is not None and s.id in res.sessions)) \
            else lib.PILOT_FAST_NEXT_LAUNCH if watch is Watch.NEXT else lib.PILOT_FAST_ALL
        if not enabled and s.id not in self._states:
            return  # C has never served it (a policy watches it from its start): nothing to tell
        legacy = self._raw(s.legacy) if enabled and s.legacy is not None else 0
        state = (conn, int(enabled), legacy, int(bool(s.dirty_blocking)), int(bool(s.deferred)),
                 0 if s.partition is None else id(s.partition))
        if self._states.get(s.id) != state:
            self._states[s.id] = state
            if lib.pilot_fast_session(self.ptr, *state[:1], s.id, *state[1:]) != 0:
                raise MemoryError("pilot_fast_session")
            if s.preempt_raises and self.vg.preempt is not None:  # C may have just met it
                self.vg.preempt.tell_fast(s, self)
            output = self.vg.device_output
            if output is not None and output.prints(s.id):
                lib.pilot_fast_printer(self.ptr, conn)
            if s.fast_ranges is None:  # from now on C knows the session's device memory
                s.fast_ranges = self._ranges_of(conn)
                for ptr, size in list(s.allocations.items()):
                    if ptr not in s.managed:
                        s.fast_ranges(ptr, size)
                for ptr, size in list(s.imports.items()):  # opened through CUDA IPC
                    s.fast_ranges(ptr, size)
                s.fast_shadows = ShadowsInC(self.ptr, conn)
                for shadow in list(s.shadows.values()):
                    s.fast_shadows.added(shadow)
        if enabled and s.shadows:  # what shadow flushes need: the staging area, the stream
            if self._coherence is None:
                self._coherence = self._raw(coherence_stream(self.vg))
                lib.pilot_fast_coherence(self.ptr, self._coherence)
            staging = s.staging
            where = (staging.address, staging.slot_bytes, staging.slots) if staging is not None \
                else (0, 0, 0)
            if self._staging.get(s.id) != where:
                self._staging[s.id] = where
                lib.pilot_fast_staging(self.ptr, conn, ffi.cast("uint8_t *", where[0]), *where[1:])
        # What a synchronization waits for: every stream, while nothing of the session's waits
        # in Python (blocking-stream work the legacy stream must wait for).
        key = (legacy, *s.streams) if legacy and not s.dirty_blocking else ()
        if self._syncs.get(s.id) != key:
            self._syncs[s.id] = key
            values = [legacy, *(self._raw(st.obj) for st in s.streams.values())] if key else []
            if lib.pilot_fast_sync_streams(self.ptr, conn, values, len(values)) != 0:
                raise MemoryError("pilot_fast_sync_streams")

    def _ranges_of(self, conn: int) -> Any:
        fast, set_range = self.ptr, lib.pilot_fast_range

        def tell(ptr: int, size: int) -> None:
            if set_range(fast, conn, ptr, size) != 0 and size:
                raise MemoryError("pilot_fast_range")
        return tell

    def launched(self, s: Session, launch: Launch, stream: Any) -> None:
        """Python put this launch on `stream`: later launches of its kernel (and stream, when
        not the legacy one and not blocking) may go to C."""
        conn = s.identity
        info = launch.info
        if conn is not None and s.id in self._states:
            lib.pilot_fast_mark_launched(self.ptr, conn)
        if conn is None or info is None or launch.attrs is not None or s.id not in self._states:
            return
        try:
            lib.pilot_fast_function(self.ptr, conn, launch.function, self._raw(info.handle),
                                    info.arg_bytes)
            if launch.stream:
                st = s.streams.get(launch.stream)
                if st is not None:  # a blocking stream's launches stay with Python
                    lib.pilot_fast_stream(self.ptr, conn, launch.stream, self._raw(st.obj),
                                          int(st.blocking))
        except (TypeError, ValueError) as exc:  # a handle with no value: C cannot launch it
            log.warning("vgpu-%d: fast launches off: %s", self.vg.index, exc)
            self.disable()

    def disable(self) -> None:
        """Every launch through Python from now on (the C state is kept until close)."""
        lib.pilot_srv_set_fast(self.vg._srv, ffi.NULL)
        self.vg.fast = None

    def stream_gone(self, s: Session, handle: int) -> None:
        if s.identity is not None and s.id in self._states:
            lib.pilot_fast_stream(self.ptr, s.identity, handle, 0, 0)

    def forget(self, s: Session) -> None:
        if s.fast_shadows is not None:
            s.fast_shadows.take_all(s)
        s.fast_ranges = s.fast_shadows = None
        self._syncs.pop(s.id, None)
        self._staging.pop(s.id, None)
        if self._states.pop(s.id, None) is not None and s.identity is not None:
            lib.pilot_fast_forget(self.ptr, s.identity)

    # ---- what C did ----
    def fold(self) -> None:
        """Charge what C launched since the last fold, as the Python path does per launch."""
        vg = self.vg
        board = vg.gate.board
        while True:
            n = lib.pilot_fast_take(self.ptr, self._counts, COUNTS)
            if not n:
                return
            shard = vg.shard
            now = time.monotonic()
            for i in range(n):
                count = self._counts[i]
                s = vg._by_conn.get(count.conn)
                if s is None:
                    continue
                launches = count.launches
                syncs = count.syncs
                library = self._fold_library(s, count)
                if count.words:
                    self._add(("fast_word_answers", (s.tenant,)), count.words)
                graphs = count.graphs
                if graphs:
                    self._row("graph_launch")[0] += graphs
                    self._add(("fast_graph_launches", (s.tenant,)), graphs)
                stream_work = launches + count.d2h + count.h2d + syncs[0] + syncs[1] + library + graphs
                s.calls += stream_work + count.flushes
                if stream_work:
                    s.work_in_flight = not count.synced  # as after the last thing C did
                    if s.signals:  # it is active: lower tenants are gated (scheduling/priority.py)
                        board.touched(s, now)
                s.legacy_gen += count.legacy
                s.kernels += launches + graphs
                if launches:
                    shard.kernels += launches
                    self._add(("tenant_launches", (s.tenant,)), launches)
                    self._add(("fast_launches", (s.tenant,)), launches)
                    self._row("launch")[0] += launches
                for direction, calls, nbytes, buckets, seconds in (
                        ("d2h", count.d2h, count.d2h_bytes, count.d2h_buckets, count.d2h_seconds),
                        ("h2d", count.h2d, count.h2d_bytes, count.h2d_buckets, count.h2d_seconds)):
                    if calls:
                        self._answered("memcpy_" + direction, calls, buckets, seconds,
                                       ("fast_copies", (s.tenant,)))
                        vg.metrics.bytes_copied(direction, nbytes, s.tenant)
                for kind, name in enumerate(("device_synchronize", "stream_synchronize")):
                    if syncs[kind]:
                        self._answered(name, syncs[kind], count.sync_buckets[kind],
                                       count.sync_seconds[kind], ("fast_syncs", (s.tenant,)))
                if count.flushes:
                    self._answered("shadow_flush", count.flushes, count.flush_buckets,
                                   count.flush_seconds, ("fast_flushes", (s.tenant,)))
                    vg.metrics.bytes_copied("h2d", count.flush_bytes, s.tenant)
                if count.shadows_touched and s.fast_shadows is not None:
                    s.fast_shadows.take_all(s)
            if n < COUNTS:
                return

    def _fold_library(self, s: Session, count: Any) -> int:
        """The library calls and memsets C issued for s: counted as Python counts them."""
        total = 0
        if count.lt_matmuls:
            total += self._library_row(s, "blaslt_matmul", "cublasLtMatmul", count.lt_matmuls)
        for fn in range(1, lib.PILOT_FAST_GEMM_FNS):
            if count.gemms[fn]:
                total += self._library_row(s, "blas_gemm", GEMM_FUNCTIONS[fn], count.gemms[fn])
        if count.dnn_executes:
            total += self._library_row(s, "dnn_execute", "cudnnBackendExecute", count.dnn_executes)
        for k, fn in enumerate((lib.PILOT_BN_FORWARD_TRAINING_EX, lib.PILOT_BN_BACKWARD_EX)):
            if count.dnn_bn[k]:
                total += self._library_row(s, "dnn_batchnorm", BN_FUNCTIONS[fn], count.dnn_bn[k])
        if count.memsets:
            self._row("memset")[0] += count.memsets
            self._add(("fast_library_calls", (s.tenant,)), count.memsets)
            total += count.memsets
        return total

    def _library_row(self, s: Session, call: str, function: str, n: int) -> int:
        self._row(call)[0] += n
        self._add(("library_calls", (s.tenant, function)), n)
        self._add(("fast_library_calls", (s.tenant,)), n)
        return n

    def _answered(self, name: str, calls: int, buckets: Any, seconds: float, counter: Any) -> None:
        """Calls of `name` C answered: their count and latencies into the call's metrics row,
        as Python's path records each, and into the labeled counter of what C did."""
        row = self._row(name)
        row[0] += calls
        for b in range(len(LATENCY_BUCKETS) + 1):
            row[b + 1] += buckets[b]
        row[-1] += seconds
        self._add(counter, calls)

    def _add(self, key: Any, n: int) -> None:
        labeled = self.vg.shard.labeled
        labeled[key] = labeled.get(key, 0) + n

    def _row(self, name: str) -> Any:
        """This thread's metrics row of a call (count, latency buckets, sum: Metrics.call)."""
        calls = self.vg.shard.calls
        row = calls.get(name)
        if row is None:
            row = calls[name] = self.vg.metrics.new_row()
        return row


class ShadowsInC:
    """Session.fast_shadows: tells C a session's unified-memory shadows as they come, change and
    go, and brings back what C counted for them (launches reaching them, flushes)."""

    def __init__(self, fast: Any, conn: int) -> None:
        self.fast, self.conn = fast, conn
        self._left = ffi.new("pilot_fast_shadow_count *")
        self._taken = ffi.new("pilot_fast_shadow_count[]", COUNTS)

    def added(self, shadow: Any) -> None:
        """A new shadow, or one with a new segment: C forgets what it knew and learns it again
        (its counts come back first)."""
        if lib.pilot_fast_shadow(self.fast, self.conn, shadow.base, shadow.length, shadow.chunk,
                                 self._left) != 0:
            raise MemoryError("pilot_fast_shadow")
        _charge(shadow, self._left)
        for lo, hi in shadow.segments:
            if lib.pilot_fast_segment(self.fast, self.conn, lo, hi) != 0:
                raise MemoryError("pilot_fast_segment")

    def removed(self, shadow: Any) -> None:
        lib.pilot_fast_shadow(self.fast, self.conn, shadow.base, 0, 0, self._left)
        _charge(shadow, self._left)

    def take_all(self, s: Session) -> None:
        """C's counts of every shadow of s, into the shadows."""
        while True:
            n = lib.pilot_fast_take_shadows(self.fast, self.conn, self._taken, COUNTS)
            for i in range(n):
                shadow = s.shadows.get(self._taken[i].base)
                if shadow is not None:
                    _charge(shadow, self._taken[i])
            if n < COUNTS:
                return


_HANDLE_KINDS = {LIB_CUBLAS: lib.PILOT_FAST_CUBLAS, LIB_CUBLASLT: lib.PILOT_FAST_CUBLASLT,
                 LIB_CUDNN: lib.PILOT_FAST_CUDNN}
# a function of each library's in enum pilot_fast_libfn: present once C knows the library's
_FIRST_FUNCTION = {LIB_CUBLAS: lib.PILOT_FAST_BLAS_SET_STREAM, LIB_CUBLASLT: lib.PILOT_FAST_LT_MATMUL,
                   LIB_CUDNN: lib.PILOT_FAST_DNN_SET_STREAM}


def _charge(shadow: Any, count: Any) -> None:
    shadow.launches += count.launches
    shadow.flushes += count.flushes
    shadow.flushed_bytes += count.flushed_bytes
    shadow.dirty_chunks += count.dirty_chunks


def _native_value(obj: Any) -> int:
    """A cuda-python handle's value (CUfunction, CUstream: the driver's pointer):
    cuda.bindings.utils.get_cuda_native_handle where it exists, else int(handle), which older
    cuda-bindings document for it."""
    return _native_handle(obj) if _native_handle is not None else int(obj)


try:
    from cuda.bindings.utils import get_cuda_native_handle as _native_handle
except ImportError:  # older cuda-bindings, or none (the sim)
    _native_handle = None


def _callback_failed(exc_type: Any, exc: Any, tb: Any) -> int:
    log.error("fast launch callback failed: %s", exc)
    return CUDA_ERROR_UNKNOWN
