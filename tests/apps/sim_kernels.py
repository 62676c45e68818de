"""Sim-backend emulations of every kernel in tests/apps/*.cu.

Loaded by `pilotd --backend sim --sim-kernels tests/apps/sim_kernels.py`. Each function
computes exactly what its CUDA kernel computes for the launch shape it is given (threads
past gridDim*blockDim do nothing; bounds checks as in the kernel), with float32 math done in
numpy float32, one rounding per operation, as the kernels do (they use no FMA-contractible
expressions, or spell the roundings out with __fmul_rn/__fadd_rn).

Parameter layouts (offset, size), as the fatbins' .nv.info report them for sm_75 builds:
  vadd            (0,8) (8,8) (16,8) (24,4)
  args_kernel     (0,24) (24,1) (26,2) (32,8) (40,4) (48,8) (56,8) (64,8)
  big_kernel      (0,4) (8,104) (112,1) (120,8) (128,8)
  noargs_kernel   none
  produce         (0,8) (8,4)
  consume         (0,8) (8,8) (16,4)
  touch           (0,8) (8,4)
  axpy12          (0,8) (8,8) (16,4) (20,4)
  pinned_fill     (0,8) (8,4) (12,4)
  pinned_scale    (0,8) (8,4) (12,4)
  fp_mixed        (0,8) (8,8) (16,8) (24,4)
  fp_struct       (0,24)
  fp_none         (0,4) (4,4)
"""

from __future__ import annotations

import struct

import numpy as np

from pilot.daemon.sim_kernels import SimLaunch, blockwise, sim_kernel

F32 = np.float32


def _threads_x(k: SimLaunch) -> int:
    """Distinct values of blockIdx.x * blockDim.x + threadIdx.x in this launch."""
    return k.grid[0] * k.block[0]


def _one_per_element(k: SimLaunch, n: int) -> int:
    """Elements written by `i = blockIdx.x*blockDim.x + threadIdx.x; if (i < n)`: a prefix."""
    return max(0, min(n, _threads_x(k)))


def _wrap_i32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def _f32_array(k: SimLaunch, addr: int, count: int) -> np.ndarray:
    """Zero-copy float32 view of `count` elements of device memory at `addr`."""
    return np.frombuffer(k.view(addr, 4 * count), dtype=np.float32)


# ---- vector_add.cu ----

@sim_kernel("_Z4vaddPKfS0_Pfi")
@blockwise
def vadd(k: SimLaunch) -> None:
    """c[i] = a[i] + b[i] for i < n covered by the grid; of the logical blocks run only (a
    preemptible variant runs part of the grid at a time)."""
    a, b, c, n = k.ptr(0), k.ptr(1), k.ptr(2), k.i32(3)
    count = _one_per_element(k, n)
    if count == 0:
        return
    x, y, out = _f32_array(k, a, count), _f32_array(k, b, count), _f32_array(k, c, count)
    blocks = k.logical_blocks()
    if isinstance(blocks, range) and blocks.start == 0 and blocks.step == 1:  # a prefix
        end = min(count, blocks.stop * k.block[0] * k.block[1] * k.block[2])
        np.add(x[:end], y[:end], out=out[:end])
        return
    threads = k.block[0] * k.block[1] * k.block[2]
    for index in blocks:
        lo, hi = index * threads, min(count, (index + 1) * threads)
        if lo < hi:
            np.add(x[lo:hi], y[lo:hi], out=out[lo:hi])


# ---- kernel_args.cu ----

# struct S {int a; double b; char c[3];}: 24 bytes
_S = struct.Struct("<i4xd3b5x")
# struct Out, fields s_a .. sum_small (bytes 0-99; the trailing pad int is not written)
_OUT = struct.Struct("<i3idiidffQQQddqi")
assert _S.size == 24 and _OUT.size == 100
_U64 = 2**64 - 1
# struct Big fields as (offset, size): tag, d0, s[3], i0, name[13], u, f[5], tail, d1, last[3]
_BIG_FIELDS = (
    (0, 1), (8, 8), (16, 6), (24, 4), (28, 13), (48, 8), (56, 20), (76, 1), (80, 8), (88, 12),
)


