"""How long cuMemPrefetchAsync holds the calling thread, and whether other Python threads run
meanwhile (the capacity enforcer issues its evictions and prefetches from vGPU threads).

    python3 bench/prefetch_cost.py [--mib 1024] [--rounds 3]

Allocates managed memory with the driver API (cuda-python), fills it from the host, then times
each call (host wall time of the call itself) and the stream synchronize after it, for
host->device and device->host prefetches, while a second Python thread counts how often it got
to run. Prints one line per measurement. Uses --mib of GPU memory; never more than that.
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time

from cuda.bindings import driver as cu


def check(result: tuple) -> object:
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else rest


def location(kind: str, device: int) -> object:
    loc = cu.CUmemLocation()
    if kind == "host":
        loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
        loc.id = 0
    else:
        loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        loc.id = device
    return loc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    size = args.mib << 20
    ptr = int(check(cu.cuMemAllocManaged(size, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value)))
    stream = check(cu.cuStreamCreate(1))
    ctypes.memset(ptr, 1, size)  # every page on the host

    ticks = [0]
    stop = threading.Event()

    def counter() -> None:
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=counter, daemon=True)
    t.start()
    time.sleep(0.05)
    for r in range(args.rounds):
        for kind in ("device", "host"):
            t0, n0 = time.perf_counter(), ticks[0]
            check(cu.cuMemPrefetchAsync(ptr, size, location(kind, 0), 0, stream))
            t1, n1 = time.perf_counter(), ticks[0]
            check(cu.cuStreamSynchronize(stream))
            t2 = time.perf_counter()
            idle_t0, idle_n0 = time.perf_counter(), ticks[0]
            time.sleep(0.01)
            rate = (ticks[0] - idle_n0) / (time.perf_counter() - idle_t0)
            print(f"prefetch_cost round={r} to={kind} mib={args.mib} call_ms={(t1 - t0) * 1e3:.2f} "
                  f"sync_ms={(t2 - t1) * 1e3:.2f} other_thread_ticks_during_call={n1 - n0} "
                  f"(idle rate {rate * (t1 - t0):.0f} expected if the GIL were free)", flush=True)
    stop.set()
    check(cu.cuMemFree(ptr))


if __name__ == "__main__":
    main()
