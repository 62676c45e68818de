"""Where the sim backend keeps managed pages: per 2 MiB page and device, as an H100 with UVM would
(conservatively), and the resident bytes and peak it reports (SimBackend.managed_residency)."""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable
from typing import Any

import pytest

from pilot.daemon.backends.base import CUDA_ERROR_INVALID_DEVICE, BackendError
from pilot.daemon.backends.fatbin import kernels_in_image
from pilot.daemon.backends.sim import UM_PAGE, SimBackend
from pilot.daemon.sim_kernels import KernelRegistry, SimLaunch

MiB = 1 << 20
TOUCH = "_Z5touchPii"  # touch(int *p, int n)
PAIR = "_Z4pair3Two"  # pair(Two t): two pointers inside a struct
COUNT = "_Z5countx"  # count(long long n): a pointer-sized word that is no pointer
USE_VAR = "_Z7use_varv"
SOURCE = r"""
struct Two { float *a; int n; float *b; };
__managed__ int um_var[4];
__global__ void touch(int *p, int n) { p[0] = n; }
__global__ void pair(Two t) { t.a[0] = t.b[0]; }
__global__ void count(long long n) { }
__global__ void use_var() { um_var[0] = 1; }
int main() { return 0; }
"""
ADVISE_PREFERRED, UNSET_PREFERRED, ADVISE_ACCESSED_BY, UNSET_ACCESSED_BY = 3, 4, 5, 6
DEVICE, HOST = 1, 2  # cudaMemLocationType
ATTR_READ_MOSTLY, ATTR_PREFERRED, ATTR_ACCESSED_BY, ATTR_LAST_PREFETCH = 1, 2, 3, 4
ATTR_PREFERRED_TYPE, ATTR_PREFERRED_ID = 5, 6


@pytest.fixture(scope="module")
def image(compile_cuda) -> bytes:
    [img] = [i for i in compile_cuda(SOURCE) if kernels_in_image(i)]
    return img


@pytest.fixture()
def sim() -> SimBackend:
    reg = KernelRegistry()
    for name in (TOUCH, PAIR, COUNT, USE_VAR):
        reg.kernel(name)(_nothing)
    return SimBackend(reg, device_count=2, total_mem=2 << 30)


def _nothing(k: SimLaunch) -> None:
    """The kernels' work does not matter here, only what their arguments point into."""


Touch = Callable[..., None]


@pytest.fixture()
def module(sim: SimBackend, image: bytes) -> Any:
    return sim.module_load(image)


@pytest.fixture()
def touch(sim: SimBackend, module: Any) -> Touch:
    """touch(ptr, device=0): launches touch(ptr, 1) from a thread of `device`."""
    fn = sim.function_get(module, TOUCH)

    def launch(ptr: int, device: int = 0) -> None:
        sim.bind_thread(device)
        sim.launch(fn.handle, (1, 1, 1), (1, 1, 1), 0, None, struct.pack("<Qi", ptr, 1))

    return launch


def _resident(sim: SimBackend, device: int = 0) -> int:
    return sim.managed_residency(device)[0]


def _attr(sim: SimBackend, ptr: int, count: int, attribute: int, size: int = 4) -> list[int]:
    data = sim.mem_range_attribute(ptr, count, attribute, size)
    return [v for (v,) in struct.iter_unpack("<i", data)]


def test_managed_memory_starts_resident_nowhere(sim: SimBackend) -> None:
    sim.mem_alloc_managed(8 * MiB, 1)
    assert sim.managed_residency(0) == (0, 0) and sim.managed_residency(1) == (0, 0)
    with pytest.raises(BackendError) as exc:
        sim.managed_residency(2)
    assert exc.value.code == CUDA_ERROR_INVALID_DEVICE


def test_launch_makes_every_page_of_a_pointed_to_block_resident(sim: SimBackend, touch: Touch) -> None:
    size = 5 * MiB + 100  # a partial last page counts its real bytes
    m = sim.mem_alloc_managed(size, 1)
    other = sim.mem_alloc_managed(4 * MiB, 1)
    touch(m + 3 * MiB)  # anywhere inside the block
    assert sim.managed_residency(0) == (size, size)
    assert sim.managed_residency(1) == (0, 0)
    touch(m)  # already there
    assert _resident(sim) == size
    touch(sim.mem_alloc(4096))  # device memory is no managed memory
    touch(other + 4 * MiB)  # one past the end: not in the block
    assert _resident(sim) == size