@sim_kernel("_Z11args_kernel1ScsdfyPKiP3Out")
def args_kernel(k: SimLaunch) -> None:
    """Thread (0,0) writes every parameter and some derived values into *out."""
    s_a, s_b, s_c0, s_c1, s_c2 = _S.unpack(k.params[0])
    ch, sh, d, f = k.i8(1), k.i16(2), k.f64(3), k.f32(4)
    (u,) = k.arg(5, "<Q")
    in_ptr, out_ptr = k.ptr(6), k.ptr(7)
    if _threads_x(k) == 0:
        return
    in0, in1, in2 = struct.unpack("<3i", k.read(in_ptr, 12))
    f32 = F32(f)
    k.write(out_ptr, _OUT.pack(
        s_a, s_c0, s_c1, s_c2,
        s_b,
        ch,
        sh,
        d,
        f,
        float(f32 * F32(1.5)),
        u,
        (u ^ 0xFFFFFFFF00000000) & _U64,
        u >> 7,
        s_b + d,
        d * float(f32),
        in0 + in1 + in2,
        _wrap_i32(s_a + ch + sh),
    ))


@sim_kernel("_Z10big_kerneli3BigcPS_Px")
def big_kernel(k: SimLaunch) -> None:
    """Thread (0,0) copies every field of the 104-byte struct and sums some scalars."""
    before = k.i32(0)
    big = k.params[1]
    after = k.i8(2)
    out_ptr, extra_ptr = k.ptr(3), k.ptr(4)
    if _threads_x(k) == 0:
        return
    for offset, size in _BIG_FIELDS:
        k.write(out_ptr + offset, big[offset:offset + size])
    (i0,) = struct.unpack_from("<i", big, 24)
    last = struct.unpack_from("<3i", big, 88)
    k.write(extra_ptr, struct.pack("<3q", before, after, sum(last) + i0 + before + after))


@sim_kernel("_Z13noargs_kernelv")
def noargs_kernel(k: SimLaunch) -> None:
    """An empty kernel."""


@sim_kernel("_Z14never_launchedPi")
def never_launched(k: SimLaunch) -> None:
    """preload.cu's kernel that is only resolved ahead, never launched: *p = 1 (every thread)."""
    if k.grid[0] * k.block[0] > 0:
        k.write(k.ptr(0), struct.pack("<i", 1))


# ---- streams_events.cu ----

@sim_kernel("_Z7producePfi")
def produce(k: SimLaunch) -> None:
    """x[i] = __fadd_rn(__fmul_rn((float)i, 0.1f), 1.0f) for i < n covered by the grid."""
    x, n = k.ptr(0), k.i32(1)
    count = _one_per_element(k, n)
    if count == 0:
        return
    out = _f32_array(k, x, count)
    np.multiply(np.arange(count, dtype=np.float32), F32(0.1), out=out)
    np.add(out, F32(1.0), out=out)


@sim_kernel("_Z7consumePKfPfi")
def consume(k: SimLaunch) -> None:
    """Grid-stride loop: y[i] = __fsub_rn(__fmul_rn(x[i], 3.3f), 0.7f) for every i < n."""
    x, y, n = k.ptr(0), k.ptr(1), k.i32(2)
    if n <= 0 or _threads_x(k) == 0:
        return
    out = _f32_array(k, y, n)
    np.multiply(_f32_array(k, x, n), F32(3.3), out=out)
    np.subtract(out, F32(0.7), out=out)


# ---- errors.cu ----

@sim_kernel("_Z7boundedPi")
def bounded(k: SimLaunch) -> None:
    """p[blockIdx.x * blockDim.x + threadIdx.x] = threadIdx.x over the whole grid."""
    p = k.ptr(0)
    per_block, blocks = k.block[0] * k.block[1] * k.block[2], k.grid[0] * k.grid[1] * k.grid[2]
    out = np.frombuffer(k.view(p, 4 * per_block * blocks), dtype=np.int32)
    out[:] = np.tile(np.arange(k.block[0], dtype=np.int32), blocks * k.block[1] * k.block[2])

