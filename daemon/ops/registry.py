"""How operation handlers are declared: each chapter module of ops/ owns one OpTable, and
ops/__init__.py merges the tables in one place.

A handler takes (vgpu, session, request struct, payload) and returns None (a plain status
reply), a reply struct, or (reply struct, payload bytes). Errors are raised as BackendError; the
vGPU dispatcher turns them into replies or deferred errors. `synchronizing` handlers deliver
the errors of earlier asynchronous calls, as CUDA's synchronizing calls do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pilot.daemon.sessions.session import Session
    from pilot.daemon.vgpu.server import VGpu

Handler = Callable[["VGpu", "Session", Any, memoryview], Any]


@dataclass(frozen=True)
class HandlerSpec:
    fn: Handler
    request: str | None  # struct name of the request body, None for an empty body
    synchronizing: bool
    chapter: str = ""


class OpTable:
    """The handlers of one chapter, by opcode."""

    def __init__(self, chapter: str) -> None:
        self.chapter = chapter
        self.specs: dict[int, HandlerSpec] = {}

    def handler(self, op: int, request: str | None = None,
                synchronizing: bool = False) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            if op in self.specs:
                raise RuntimeError(f"{self.chapter}: two handlers for opcode {op}")
            self.specs[op] = HandlerSpec(fn, request, synchronizing, self.chapter)
            return fn

        return register


def merge(tables: list[OpTable]) -> dict[int, HandlerSpec]:
    merged: dict[int, HandlerSpec] = {}
    for table in tables:
        for op, spec in table.specs.items():
            if op in merged:
                raise RuntimeError(f"opcode {op}: handled in {merged[op].chapter} and {table.chapter}")
            merged[op] = spec
    return merged
