"""CUDA graphs as real graphs (shim/runtime/graph/graph_remote.c): the shim records the posted calls an
executable graph's nodes make and sends them in one GRAPH_INSTANTIATE; pilotd runs them through
their ordinary handlers, with every check those make, while it captures the recording stream,
and instantiates what it captured. A GRAPH_LAUNCH is then one cuGraphLaunch (in C on the fast
path, vgpu/fast.py; here otherwise).

What pilotd does not put in a graph is answered with a reason, and the shim replays the nodes one
by one as before: calls that are not pure device work (copies that read host memory, pointer
arrays pilotd copies for cuBLAS), sessions whose launches go one by one through a policy, the
capacity enforcer, kernel timing or managed memory, and nodes the driver will not capture. A
node whose memory is not the session's is refused: the instantiation fails.

Checks hold at instantiation; memory freed later could be another tenant's by the next launch,
so a free makes the session's graphs stale (Session.remove_allocation) and the next launch of
each is captured again from its records, checks included, before it runs.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_VALUE, BackendError
from pilot.daemon.backends.libraries import GEMM_BATCHED
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.protocol import ProtocolError, ffi, lib, new
from pilot.daemon.scheduling import streams
from pilot.daemon.scheduling.launch import WaitForPolicy, launches_seen_one_by_one

if TYPE_CHECKING:
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.vgpu.server import VGpu

log = logging.getLogger("pilot.graphs")

OPS = OpTable("graphs")

MAX_GRAPHS = 4096  # executable graphs pilotd holds for one session
MAX_RECORD_BYTES = 64 << 20  # their records, in all, for one session

_RECORD = struct.Struct("<HHIII")  # pilot_graph_record
assert _RECORD.size == ffi.sizeof("pilot_graph_record")

# Posted calls that are device work only, so pilotd may hold them in a graph (each handler's own
# checks run at capture). Copies that read host memory are not: the host bytes would have to
# outlive the call.
_CAPTURABLE = frozenset({
    lib.PILOT_OP_LAUNCH, lib.PILOT_OP_LAUNCH_EX, lib.PILOT_OP_MEMCPY_D2D, lib.PILOT_OP_MEMCPY_2D,
    lib.PILOT_OP_MEMSET, lib.PILOT_OP_MEMSET_WIDE, lib.PILOT_OP_MEMSET_2D, lib.PILOT_OP_BLAS_GEMM,
    lib.PILOT_OP_BLASLT_MATMUL, lib.PILOT_OP_DNN_EXECUTE, lib.PILOT_OP_DNN_BATCHNORM,
})

_OUTCOMES = {
    lib.PILOT_GRAPH_INSTANTIATED: "instantiated",
    lib.PILOT_GRAPH_REPLAY_NODE: "replay_node",
    lib.PILOT_GRAPH_REPLAY_POLICY: "replay_policy",
    lib.PILOT_GRAPH_REPLAY_CAPTURE: "replay_capture",
    lib.PILOT_GRAPH_REPLAY_LIMIT: "replay_limit",
}


@dataclass(slots=True)
class RemoteGraph:
    """An executable graph of the session as pilotd holds it."""

    records: bytes  # the GRAPH_INSTANTIATE payload, kept to capture it again
    count: int
    stream: int  # the recording stream (the program's handle)
    graph_exec: Any  # the backend's executable graph; None while stale
    nodes: int


class _Replay(Exception):
    """The graph stays with the shim, which replays its nodes; `reason` is enum pilot_graph_replay."""

    def __init__(self, reason: int, why: str) -> None:
        super().__init__(why)
        self.reason = reason


def parse_records(payload: memoryview, count: int) -> list[tuple[int, memoryview, memoryview]]:
    """(opcode, request, payload) of each record; ProtocolError unless the frame holds exactly
    `count` well-formed records."""
    out = []
    pos, end = 0, len(payload)
    for _ in range(count):
        if pos + _RECORD.size > end:
            raise ProtocolError(f"graph record {len(out)} past the end of the frame")
        op, _, req_len, payload_len, _ = _RECORD.unpack_from(payload, pos)
        body = pos + _RECORD.size
        if body + req_len + payload_len > end:
            raise ProtocolError(f"graph record {len(out)} ({req_len}+{payload_len} bytes) past the end")
        out.append((op, payload[body:body + req_len], payload[body + req_len:body + req_len + payload_len]))
        pos = body + ((req_len + payload_len + 7) & ~7)
    if pos != end:
        raise ProtocolError(f"{end - pos} bytes after {count} graph records")
    return out


def qualifies(vg: VGpu, s: Session) -> str:
    """Why the session's launches must each go through Python ('' if they need not)."""
    why = launches_seen_one_by_one(vg)
    if why:
        return why
    res = vg.broker.residency
    if res is not None and s.id in res.sessions:
        return "the capacity enforcer moves its memory per launch"
    if s.managed or s.shadows:
        return "it has managed memory"
    return ""