@sim_kernel("_Z5touchPii")
def touch(k: SimLaunch) -> None:
    """p[i] = 3 * i + 1 for i < n covered by the grid."""
    p, n = k.ptr(0), k.i32(1)
    count = _one_per_element(k, n)
    if count == 0:
        return
    out = np.frombuffer(k.view(p, 4 * count), dtype=np.int32)
    np.multiply(np.arange(count, dtype=np.int32), np.int32(3), out=out)
    np.add(out, np.int32(1), out=out)


# ---- threads.cu ----

@sim_kernel("_Z9scale_addPiiii")
def scale_add(k: SimLaunch) -> None:
    """v[i] = v[i] * mul + add for i < n covered by the grid (int32 wrap-around, as on the GPU)."""
    v, n, mul, add = k.ptr(0), k.i32(1), k.i32(2), k.i32(3)
    count = _one_per_element(k, n)
    if count == 0:
        return
    out = np.frombuffer(k.view(v, 4 * count), dtype=np.int32)
    np.multiply(out, np.int32(mul), out=out)
    np.add(out, np.int32(add), out=out)


# ---- symbols.cu ----
# Module variables are reached by their ELF names through k.symbol(): coeffs (__constant__
# float[16]), counter, initialized, hidden (static), _ZN2ns5valueE (ns::value), big (50000 u32).

_BIG_N = 50000


@sim_kernel("_Z4polyPKfPfi")
def poly(k: SimLaunch) -> None:
    """y[i] = Horner's rule over the __constant__ coeffs[15..0] with __fmul_rn/__fadd_rn, for
    i < n covered by the grid."""
    x, y, n = k.ptr(0), k.ptr(1), k.i32(2)
    count = _one_per_element(k, n)
    if count == 0:
        return
    coeffs = np.frombuffer(k.read(k.symbol("coeffs"), 64), dtype=np.float32)
    xs = _f32_array(k, x, count).copy()
    acc = np.zeros(count, dtype=np.float32)
    for j in range(15, -1, -1):
        acc = np.multiply(acc, xs)
        acc = np.add(acc, coeffs[j])
    _f32_array(k, y, count)[:] = acc


@sim_kernel("_Z15count_multiplesii")
def count_multiples(k: SimLaunch) -> None:
    """atomicAdd(&counter, 1) for every i < n covered by the grid with i % m == 0."""
    n, m = k.i32(0), k.i32(1)
    count = _one_per_element(k, n)
    if count == 0:
        return
    if m == 0:
        raise ZeroDivisionError("i % 0 in count_multiples")
    view = k.view(k.symbol("counter"), 4)
    (value,) = struct.unpack("<i", view)
    struct.pack_into("<i", view, 0, _wrap_i32(value + len(range(0, count, abs(m)))))


@sim_kernel("_Z11update_varsiPi")
def update_vars(k: SimLaunch) -> None:
    """Thread (0,0): out = {initialized, hidden}; initialized += add; hidden = hidden*2 + add;
    ns::value = __dadd_rn(__dmul_rn(ns::value, 1.5), add)."""
    add, out = k.i32(0), k.ptr(1)
    initialized = k.view(k.symbol("initialized"), 4)
    hidden = k.view(k.symbol("hidden"), 4)
    value = k.view(k.symbol("_ZN2ns5valueE"), 8)
    (i,), (h,), (v,) = (struct.unpack("<i", initialized), struct.unpack("<i", hidden),
                        struct.unpack("<d", value))
    k.write(out, struct.pack("<2i", i, h))
    struct.pack_into("<i", initialized, 0, _wrap_i32(i + add))
    struct.pack_into("<i", hidden, 0, _wrap_i32(h * 2 + add))
    struct.pack_into("<d", value, 0, v * 1.5 + add)  # Python floats: one rounding per operation


