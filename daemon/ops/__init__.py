"""The daemon's operations, one module per chapter of the CUDA runtime manual. The table of
every opcode's handler is built here, in one place, from each chapter's OpTable."""

from __future__ import annotations

from pilot.daemon.ops import (
    arrays,
    device,
    dnn,
    events,
    execution,
    graphs,
    host_memory,
    ipc,
    libraries,
    linker,
    memory,
    mempool,
    streams,
    unified,
)
from pilot.daemon.ops.registry import HandlerSpec, merge

CHAPTERS = (device, streams, events, execution, graphs, memory, mempool, arrays, unified,
            host_memory, ipc, libraries, dnn, linker)


def handler_table() -> dict[int, HandlerSpec]:
    """Opcode -> handler over every chapter; refuses an opcode handled twice."""
    return merge([chapter.OPS for chapter in CHAPTERS])
