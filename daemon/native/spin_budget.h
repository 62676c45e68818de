/* How many of pilotd's threads may busy-wait at once.
 *
 * Every vGPU thread serves one tenant and waits for two things: its clients' next request (the
 * endpoint, vgpu_server.c) and the GPU (a synchronization or a copy to the host, fast_launch.c).
 * Spinning through a short wait answers sooner than sleeping, but each spinner holds a core.
 * With many tenants the vGPU threads' spinning took the cores the tenants' own processes needed
 * (16 graph-inference tenants on the H100's 16 cores: pilotd used 6-7 cores, throughput 0.60x
 * MPS's), so spinning is a budget: a thread spins only while it holds one of `limit` tokens,
 * and otherwise goes straight to sleep (the endpoint on epoll and the rings' doorbells, a GPU
 * wait on a blocking-sync event). One budget per process: every vGPU thread of every GPU
 * draws on it. Lock-free; taking and giving a token are one atomic each.
 *
 * Compiled into pilot.shim._proto; the part between the CDEF markers is read by cffi. */
#ifndef PILOT_SPIN_BUDGET_H
#define PILOT_SPIN_BUDGET_H

#include <stdint.h>

/* PILOT_SPIN_CDEF_BEGIN */
/* At most n threads spin at once (n <= 0: no limit, the default). */
void pilot_spin_set_limit(int n);
int pilot_spin_limit(void);
/* Waits that were allowed to spin and waits that slept at once because the budget was spent,
 * since the process started. */
void pilot_spin_counts(uint64_t *granted, uint64_t *refused);
/* 1: the caller may spin, and gives the token back with pilot_spin_give when it stops; 0: it
 * must sleep instead. */
int pilot_spin_take(void);
void pilot_spin_give(void);
/* PILOT_SPIN_CDEF_END */

#endif