@sim_kernel("_Z10big_updatev")
def big_update(k: SimLaunch) -> None:
    """Grid-stride loop over all of big: big[i] = big[i] * 3 + i (uint32 wrap-around)."""
    big = np.frombuffer(k.view(k.symbol("big"), 4 * _BIG_N), dtype=np.uint32)
    big *= np.uint32(3)
    big += np.arange(_BIG_N, dtype=np.uint32)


# ---- runtime_misc.cu ----

@sim_kernel("_Z5tiledPf")
def tiled(k: SimLaunch) -> None:
    """One block of up to 128 threads: x[i] = old x[127 - i] for i < blockDim.x (every block
    does the same, so one pass suffices). Reads stay inside x[0..127]."""
    threads = k.block[0]
    if k.grid[0] * threads == 0:
        return
    x = _f32_array(k, k.ptr(0), 128)
    old = x.copy()
    x[:threads] = old[127 - np.arange(threads)]


@sim_kernel("_Z5plainPfi")
def plain(k: SimLaunch) -> None:
    """x[i] += 1 for i < n covered by the grid."""
    count = _one_per_element(k, k.i32(1))
    if count:
        x = _f32_array(k, k.ptr(0), count)
        np.add(x, F32(1.0), out=x)


@sim_kernel("_Z11dyn_reversePii")
def dyn_reverse(k: SimLaunch) -> None:
    """One block: x[i] = old x[n - 1 - i] for i < n (through dynamic shared memory)."""
    x, n = k.ptr(0), k.i32(1)
    if n <= 0 or k.grid[0] * k.block[0] == 0:
        return
    if 4 * n > k.shared_bytes:  # the kernel would overrun its shared memory
        raise ValueError(f"dyn_reverse: {n} ints in {k.shared_bytes} bytes of shared memory")
    view = np.frombuffer(k.view(x, 4 * n), dtype=np.int32)
    view[:] = view[::-1].copy()


@sim_kernel("_Z7add_rowPhmii")
def add_row(k: SimLaunch) -> None:
    """p[r * pitch + c] += r (mod 256) for c < width covered by grid.x * block.x, r < height
    covered by grid.y."""
    p, pitch, width, height = k.ptr(0), k.arg(1, "<Q")[0], k.i32(2), k.i32(3)
    cols = max(0, min(width, k.grid[0] * k.block[0]))
    rows = max(0, min(height, k.grid[1]))
    for r in range(rows):
        if cols:
            row = np.frombuffer(k.view(p + r * pitch, cols), dtype=np.uint8)
            np.add(row, np.uint8(r & 0xFF), out=row)


# ---- managed.cu ----

def _i32_array(k: SimLaunch, addr: int, count: int) -> np.ndarray:
    return np.frombuffer(k.view(addr, 4 * count), dtype=np.int32)


@sim_kernel("_Z8um_scalePfif")
def um_scale(k: SimLaunch) -> None:
    """x[i] = __fadd_rn(__fmul_rn(x[i], a), 1) for i < n covered by the grid."""
    x, n, a = k.ptr(0), k.i32(1), F32(k.f32(2))
    count = _one_per_element(k, n)
    if count:
        v = _f32_array(k, x, count)
        np.add(np.multiply(v, a, dtype=F32), F32(1.0), out=v)


@sim_kernel("_Z7um_pair4Pairi")
def um_pair(k: SimLaunch) -> None:
    """p.out[i] = p.in[i] * 2 (int32 wrap) for i < n covered by the grid."""
    src, dst = struct.unpack("<QQ", k.params[0])
    count = _one_per_element(k, k.i32(1))
    if count:
        values = _i32_array(k, src, count) * np.int32(2)
        _i32_array(k, dst, count)[:] = values


@sim_kernel("_Z9um_gatherPPiii")
def um_gather(k: SimLaunch) -> None:
    """ptrs[j][i] += j + 1 for every j < nptrs, i < n covered by the grid (in order of j)."""
    ptrs, nptrs, n = k.ptr(0), k.i32(1), k.i32(2)
    count = _one_per_element(k, n)
    if count and nptrs > 0:
        for j, (target,) in enumerate(struct.iter_unpack("<Q", k.read(ptrs, 8 * nptrs))):
            _i32_array(k, target, count)[:] += np.int32(j + 1)


