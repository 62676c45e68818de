"""The linker's wire form and the sim's linker (daemon/ops/linker.py, daemon/backends/linker.py):
inputs are read exactly as drv_link.c packs them, anything else is refused; the sim links PTX
only, and refuses what the driver's linker would (an undefined function) rather than accept it."""

from __future__ import annotations

import ctypes
import struct
import weakref
from typing import Any

import pytest

from pilot.daemon.backends import linker as linker_module
from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED,
    BackendError,
)
from pilot.daemon.backends.fatbin import ptx_kernels, ptx_text
from pilot.daemon.backends.linker import INPUT_CUBIN, INPUT_LIBRARY, INPUT_PTX, LinkInput, sim_link
from pilot.daemon.ops.linker import parse_inputs

HEADER = ".version 9.0\n.target sm_90\n.address_size 64\n"
KERNEL = HEADER + """
.extern .func  (.param .b32 func_retval0) twice
(
\t.param .b32 twice_param_0
)
;
.visible .entry scale(
\t.param .u64 scale_param_0
)
{
\tret;
}
"""
FUNCTION = HEADER + """
.visible .func  (.param .b32 func_retval0) twice(
\t.param .b32 twice_param_0
)
{
\tret;
}
"""


def packed(*inputs: tuple[int, str, bytes]) -> bytes:
    """As drv_link.c packs them: header, name, data, each padded to 8 bytes."""
    out = b""
    for kind, name, data in inputs:
        for part in (struct.pack("<IIQ", kind, len(name), len(data)), name.encode(), data):
            out += part + bytes(-len(part) % 8)
    return out


def test_inputs_are_read_as_they_are_packed() -> None:
    got = parse_inputs(memoryview(packed((INPUT_PTX, "a.ptx", b"abc"), (INPUT_CUBIN, "", b"x" * 9))), 2)
    assert got == [LinkInput(INPUT_PTX, "a.ptx", b"abc"), LinkInput(INPUT_CUBIN, "", b"x" * 9)]


@pytest.mark.parametrize("payload, count", [
    (packed((INPUT_PTX, "a", b"abc")), 2),            # fewer inputs than counted
    (packed((INPUT_PTX, "a", b"abc")) + b"\0" * 8, 1),  # bytes after them
    (packed((7, "a", b"abc")), 1),                     # no such input type
    (packed((INPUT_PTX, "a", b"")), 1),                # empty data
    (struct.pack("<IIQ", INPUT_PTX, 0, 1 << 40), 1),   # a size past the frame
])
def test_malformed_inputs_are_refused(payload: bytes, count: int) -> None:
    with pytest.raises(BackendError) as info:
        parse_inputs(memoryview(payload), count)
    assert info.value.code == CUDA_ERROR_INVALID_VALUE


def test_the_sim_links_ptx_into_one_text_it_can_load() -> None:
    image, log = sim_link([LinkInput(INPUT_PTX, "k", KERNEL.encode()),
                           LinkInput(INPUT_PTX, "f", FUNCTION.encode())])
    assert image.endswith(b"\0") and log == ""
    assert list(ptx_kernels(ptx_text(image) or "")) == ["scale"]


@pytest.mark.parametrize("inputs, code", [
    ([LinkInput(INPUT_PTX, "k", KERNEL.encode())], CUDA_ERROR_INVALID_IMAGE),  # twice undefined
    ([LinkInput(INPUT_CUBIN, "c", b"\x7fELF...")], CUDA_ERROR_NOT_SUPPORTED),
    ([LinkInput(INPUT_PTX, "t", b"not ptx")], CUDA_ERROR_INVALID_PTX),
    ([], CUDA_ERROR_INVALID_VALUE),
])
def test_the_sim_refuses_what_it_cannot_link(inputs: list[LinkInput], code: int) -> None:
    with pytest.raises(BackendError) as info:
        sim_link(inputs)
    assert info.value.code == code


def test_a_library_may_define_what_ptx_declares() -> None:
    image, _ = sim_link([LinkInput(INPUT_PTX, "k", KERNEL.encode()),
                         LinkInput(INPUT_LIBRARY, "libcudadevrt.a", b"!<arch>\n")])
    assert b"scale" in image



class _DriverThatKeepsPointers:
    """libcuda's linker as far as lifetimes go: cuLinkCreate and cuLinkAddData keep only the
    addresses of the arrays and buffers they are given, as C does, and cuLinkComplete writes the
    logs' sizes back into the option values; so everything given must still be alive there."""

    def __init__(self, buffers: list[weakref.ref[Any]]) -> None:
        self.kept = buffers  # every buffer the linker made (its logs, the inputs' copies)
        self.image = ctypes.create_string_buffer(b"CUBIN")
        self.destroyed = False

    def cuLinkCreate_v2(self, n: int, keys: Any, values: Any, state: Any) -> int:
        self.kept += [weakref.ref(keys), weakref.ref(values)]
        return 0

    def cuLinkAddData_v2(self, *args: Any) -> int:
        return 0

    def cuLinkComplete(self, state: Any, cubin: Any, size: Any) -> int:
        assert all(ref() is not None for ref in self.kept), "the driver would write freed memory"
        cubin._obj.value, size._obj.value = ctypes.addressof(self.image), 5
        return 0

    def cuLinkDestroy(self, state: Any) -> int:
        self.destroyed = True
        return 0


def test_the_cuda_linker_keeps_what_the_driver_holds_alive_until_cuLinkDestroy(monkeypatch):
    """pilotd died on the H200 when the option arrays were temporaries freed after cuLinkCreate."""
    made: list[weakref.ref[Any]] = []
    real = ctypes.create_string_buffer

    def tracked(*args: Any) -> Any:
        buffer = real(*args)
        made.append(weakref.ref(buffer))
        return buffer

    driver = _DriverThatKeepsPointers(made)
    monkeypatch.setattr(linker_module.ctypes, "create_string_buffer", tracked)
    linker = linker_module.CudaLinker()
    linker._lib = driver  # type: ignore[assignment]
    image, _ = linker.link([LinkInput(INPUT_PTX, "k.ptx", KERNEL.encode()),
                            LinkInput(INPUT_PTX, "f.ptx", FUNCTION.encode())], [(7, 3)])
    assert image == b"CUBIN" and driver.destroyed
    assert len(made) == 6  # two logs, two inputs, two option arrays