def _capturable(vg: VGpu, op: int, req: Any) -> bool:
    if op == lib.PILOT_OP_MEMCPY_2D:
        return req.kind == lib.PILOT_COPY_D2D
    if op == lib.PILOT_OP_LAUNCH_EX:
        return not (req.cooperative or req.cluster[0])
    if op == lib.PILOT_OP_BLAS_GEMM:  # pointer arrays go through pilotd's own scratch copy
        return req.fn not in GEMM_BATCHED
    return True


def _end_quietly(vg: VGpu, stream: Any) -> None:
    try:
        vg.backend.stream_end_capture(stream)
    except BackendError:
        pass


def capture(vg: VGpu, s: Session, stream_token: int, records: list[tuple[int, memoryview, memoryview]]
            ) -> tuple[Any, int]:
    """Run the records through their handlers on the captured recording stream; the
    instantiated graph and its node count. Raises _Replay, or the BackendError of a node the
    handlers refuse (cudaErrorInvalidValue: memory that is not the session's)."""
    why = qualifies(vg, s)
    if why:
        raise _Replay(lib.PILOT_GRAPH_REPLAY_POLICY, why)
    calls = []
    for op, body, payload in records:
        spec = vg._specs.get(op)
        if op not in _CAPTURABLE or spec is None or len(body) < spec.size:
            raise _Replay(lib.PILOT_GRAPH_REPLAY_NODE, f"{vg._op_names.get(op, op)} cannot be in a graph")
        req = ffi.cast(spec.ptr, ffi.from_buffer(body))
        if not _capturable(vg, op, req):
            raise _Replay(lib.PILOT_GRAPH_REPLAY_NODE,
                          f"this {vg._op_names.get(op, op)} cannot be in a graph")
        calls.append((spec.fn, req, payload))
    if not stream_token:
        raise _Replay(lib.PILOT_GRAPH_REPLAY_NODE, "recorded on the legacy stream")
    stream = streams.stream_for_work(vg, s, stream_token)
    backend = vg.backend
    backend.stream_begin_capture(stream)
    vg.capturing = True  # no preemptible variants in a graph: their slots are per launch
    try:
        for fn, req, payload in calls:
            fn(vg, s, req, payload)
    except BackendError as exc:
        _end_quietly(vg, stream)
        if exc.code == CUDA_ERROR_INVALID_VALUE:
            raise
        raise _Replay(lib.PILOT_GRAPH_REPLAY_CAPTURE, str(exc)) from None
    except WaitForPolicy:
        _end_quietly(vg, stream)
        raise _Replay(lib.PILOT_GRAPH_REPLAY_POLICY, "a policy held a launch") from None
    except BaseException:
        _end_quietly(vg, stream)
        raise
    finally:
        vg.capturing = False
    try:
        return backend.graph_instantiate(backend.stream_end_capture(stream))
    except BackendError as exc:
        raise _Replay(lib.PILOT_GRAPH_REPLAY_CAPTURE, str(exc)) from None