def test_pointers_in_structs_count_and_other_words_do_not(sim: SimBackend, module: Any) -> None:
    a, b, c = (sim.mem_alloc_managed(2 * MiB, 1) for _ in range(3))
    pair = sim.function_get(module, PAIR)
    assert pair.params == [(0, 24)]
    sim.launch(pair.handle, (1, 1, 1), (1, 1, 1), 0, None, struct.pack("<QiiQ", a, 7, 0, b))
    assert _resident(sim) == 4 * MiB
    # An 8-byte integer that happens to hold an address counts, as in the daemon's footprint.
    count = sim.function_get(module, COUNT)
    sim.launch(count.handle, (1, 1, 1), (1, 1, 1), 0, None, struct.pack("<q", c + 8))
    assert _resident(sim) == 6 * MiB


def test_managed_variables_pointed_to(sim: SimBackend, module: Any, touch: Touch) -> None:
    address, size = sim.module_get_global(module, "um_var")
    assert size == 16
    use_var = sim.function_get(module, USE_VAR)
    sim.launch(use_var.handle, (1, 1, 1), (1, 1, 1), 0, None, b"")
    assert _resident(sim) == 0  # only blocks the arguments point into
    touch(address)
    assert _resident(sim) == 16
    sim.module_unload(module)
    assert sim.managed_residency(0) == (0, 16)


def test_prefetch_moves_whole_pages_of_sub_ranges(sim: SimBackend, touch: Touch) -> None:
    m = sim.mem_alloc_managed(8 * MiB, 1)
    sim.mem_prefetch(m + 1, 10, DEVICE, 0, 0, None)  # part of page 0 moves it all
    assert _resident(sim) == 2 * MiB
    sim.mem_prefetch(m + 2 * MiB - 1, 2, DEVICE, 0, 0, None)  # straddles pages 0 and 1
    assert _resident(sim) == 4 * MiB
    sim.mem_prefetch(m, 8 * MiB, DEVICE, 1, 0, None)
    assert sim.managed_residency(0) == (0, 4 * MiB)
    assert sim.managed_residency(1) == (8 * MiB, 8 * MiB)
    sim.mem_prefetch(m + 3 * MiB, MiB + 1, HOST, 0, 0, sim.stream_create(0, 0))  # pages 1, 2
    assert _resident(sim, 1) == 4 * MiB
    sim.mem_prefetch(m + 7 * MiB, 0, HOST, 0, 0, None)  # nothing
    assert _resident(sim, 1) == 4 * MiB
    sim.mem_prefetch(m, 8 * MiB, 3, 0, 0, None)  # a host NUMA node is the host too
    assert sim.managed_residency(1) == (0, 8 * MiB)
    touch(m)  # a touch brings them back
    assert _resident(sim) == 8 * MiB


def test_host_preferred_pages_accessed_by_the_device_stay_on_the_host(sim: SimBackend,
                                                                      touch: Touch) -> None:
    m = sim.mem_alloc_managed(8 * MiB, 1)
    sim.mem_advise(m, 4 * MiB, ADVISE_PREFERRED, HOST, 0)
    sim.mem_advise(m, 4 * MiB, ADVISE_ACCESSED_BY, DEVICE, 0)
    touch(m)
    assert _resident(sim) == 4 * MiB  # pages 2 and 3
    sim.memcpy_htod(m + MiB, bytes(4096), 4096, None)  # a write from the device's side
    sim.memset_d8(m, 1, 4 * MiB, None)
    assert _resident(sim) == 4 * MiB
    touch(m, device=1)  # device 1 has no accessed-by: the whole block moves there
    assert (_resident(sim, 0), _resident(sim, 1)) == (0, 8 * MiB)


def test_advice_must_cover_all_of_a_page_to_keep_it_on_the_host(sim: SimBackend, touch: Touch) -> None:
    m = sim.mem_alloc_managed(6 * MiB, 1)
    sim.mem_advise(m, 3 * MiB, ADVISE_PREFERRED, HOST, 0)  # page 1 only half advised
    sim.mem_advise(m, 6 * MiB, ADVISE_ACCESSED_BY, DEVICE, 0)
    touch(m)
    assert _resident(sim) == 4 * MiB  # pages 1 and 2: the driver would migrate page 1's tail