@sim_kernel("_Z10um_counterv")
def um_counter(k: SimLaunch) -> None:
    """counter += 1 (thread 0 of each block); marr[t] += t for each thread t < blockDim.x."""
    if k.grid[0] * k.block[0] == 0:
        return
    counter = k.view(k.symbol("counter"), 4)
    (c,) = struct.unpack("<i", counter)
    struct.pack_into("<i", counter, 0, _wrap_i32(c + k.grid[0]))
    threads = min(k.block[0], 64)
    marr = _i32_array(k, k.symbol("marr"), 64)
    marr[:threads] += np.arange(threads, dtype=np.int32) * np.int32(k.grid[0])


@sim_kernel("_Z7um_fillPiii")
def um_fill(k: SimLaunch) -> None:
    """x[i] = v + i for i < n covered by the grid."""
    x, n, v = k.ptr(0), k.i32(1), k.i32(2)
    count = _one_per_element(k, n)
    if count:
        _i32_array(k, x, count)[:] = (np.arange(count, dtype=np.int64) + v).astype(np.int32)


# ---- cuda12.cu (built with the CUDA 12 runtime headers) ----

@sim_kernel("_Z6axpy12PiPKiii")
def axpy12(k: SimLaunch) -> None:
    """y[i] = a * x[i] + y[i] for i < n covered by the grid (int32 wrap-around)."""
    y, x, a, n = k.ptr(0), k.ptr(1), k.i32(2), k.i32(3)
    count = _one_per_element(k, n)
    if count == 0:
        return
    out = np.frombuffer(k.view(y, 4 * count), dtype=np.int32)
    xs = np.frombuffer(k.view(x, 4 * count), dtype=np.int32)
    np.add(np.multiply(xs, np.int32(a)), out, out=out)


# ---- pinned.cu (the pointers may be mapped host memory) ----

def _u32_array(k: SimLaunch, addr: int, count: int) -> np.ndarray:
    return np.frombuffer(k.view(addr, 4 * count), dtype=np.uint32)


@sim_kernel("_Z11pinned_fillPjjj")
def pinned_fill(k: SimLaunch) -> None:
    """p[i] = seed + 3i (uint32 wrap-around) for i < n covered by the grid."""
    p, n, seed = k.ptr(0), k.u32(1), k.u32(2)
    count = _one_per_element(k, n)
    if count:
        values = (np.arange(count, dtype=np.uint64) * 3 + seed) & 0xFFFFFFFF
        _u32_array(k, p, count)[:] = values.astype(np.uint32)


@sim_kernel("_Z12pinned_scalePjjj")
def pinned_scale(k: SimLaunch) -> None:
    """p[i] *= k (uint32 wrap-around) for i < n covered by the grid."""
    p, n, factor = k.ptr(0), k.u32(1), k.u32(2)
    count = _one_per_element(k, n)
    if count:
        out = _u32_array(k, p, count)
        np.multiply(out, np.uint32(factor), out=out)


# ---- footprint.cu (the pointers may be managed or mapped host memory) ----

@sim_kernel("_Z8fp_mixedPiPfPci")
def fp_mixed(k: SimLaunch) -> None:
    """dev[i] = dev[i] * 3 + i (int32 wrap-around), managed[i] *= 2 (float32), pinned[i] += 1
    (char wrap-around), for i < n covered by the grid."""
    dev, managed, pinned, n = k.ptr(0), k.ptr(1), k.ptr(2), k.i32(3)
    count = _one_per_element(k, n)
    if count == 0:
        return
    d = _i32_array(k, dev, count)
    d[:] = d * np.int32(3) + np.arange(count, dtype=np.int32)
    m = _f32_array(k, managed, count)
    np.multiply(m, F32(2.0), out=m)
    p = np.frombuffer(k.view(pinned, count), dtype=np.int8)
    p += np.int8(1)