def _forget(vg: VGpu, s: Session, token: int) -> RemoteGraph | None:
    g = s.graphs.pop(token, None)
    if g is None:
        return None
    s.graph_bytes -= len(g.records)
    _drop_exec(vg, s, token, g)
    return g


def _drop_exec(vg: VGpu, s: Session, token: int, g: RemoteGraph) -> None:
    """C forgets the graph, and pilotd's executable graph is destroyed (the driver frees it once
    a launch still running ends)."""
    if vg.fast is not None:
        vg.fast.graph(s, token, None)
    if g.graph_exec is not None:
        try:
            vg.backend.graph_exec_destroy(g.graph_exec)
        except BackendError as exc:
            log.warning("session %d: destroying graph %#x: %s", s.id, token, exc)
        g.graph_exec = None


def _hold(vg: VGpu, s: Session, token: int, g: RemoteGraph) -> None:
    if s.graphs_stale is None:
        s.graphs_stale = lambda: graphs_stale(vg, s)
    s.graphs[token] = g
    s.graph_bytes += len(g.records)
    if vg.fast is not None and g.graph_exec is not None:
        vg.fast.graph(s, token, g.graph_exec)


@OPS.handler(lib.PILOT_OP_GRAPH_INSTANTIATE, "pilot_req_graph")
def graph_instantiate(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    token = req.exec
    _forget(vg, s, token)
    records = parse_records(payload, req.count)
    rep = new("pilot_rep_graph")
    outcome = lib.PILOT_GRAPH_INSTANTIATED
    try:
        if len(s.graphs) >= MAX_GRAPHS or s.graph_bytes + len(payload) > MAX_RECORD_BYTES:
            raise _Replay(lib.PILOT_GRAPH_REPLAY_LIMIT, f"{len(s.graphs)} graphs held")
        graph_exec, nodes = capture(vg, s, req.stream, records)
    except _Replay as replay:
        outcome = rep.replay = replay.reason
        log.info("session %d: graph of %d calls replayed by the shim: %s", s.id, req.count, replay)
    except BackendError:
        vg.metrics.count("graph_instantiations", (s.tenant, "refused"))
        raise
    else:
        rep.nodes = nodes
        _hold(vg, s, token, RemoteGraph(bytes(payload), req.count, req.stream, graph_exec, nodes))
    vg.metrics.count("graph_instantiations", (s.tenant, _OUTCOMES[outcome]))
    return rep


@OPS.handler(lib.PILOT_OP_GRAPH_LAUNCH, "pilot_req_graph")
def graph_launch(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    token = req.exec
    g = s.graphs.get(token)
    if g is None:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"no graph {token:#x} in pilotd")
    if g.graph_exec is None:  # stale: memory was freed since its checks
        try:
            g.graph_exec, g.nodes = capture(vg, s, g.stream, parse_records(memoryview(g.records), g.count))
        except _Replay as replay:  # nothing to replay it with here: the launch fails
            _forget(vg, s, token)
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"graph {token:#x}: {replay}") from None
        except BackendError:
            _forget(vg, s, token)
            raise
        if vg.fast is not None:
            vg.fast.graph(s, token, g.graph_exec)
    stream = streams.stream_for_work(vg, s, req.stream)
    vg.backend.graph_launch(g.graph_exec, stream)
    s.work_in_flight = True
    s.kernels += 1
    if vg.fast is not None:
        vg.fast.stream_used(s, req.stream)


@OPS.handler(lib.PILOT_OP_GRAPH_DESTROY, "pilot_req_graph")
def graph_destroy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    _forget(vg, s, req.exec)


def graphs_stale(vg: VGpu, s: Session) -> None:
    """Memory of the session was freed: each graph is captured again, checks included, at its
    next launch (C forgets them until then)."""
    for token, g in s.graphs.items():
        if g.graph_exec is not None:
            _drop_exec(vg, s, token, g)