def test_host_preference_alone_or_access_by_another_device_moves_pages(sim: SimBackend,
                                                                         touch: Touch) -> None:
    a, b = sim.mem_alloc_managed(2 * MiB, 1), sim.mem_alloc_managed(2 * MiB, 1)
    for m in (a, b):
        sim.mem_advise(m, 2 * MiB, ADVISE_PREFERRED, HOST, 0)
    sim.mem_advise(b, 2 * MiB, ADVISE_ACCESSED_BY, DEVICE, 1)
    touch(a)
    touch(b)
    assert _resident(sim) == 4 * MiB


def test_copies_and_memsets_write_pages_to_the_device_and_reads_move_nothing(
        sim: SimBackend) -> None:
    src, dst = sim.mem_alloc_managed(4 * MiB, 1), sim.mem_alloc_managed(10 * MiB, 1)
    out = bytearray(MiB)
    sim.memcpy_dtoh(out, src, MiB, None)
    assert _resident(sim) == 0
    sim.memcpy_htod(src + MiB, bytes(2 * MiB), 2 * MiB, None)  # pages 0 and 1
    assert _resident(sim) == 4 * MiB
    sim.memcpy_dtod(dst + 9 * MiB, src + 3 * MiB, MiB, None)  # the source page stays put
    assert _resident(sim) == 6 * MiB
    sim.memset_d8(dst, 0, 1, None)
    assert _resident(sim) == 8 * MiB
    sim.memset_2d_d8(dst + 2 * MiB, 4 * MiB, 0, 16, 2, None)  # rows in pages 1 and 3, not 2
    assert _resident(sim) == 12 * MiB
    sim.memcpy_2d_dtod(src + 3 * MiB, 16, src, 16, 16, 1, None)  # page 1 of src: there already
    assert _resident(sim) == 12 * MiB
    sim.memcpy_2d_htod(dst + 4 * MiB, 0, bytes(16), 0, 16, 1, None)
    assert _resident(sim) == 14 * MiB
    sim.bind_thread(1)
    sim.memcpy_htod(dst, bytes(8), 8, None)  # page 0 to device 1
    assert (_resident(sim, 0), _resident(sim, 1)) == (12 * MiB, 2 * MiB)
    peer = sim.mem_alloc_managed(MiB, 1)  # allocated by device 1, as memcpy_peer wants it
    sim.bind_thread(0)
    sim.memcpy_peer(peer, 1, src, 0, 8, None)  # written by device 1
    assert (_resident(sim, 0), _resident(sim, 1)) == (12 * MiB, 3 * MiB)


def test_a_host_preference_set_later_leaves_resident_pages_where_they_are(
        sim: SimBackend, touch: Touch) -> None:
    m = sim.mem_alloc_managed(4 * MiB, 1)
    touch(m)
    sim.mem_advise(m, 4 * MiB, ADVISE_PREFERRED, HOST, 0)
    sim.mem_advise(m, 4 * MiB, ADVISE_ACCESSED_BY, DEVICE, 0)
    assert _resident(sim) == 4 * MiB
    touch(m)  # mapped where they are: they stay on the device
    assert _resident(sim) == 4 * MiB
    sim.mem_prefetch(m, 2 * MiB, HOST, 0, 0, None)
    touch(m)  # now the device reads page 0 on the host
    assert _resident(sim) == 2 * MiB
    sim.mem_prefetch(m, 4 * MiB, DEVICE, 0, 0, None)  # a prefetch moves them all the same
    assert _resident(sim) == 4 * MiB


def test_unset_advice_restores_migration(sim: SimBackend, touch: Touch) -> None:
    a, b = sim.mem_alloc_managed(2 * MiB, 1), sim.mem_alloc_managed(2 * MiB, 1)
    for m in (a, b):
        sim.mem_advise(m, 2 * MiB, ADVISE_PREFERRED, HOST, 0)
        sim.mem_advise(m, 2 * MiB, ADVISE_ACCESSED_BY, DEVICE, 0)
        touch(m)
    assert _resident(sim) == 0
    sim.mem_advise(a, 2 * MiB, UNSET_PREFERRED, DEVICE, 0)
    sim.mem_advise(b + 4096, 4096, UNSET_ACCESSED_BY, DEVICE, 0)  # one host page of b
    touch(a)
    touch(b)
    assert _resident(sim) == 4 * MiB