# struct Pair {int *a; int n; double *b;}: 24 bytes
_PAIR = struct.Struct("<Qi4xQ")


@sim_kernel("_Z9fp_struct4Pair")
def fp_struct(k: SimLaunch) -> None:
    """p.b[i] = p.a[i] * 0.5 (float64) for i < p.n covered by the grid."""
    a, n, b = _PAIR.unpack(k.params[0])
    count = _one_per_element(k, n)
    if count == 0:
        return
    out = np.frombuffer(k.view(b, 8 * count), dtype=np.float64)
    np.multiply(_i32_array(k, a, count), 0.5, out=out)


@sim_kernel("_Z7fp_noneii")
def fp_none(k: SimLaunch) -> None:
    """Thread (0,0): g_product = a * b + 7 (int32 wrap-around)."""
    a, b = k.i32(0), k.i32(1)
    if _threads_x(k) == 0:
        return
    struct.pack_into("<i", k.symbol_view("g_product"), 0, _wrap_i32(a * b + 7))


# ---- fault.cu ----

@sim_kernel("_Z4pokePix")
def poke(k: SimLaunch) -> None:
    """p[offset] = 1: far outside every allocation, cudaErrorIllegalAddress (k.write refuses it,
    which faults the simulated context as the kernel faults the GPU's)."""
    (offset,) = k.arg(1, "<q")
    k.write(k.ptr(0) + 4 * offset, struct.pack("<i", 1))


@sim_kernel("_Z7add_onePii")
def add_one(k: SimLaunch) -> None:
    n = min(k.i32(1), _threads_x(k))
    if n > 0:
        view = np.frombuffer(k.view(k.ptr(0), 4 * n), dtype=np.int32)
        view += 1


@sim_kernel("_Z11spin_kernelx")
def spin_kernel(k: SimLaunch) -> None:
    """Spins on the GPU for a number of clock cycles: nothing to compute."""


# ---- mempool.cu ----

@sim_kernel("_Z9fill_intsPiii")
def fill_ints(k: SimLaunch) -> None:
    """p[i] = v + i for i < n covered by the grid."""
    n = min(k.i32(1), _threads_x(k))
    if n > 0:
        view = np.frombuffer(k.view(k.ptr(0), 4 * n), dtype=np.int32)
        view[:] = k.i32(2) + np.arange(n, dtype=np.int32)


# ---- driver_kernels.cu (loaded through the driver API by driver_api.cu) ----

@sim_kernel("drv_scale")
def drv_scale(k: SimLaunch) -> None:
    """x[i] = x[i] * a for i < n covered by the grid."""
    x, a, n = k.ptr(0), F32(k.arg(1, "<f")[0]), k.i32(2)
    count = _one_per_element(k, n)
    if count:
        view = _f32_array(k, x, count)
        np.multiply(view, a, out=view)


@sim_kernel("drv_axpb")
def drv_axpb(k: SimLaunch) -> None:
    """y[i] = a * x[i] + b (int, wrapping) for i < n covered by the grid."""
    x, y, a, b, n = k.ptr(0), k.ptr(1), k.i32(2), k.i32(3), k.i32(4)
    count = _one_per_element(k, n)
    if count:
        xs = np.frombuffer(k.view(x, 4 * count), dtype=np.int32).astype(np.int64)
        out = np.frombuffer(k.view(y, 4 * count), dtype=np.int32)
        out[:] = ((a * xs + b + 2**31) % 2**32 - 2**31).astype(np.int32)


@sim_kernel("drv_pair")
def drv_pair(k: SimLaunch) -> None:
    """out[0] = p.a * 1000 + (long long)p.b * 10 + c (struct Pair {int a; double b;})."""
    a, b = k.arg(0, "<i4xd")
    c = k.arg(1, "<b")[0]
    out = k.ptr(2)
    k.view(out, 8)[:] = struct.pack("<q", a * 1000 + int(b) * 10 + c)


# ---- linker.cu (its PTX linked by cuLink*) ----

