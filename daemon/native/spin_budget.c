/* The process's spin budget (see spin_budget.h). */
#include "spin_budget.h"

#include <stdatomic.h>

static atomic_int g_limit;    /* 0: no limit */
static atomic_int g_spinning; /* tokens taken */
static atomic_uint_fast64_t g_granted, g_refused;
static atomic_int g_endpoint = 1; /* the endpoints may spin for requests */

void pilot_spin_set_limit(int n)
{
    atomic_store_explicit(&g_limit, n > 0 ? n : 0, memory_order_relaxed);
}

int pilot_spin_limit(void)
{
    return atomic_load_explicit(&g_limit, memory_order_relaxed);
}

void pilot_spin_counts(uint64_t *granted, uint64_t *refused)
{
    *granted = atomic_load_explicit(&g_granted, memory_order_relaxed);
    *refused = atomic_load_explicit(&g_refused, memory_order_relaxed);
}

int pilot_spin_take(void)
{
    int limit = atomic_load_explicit(&g_limit, memory_order_relaxed);
    if (limit == 0)
        return PILOT_SPIN_FREE; /* every vGPU thread's idle turn: no shared cache line */
    int before = atomic_fetch_add_explicit(&g_spinning, 1, memory_order_relaxed);
    if (before >= limit) {
        atomic_fetch_sub_explicit(&g_spinning, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&g_refused, 1, memory_order_relaxed);
        return 0;
    }
    atomic_fetch_add_explicit(&g_granted, 1, memory_order_relaxed);
    return PILOT_SPIN_TOKEN;
}

void pilot_spin_give(int taken)
{
    if (taken == PILOT_SPIN_TOKEN)
        atomic_fetch_sub_explicit(&g_spinning, 1, memory_order_relaxed);
}

void pilot_spin_set_endpoint(int allowed)
{
    atomic_store_explicit(&g_endpoint, allowed != 0, memory_order_relaxed);
}

int pilot_spin_endpoint(void)
{
    return atomic_load_explicit(&g_endpoint, memory_order_relaxed);
}