def test_peak_and_free(sim: SimBackend, touch: Touch) -> None:
    a, b = sim.mem_alloc_managed(4 * MiB, 1), sim.mem_alloc_managed(6 * MiB, 1)
    touch(a)
    touch(b)
    assert sim.managed_residency(0) == (10 * MiB, 10 * MiB)
    sim.mem_prefetch(b, 6 * MiB, HOST, 0, 0, None)
    assert sim.managed_residency(0) == (4 * MiB, 10 * MiB)
    sim.mem_free(a)
    assert sim.managed_residency(0) == (0, 10 * MiB)
    sim.mem_free(b)  # on the host: nothing to drop
    c = sim.mem_alloc_managed(12 * MiB, 1)
    touch(c)
    assert sim.managed_residency(0) == (12 * MiB, 12 * MiB)
    sim.bind_thread(1)
    sim.mem_free(c)  # from another device's thread too
    assert sim.managed_residency(0) == (0, 12 * MiB)


def test_devices_are_counted_separately(sim: SimBackend, touch: Touch) -> None:
    sim.bind_thread(0)
    m = sim.mem_alloc_managed(4 * MiB, 1)  # allocated from device 0
    touch(m, device=1)
    assert sim.managed_residency(0) == (0, 0) and sim.managed_residency(1) == (4 * MiB, 4 * MiB)
    sim.mem_prefetch(m, 2 * MiB, DEVICE, 0, 0, None)
    assert sim.managed_residency(0) == (2 * MiB, 2 * MiB)
    assert sim.managed_residency(1) == (2 * MiB, 4 * MiB)
    touch(m, device=0)
    assert sim.managed_residency(0) == (4 * MiB, 4 * MiB)
    assert sim.managed_residency(1) == (0, 4 * MiB)


def test_range_attributes_of_ranges_whose_pages_disagree(sim: SimBackend) -> None:
    m = sim.mem_alloc_managed(4 * MiB, 1)
    half = 2 * MiB
    sim.mem_advise(m, half, ADVISE_PREFERRED, HOST, 0)
    sim.mem_advise(m + 4096, 100, 1, DEVICE, 0)  # read mostly: the host page of [4096, 4196)
    sim.mem_advise(m, half, ADVISE_ACCESSED_BY, DEVICE, 1)
    sim.mem_advise(m, 4 * MiB, ADVISE_ACCESSED_BY, DEVICE, 0)
    assert _attr(sim, m, half, ATTR_PREFERRED) == [-1]
    assert _attr(sim, m + 100, 10, ATTR_PREFERRED) == [-1]
    assert _attr(sim, m + half, half, ATTR_PREFERRED) == [-2]
    assert _attr(sim, m, 4 * MiB, ATTR_PREFERRED) == [-2]  # mixed: cudaInvalidDeviceId
    assert _attr(sim, m, 4 * MiB, ATTR_PREFERRED_TYPE) == [0]
    assert _attr(sim, m, half, ATTR_PREFERRED_TYPE) == [HOST]
    assert _attr(sim, m, 4 * MiB, ATTR_ACCESSED_BY, 12) == [0, -2, -2]  # devices of every page
    assert _attr(sim, m, half, ATTR_ACCESSED_BY, 12) == [0, 1, -2]
    assert _attr(sim, m + 4096, 4096, ATTR_READ_MOSTLY) == [1]
    assert _attr(sim, m + 4095, 2, ATTR_READ_MOSTLY) == [0]
    assert _attr(sim, m + 8191, 1, ATTR_READ_MOSTLY) == [1]  # the advice covers its whole page
    assert _attr(sim, m, 4 * MiB, ATTR_LAST_PREFETCH) == [-2]
    sim.mem_prefetch(m + half, half, DEVICE, 1, 0, None)
    assert _attr(sim, m + half, 8, ATTR_LAST_PREFETCH) == [1]
    assert _attr(sim, m, 4 * MiB, ATTR_LAST_PREFETCH) == [-2]
    sim.mem_prefetch(m, half, DEVICE, 1, 0, None)
    assert _attr(sim, m, 4 * MiB, ATTR_LAST_PREFETCH) == [1]
    sim.mem_advise(m, 4 * MiB, UNSET_PREFERRED, DEVICE, 0)
    sim.mem_advise(m, 4 * MiB, 2, DEVICE, 0)
    assert _attr(sim, m, 4 * MiB, ATTR_PREFERRED) == [-2]
    assert _attr(sim, m, 4 * MiB, ATTR_PREFERRED_ID) == [0]
    assert _attr(sim, m, 4 * MiB, ATTR_READ_MOSTLY) == [0]
    sim.mem_advise(m, 4 * MiB, ADVISE_PREFERRED, DEVICE, 1)
    assert _attr(sim, m, 4 * MiB, ATTR_PREFERRED) == [1]
    assert sim._memory.block(m).managed.starts == [0, half]  # type: ignore[union-attr]