@sim_kernel("link_scale")
def link_scale(k: SimLaunch) -> None:
    """v[i] = link_twice(v[i]) + 1 = 2 v[i] + 1 (two roundings) for i < n covered by the grid."""
    v, n = k.ptr(0), k.i32(1)
    count = _one_per_element(k, n)
    if count:
        view = _f32_array(k, v, count)
        np.add(np.multiply(view, F32(2.0)), F32(1.0), out=view)


@sim_kernel("drv_bump")
def drv_bump(k: SimLaunch) -> None:
    """counter += n (the module's __device__ int)."""
    view = k.symbol_view("counter")
    view[:] = struct.pack("<i", _wrap_i32(struct.unpack("<i", view)[0] + k.i32(0)))


# ---- device_printf.cu: what each kernel's printf calls print, in the GPU's order ----

@sim_kernel("_Z12printf_greetif")
def printf_greet(k: SimLaunch) -> None:
    """Block 0, thread 0: one line with each conversion the kernel uses."""
    n, f = k.i32(0), k.arg(1, "<f")[0]
    k.printf(f"hello from the GPU: n={n} f={f:.3f} hex={0xbeef:x} s=text c=z %\n")


@sim_kernel("_Z12printf_turnsi")
def printf_turns(k: SimLaunch) -> None:
    """Every thread of the (one) block in turn."""
    threads = k.block[0] * k.block[1] * k.block[2]
    for i in range(threads):
        k.printf(f"thread {i} of {k.block[0]}, round {k.i32(0)}\n")


@sim_kernel("_Z11printf_fillPii")
def printf_fill(k: SimLaunch) -> None:
    """out[t] = v + t for the block's threads; thread 0 prints v."""
    out, v = k.ptr(0), k.i32(1)
    count = k.block[0]
    k.view(out, 4 * count)[:] = np.arange(v, v + count, dtype=np.int32).tobytes()
    k.printf(f"fill {v}\n")


# ---- small_managed.cu ----

def _table(k: SimLaunch, ptrs: int, n: int) -> list[int]:
    """The first n pointers of the pointer table at ptrs."""
    return [p for (p,) in struct.iter_unpack("<Q", k.read(ptrs, 8 * n))] if n > 0 else []


@sim_kernel("_Z11touch_tablePPhiii")
def touch_table(k: SimLaunch) -> None:
    """ptrs[i][b] += add (uint8 wrap) for b < size, i < n covered by the grid."""
    n, size, add = _one_per_element(k, k.i32(1)), k.i32(2), k.i32(3)
    for target in _table(k, k.ptr(0), n if size > 0 else 0):
        v = np.frombuffer(k.view(target, size), dtype=np.uint8)
        np.add(v, np.uint8(add & 0xFF), out=v)


@sim_kernel("_Z9sum_tablePPhiiPy")
def sum_table(k: SimLaunch) -> None:
    """*sum = the sum of every byte of every allocation (thread 0 of block 0)."""
    if _threads_x(k) == 0:
        return
    n, size = k.i32(1), k.i32(2)
    total = sum(sum(k.read(t, size)) for t in _table(k, k.ptr(0), n if size > 0 else 0))
    k.write(k.ptr(3), struct.pack("<Q", total))


# ---- rings.cu ----

@sim_kernel("_Z7add_onePyy")
def add_one_u64(k: SimLaunch) -> None:
    """Thread 0 of block 0: *counter += step."""
    counter, (step,) = k.ptr(0), k.arg(1, "<Q")
    if _threads_x(k) == 0:
        return
    (value,) = struct.unpack("<Q", k.read(counter, 8))
    k.write(counter, struct.pack("<Q", (value + step) & (2**64 - 1)))


# ---- words.cu ----

@sim_kernel("_Z4fillPjji")
def fill_u32(k: SimLaunch) -> None:
    """p[i] = value + i for i < n (one thread each)."""
    p, value, n = k.ptr(0), k.u32(1), k.i32(2)
    count = min(n, _threads_x(k))
    if count > 0:
        values = (np.arange(count, dtype=np.uint64) + value) & 0xFFFFFFFF
        k.write(p, values.astype("<u4").tobytes())
