"""What one host-to-device copy from pinned memory costs by destination (issue 14: a shadow
flush is such copies into managed memory, then a synchronization): a fresh managed range, one
prefetched to the GPU beforehand, one zeroed by cuMemsetD8Async beforehand, and device memory;
pieces of 256 KiB, 1 MiB and 2 MiB, each copy followed by cuStreamSynchronize, as pilotd's flush
does. Prints medians in microseconds.

    python3 bench/htod_managed.py          (on the GPU machine; needs cuda-bindings)
"""

from __future__ import annotations

import statistics
import time

from cuda.bindings import driver as cu

MIB = 1 << 20
ROUNDS = 30


def check(result: tuple) -> object:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(str(err))
    return rest[0] if len(rest) == 1 else rest


def main() -> None:
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    host = check(cu.cuMemHostAlloc(2 * MIB, 0))
    gpu = cu.CUmemLocation()
    gpu.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    gpu.id = 0
    for dest in ("managed fresh", "managed prefetched", "managed memset", "device"):
        for piece in (256 << 10, MIB, 2 * MIB):
            times = []
            for _ in range(ROUNDS):
                if dest == "device":
                    dst = check(cu.cuMemAlloc(2 * MIB))
                else:
                    dst = check(cu.cuMemAllocManaged(2 * MIB, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL))
                    if dest == "managed prefetched":
                        check(cu.cuMemPrefetchAsync(dst, 2 * MIB, gpu, 0, stream))
                    elif dest == "managed memset":
                        check(cu.cuMemsetD8Async(dst, 0, 2 * MIB, stream))
                    check(cu.cuStreamSynchronize(stream))
                t0 = time.perf_counter()
                for off in range(0, 2 * MIB, piece):
                    check(cu.cuMemcpyHtoDAsync(int(dst) + off, host + off, piece, stream))
                    check(cu.cuStreamSynchronize(stream))
                times.append((time.perf_counter() - t0) * 1e6)
                check(cu.cuMemFree(dst))
            print(f"{dest:20} piece {piece >> 10:5} KiB: 2 MiB in {statistics.median(times):8.1f} us "
                  f"({2 * MIB // piece} copies)")
    check(cu.cuMemFreeHost(host))


if __name__ == "__main__":
    main()