def test_residency_matches_a_page_model_under_random_operations(sim: SimBackend, touch: Touch) -> None:
    """Accounting check: the sim's counters against a plain per-page model."""
    rng = random.Random(7)
    model: dict[int, tuple[int, list[int | None]]] = {}  # base -> (size, device per page)
    peak = [0, 0]

    def resident(device: int) -> int:
        return sum(min(UM_PAGE, size - i * UM_PAGE)
                   for size, pages in model.values() for i, d in enumerate(pages) if d == device)

    for _ in range(300):
        op = rng.randrange(5)
        if op == 0 or not model:
            size = rng.randrange(1, 9 * MiB)
            model[sim.mem_alloc_managed(size, 1)] = (size, [None] * -(-size // UM_PAGE))
            continue
        base = rng.choice(list(model))
        size, pages = model[base]
        lo = rng.randrange(size)
        hi = rng.randrange(lo, size) + 1
        device = rng.randrange(2)
        if op == 1:
            touch(base + lo, device)
            pages[:] = [device] * len(pages)
        elif op == 2:
            target = rng.choice([0, 1, None])
            sim.mem_prefetch(base + lo, hi - lo, HOST if target is None else DEVICE, target or 0,
                             0, None)
            pages[lo // UM_PAGE:-(-hi // UM_PAGE)] = [target] * (-(-hi // UM_PAGE) - lo // UM_PAGE)
        elif op == 3:
            sim.bind_thread(device)
            sim.memset_d8(base + lo, 0, hi - lo, None)
            pages[lo // UM_PAGE:-(-hi // UM_PAGE)] = [device] * (-(-hi // UM_PAGE) - lo // UM_PAGE)
        else:
            sim.mem_free(base)
            del model[base]
        for d in (0, 1):
            peak[d] = max(peak[d], resident(d))
            assert sim.managed_residency(d) == (resident(d), peak[d])


def test_large_blocks_are_cheap(sim: SimBackend, touch: Touch) -> None:
    m = sim.mem_alloc_managed(1 << 30, 1)  # 512 pages
    for i in range(512):
        sim.mem_advise(m + i * 2 * MiB, 4096, ADVISE_PREFERRED, HOST, 0)  # many segments
    sim.mem_advise(m, 1 << 30, ADVISE_ACCESSED_BY, DEVICE, 0)
    for _ in range(20):
        touch(m)
        sim.mem_prefetch(m, 1 << 29, HOST, 0, 0, None)
    assert sim.managed_residency(0) == (1 << 29, 1 << 30)


def test_threads_of_two_devices(sim: SimBackend, touch: Touch) -> None:
    blocks = [[sim.mem_alloc_managed(3 * MiB, 1) for _ in range(4)] for _ in range(2)]
    touch(blocks[0][0])  # loads the module once

    def work(device: int) -> None:
        for _ in range(50):
            for m in blocks[device]:
                touch(m, device)
                sim.mem_prefetch(m, MiB, HOST, 0, 0, None)
        for m in blocks[device]:
            touch(m, device)

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sim.managed_residency(0)[0] == sim.managed_residency(1)[0] == 12 * MiB
