/* How many of pilotd's threads may busy-wait at once.
 *
 * Every vGPU thread serves its tenants and waits for two things: their next request (the
 * endpoint, vgpu_server.c) and the GPU (a synchronization or a copy to the host, fast_launch.c).
 * Spinning through a short wait answers sooner than sleeping, but each spinner holds a core. With
 * a limit (`[daemon] spinners`), spinning is a budget: a thread spins only while it holds one of
 * `limit` tokens, and otherwise goes straight to sleep (the endpoint on epoll and the rings'
 * doorbells, a GPU wait on a blocking-sync event). One budget per process: every vGPU thread of
 * every GPU draws on it. On the H100 a limit did not pay (16 graph-inference tenants on 16 cores:
 * a third less pilotd CPU, and less throughput, a wake-up per call costing more than the core it
 * freed; bench/RESULTS.md, tenth session), so there is none by default: it is for hosts with more
 * busy tenants than cores. Without a limit taking a token touches no shared state.
 *
 * Compiled into pilot.shim._proto; the part between the CDEF markers is read by cffi. */
#ifndef PILOT_SPIN_BUDGET_H
#define PILOT_SPIN_BUDGET_H

#include <stdint.h>

/* PILOT_SPIN_CDEF_BEGIN */
/* At most n threads spin at once (n <= 0: no limit, the default). */
void pilot_spin_set_limit(int n);
int pilot_spin_limit(void);
/* Waits that took a token and waits that slept at once because the budget was spent, since the
 * process started (without a limit nothing is counted: there is no budget). */
void pilot_spin_counts(uint64_t *granted, uint64_t *refused);
/* 0: the caller must sleep instead of spinning; else it may spin, and hands what it got back to
 * pilot_spin_give when it stops (PILOT_SPIN_TOKEN: a token of the budget; PILOT_SPIN_FREE: no
 * limit, nothing taken). */
#define PILOT_SPIN_TOKEN 1
#define PILOT_SPIN_FREE 2
int pilot_spin_take(void);
void pilot_spin_give(int taken);
/* Whether the endpoints (vgpu_server.c) spin for the next request before they sleep: on by
 * default; off while the host is crowded (daemon/vgpu/endpoint_spin.py), when a vGPU thread
 * that spins takes a core from a tenant's own thread, whose call it then waits for. */
void pilot_spin_set_endpoint(int allowed);
int pilot_spin_endpoint(void);
/* PILOT_SPIN_CDEF_END */

#endif
