"""The sim backend's CUDA arrays, 3D copies, texture and surface objects (daemon/backends/sim.py,
daemon/sim_kernels.SimImage): the rules tests/apps/arrays.cu does not reach."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from pilot.daemon.backends.base import (
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_INVALID_CHANNEL_DESCRIPTOR,
    CUDA_ERROR_INVALID_VALUE,
    BackendError,
    ChannelDesc,
    CopySide,
    Resource,
    TextureDesc,
)
from pilot.daemon.backends.sim import SimBackend
from pilot.daemon.sim_kernels import KernelRegistry, SimImage

INT1 = ChannelDesc(32, 0, 0, 0, 0)
WRAP, CLAMP, MIRROR, BORDER = 0, 1, 2, 3


@pytest.fixture
def sim() -> SimBackend:
    be = SimBackend(KernelRegistry())
    be.bind_thread(0)
    return be


def _code(call: Any, *args: Any) -> int:
    with pytest.raises(BackendError) as info:
        call(*args)
    return info.value.code


def test_channel_formats() -> None:
    for good in ((8, 0, 0, 0, 1), (16, 16, 0, 0, 0), (32, 32, 32, 32, 2), (16, 0, 0, 0, 2)):
        ChannelDesc(*good).check()
    for bad in ((8, 8, 8, 0, 1), (8, 16, 0, 0, 1), (0, 8, 0, 0, 1), (8, 0, 0, 0, 2),
                (64, 0, 0, 0, 0), (8, 0, 0, 0, 3)):
        assert _code(ChannelDesc(*bad).check) == CUDA_ERROR_INVALID_CHANNEL_DESCRIPTOR, bad
    assert ChannelDesc(8, 8, 8, 8, 1).element_size == 4
    assert ChannelDesc(16, 16, 0, 0, 2).element_size == 4


def test_array_extents_follow_the_device_limits(sim: SimBackend) -> None:
    sim.array_create(131072, 0, 0, INT1, 0)
    sim.array_create(16384, 16384, 1, ChannelDesc(8, 0, 0, 0, 1), 0)
    assert _code(sim.array_create, 131073, 0, 0, INT1, 0) == CUDA_ERROR_INVALID_VALUE
    assert _code(sim.array_create, 16385, 2, 2, INT1, 0) == CUDA_ERROR_INVALID_VALUE
    assert _code(sim.array_create, 0, 2, 0, INT1, 0) == CUDA_ERROR_INVALID_VALUE
    sim.array_create(64, 0, 2048, INT1, 1)  # a layered 1D array: 2048 layers
    assert _code(sim.array_create, 64, 0, 2049, INT1, 1) == CUDA_ERROR_INVALID_VALUE


def test_box_copies_and_bounds(sim: SimBackend) -> None:
    arr = sim.array_create(4, 3, 2, INT1, 0)  # rows of 16 bytes
    data = bytes(range(16 * 3 * 2))
    sim.memcpy_3d(CopySide("array", array=arr), CopySide("host", buffer=data, pitch=16, rows=3),
                  16, 3, 2, None)
    out = bytearray(8 * 2)
    sim.memcpy_3d(CopySide("host", buffer=out, pitch=8, rows=1),
                  CopySide("array", array=arr, x=4, y=2, z=0), 8, 1, 2, None)
    assert bytes(out) == data[36:44] + data[84:92]
    with pytest.raises(BackendError):
        sim.memcpy_3d(CopySide("host", buffer=out, pitch=8, rows=1),
                      CopySide("array", array=arr, x=12, y=0, z=0), 8, 1, 1, None)
    sim.array_destroy(arr, None)
    assert _code(sim.memcpy_3d, CopySide("host", buffer=out, pitch=8, rows=1),
                 CopySide("array", array=arr), 8, 1, 1, None) == 400  # destroyed


def test_texture_memory_must_be_aligned(sim: SimBackend) -> None:
    ptr = sim.mem_alloc(4096)
    tex = TextureDesc()
    assert sim.texture_create(Resource(2, ptr=ptr, size=256, desc=INT1), tex, None) == 1
    assert _code(sim.texture_create, Resource(2, ptr=ptr + 4, size=256, desc=INT1), tex,
                 None) == CUDA_ERROR_INVALID_VALUE
    assert _code(sim.texture_create, Resource(3, ptr=ptr, width=8, height=4, pitch=48, desc=INT1),
                 tex, None) == CUDA_ERROR_INVALID_VALUE  # pitch not a multiple of 32
    assert sim.texture_create(Resource(3, ptr=ptr, width=8, height=4, pitch=64, desc=INT1), tex,
                              None) == 2
    assert _code(sim.texture_destroy, 3) == CUDA_ERROR_INVALID_VALUE
    sim.texture_destroy(2)
    assert _code(sim.texture_destroy, 2) == CUDA_ERROR_INVALID_VALUE


def _image(width: int, height: int, modes: tuple[int, ...], normalized: bool) -> SimImage:
    data = bytearray(struct.pack(f"<{width * height}i", *range(width * height)))
    return SimImage(memoryview(data), width, height, 1, width * 4, 1, 32, 0, modes,
                    normalized=normalized)


@pytest.mark.parametrize(("mode", "xs", "want"), [
    (CLAMP, (-3.5, 0.5, 3.99, 4.0, 9.0), (0, 0, 3, 3, 3)),
    (BORDER, (-0.5, 0.5, 3.5, 4.0), (0, 0, 3, 0)),
])
def test_unnormalized_point_sampling(mode: int, xs: tuple[float, ...], want: tuple[int, ...]) -> None:
    """Texel floor(x) of a row holding 0 1 2 3; outside it the edge texel or the border's 0."""
    img = _image(4, 1, (mode, mode, mode), normalized=False)
    assert tuple(img.fetch(x, 0.5)[0] for x in xs) == want


@pytest.mark.parametrize(("mode", "xs", "want"), [
    (WRAP, (0.125, 1.125, -0.125, 2.875), (0, 0, 3, 3)),
    (MIRROR, (0.125, 1.125, 1.875, -0.125, 2.125), (0, 3, 0, 0, 0)),
    (CLAMP, (-1.0, 0.375, 5.0), (0, 1, 3)),
])
def test_normalized_point_sampling(mode: int, xs: tuple[float, ...], want: tuple[int, ...]) -> None:
    img = _image(4, 1, (mode, mode, mode), normalized=True)
    assert tuple(img.fetch(x, 0.5)[0] for x in xs) == want


def test_linear_fetch_and_surface_writes() -> None:
    img = _image(4, 2, (CLAMP,) * 3, normalized=False)
    assert [img.fetch_index(i)[0] for i in (-1, 0, 3, 4)] == [0, 0, 3, 0]
    img.write((99,), 4, 1)
    assert img.element(1, 1) == (99,)
    for x, y in ((2, 0), (16, 0), (0, 2), (-4, 0)):
        assert _code(img.write, (1,), x, y) == CUDA_ERROR_ILLEGAL_ADDRESS
