/* The session's device allocations, mirrored in the client: a sorted array of ranges.
 * It lets the shim infer cudaMemcpyDefault directions and reject out-of-range asynchronous
 * copies and memsets at the call, as CUDA does, without a round trip. The daemon still checks
 * every pointer itself: this table is a convenience, never the authority.
 * Module globals (__device__/__constant__ variables, api_symbols.c) join the table once
 * resolved, flagged: copies and memsets may use them, cudaFree may not. Managed ranges
 * (allocations and __managed__ variables) are flagged managed: the host can also touch them.
 * Every device's memory is in one address space (unified addressing); each range records the
 * device it was allocated on (the route device of the call that added it), so that copies,
 * memsets and frees go to that device's part of the session. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "hooks.h"

struct range {
    uint64_t base, size;
    int flags; /* PILOT_ALLOC_SYMBOL, PILOT_ALLOC_MANAGED */
    int device;
};

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct range *g_ranges;
static size_t g_count, g_cap;

long pilot_find_le(const void *items, size_t count, size_t stride, uint64_t key)
{
    const unsigned char *p = items;
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint64_t base;
        memcpy(&base, p + mid * stride, sizeof base);
        if (base <= key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (long)lo - 1;
}

/* Index of the last range whose base <= ptr, or -1. */
static long find_le(uint64_t ptr)
{
    return pilot_find_le(g_ranges, g_count, sizeof *g_ranges, ptr);
}

static void add_range(uint64_t base, uint64_t size, int flags)
{
    int symbol = flags & PILOT_ALLOC_SYMBOL;
    pthread_rwlock_wrlock(&g_lock);
    long le = find_le(base);
    if (symbol && le >= 0 && (g_ranges[le].flags & PILOT_ALLOC_SYMBOL) && g_ranges[le].base == base) {
        g_ranges[le].flags |= flags;
        pthread_rwlock_unlock(&g_lock); /* already known */
        return;
    }
    if (g_count == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 64;
        struct range *nr = realloc(g_ranges, cap * sizeof *nr);
        if (!nr) {
            pthread_rwlock_unlock(&g_lock);
            return; /* the mirror is advisory; the daemon still validates */
        }
        g_ranges = nr;
        g_cap = cap;
    }
    size_t at = (size_t)(find_le(base) + 1);
    memmove(g_ranges + at + 1, g_ranges + at, (g_count - at) * sizeof *g_ranges);
    g_ranges[at].base = base;
    g_ranges[at].size = size;
    g_ranges[at].flags = flags;
    g_ranges[at].device = pilot_route_device();
    g_count++;
    pthread_rwlock_unlock(&g_lock);
}

void pilot_alloc_add(uint64_t base, uint64_t size)
{
    add_range(base, size, 0);
}

void pilot_alloc_add_symbol(uint64_t base, uint64_t size)
{
    add_range(base, size, PILOT_ALLOC_SYMBOL);
}

void pilot_alloc_add_flags(uint64_t base, uint64_t size, int flags)
{
    add_range(base, size, flags);
}

int pilot_alloc_remove(uint64_t base)
{
    int rc = -1;
    pthread_rwlock_wrlock(&g_lock);
    long i = find_le(base);
    if (i >= 0 && g_ranges[i].base == base && !(g_ranges[i].flags & PILOT_ALLOC_SYMBOL)) {
        memmove(g_ranges + i, g_ranges + i + 1, (g_count - (size_t)i - 1) * sizeof *g_ranges);
        g_count--;
        rc = 0;
    }
    pthread_rwlock_unlock(&g_lock);
    return rc;
}

int pilot_alloc_contains(uint64_t ptr, uint64_t count)
{
    int ok = 0;
    pthread_rwlock_rdlock(&g_lock);
    long i = find_le(ptr);
    if (i >= 0) {
        const struct range *r = &g_ranges[i];
        ok = ptr - r->base <= r->size && count <= r->size - (ptr - r->base);
        if (count == 0)
            ok = ptr - r->base < r->size || r->size == 0;
    }
    pthread_rwlock_unlock(&g_lock);
    return ok;
}

int pilot_alloc_is_device(uint64_t ptr)
{
    return pilot_alloc_contains(ptr, 1);
}

int pilot_alloc_flags(uint64_t ptr, uint64_t *base, uint64_t *size)
{
    int flags = -1;
    pthread_rwlock_rdlock(&g_lock);
    long i = find_le(ptr);
    if (i >= 0 && ptr - g_ranges[i].base < g_ranges[i].size) {
        flags = g_ranges[i].flags;
        if (base)
            *base = g_ranges[i].base;
        if (size)
            *size = g_ranges[i].size;
    }
    pthread_rwlock_unlock(&g_lock);
    return flags;
}

int pilot_alloc_device(uint64_t ptr)
{
    int device = -1;
    pthread_rwlock_rdlock(&g_lock);
    long i = find_le(ptr);
    if (i >= 0 && ptr - g_ranges[i].base < (g_ranges[i].size ? g_ranges[i].size : 1))
        device = g_ranges[i].device;
    pthread_rwlock_unlock(&g_lock);
    return device;
}

int pilot_alloc_owner(uint64_t ptr)
{
    int device = pilot_alloc_device(ptr);
    return device >= 0 ? device : pilot_current_device();
}

int pilot_alloc_is_symbol(uint64_t ptr)
{
    int flags = pilot_alloc_flags(ptr, NULL, NULL);
    return flags >= 0 && (flags & PILOT_ALLOC_SYMBOL);
}

int pilot_alloc_is_managed(uint64_t ptr)
{
    int flags = pilot_alloc_flags(ptr, NULL, NULL);
    return flags >= 0 && (flags & PILOT_ALLOC_MANAGED);
}

/* Keeps the ranges whose symbol flag is `symbol`, and those of other devices than `device`
 * (-1: every device). */
static void keep_only(int symbol, int device)
{
    pthread_rwlock_wrlock(&g_lock);
    size_t kept = 0;
    for (size_t i = 0; i < g_count; i++)
        if (!!(g_ranges[i].flags & PILOT_ALLOC_SYMBOL) == symbol ||
            (device >= 0 && g_ranges[i].device != device))
            g_ranges[kept++] = g_ranges[i];
    g_count = kept;
    pthread_rwlock_unlock(&g_lock);
}

static void fork_child(void)
{
    /* The child has one thread: a lock another thread of the parent held at fork stays held
     * for ever, so start from a fresh one. After fork the allocations are the parent's
     * session's (api_symbols.c's handler drops the symbol ranges). */
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_INITIALIZER;
    g_lock = fresh;
    keep_only(1, -1);
}

static void clear_device(int device)
{
    keep_only(1, device);
}

void pilot_alloc_clear_symbols(void)
{
    keep_only(0, -1);
}

PILOT_HOOK(alloc_table, .on_fork_child = fork_child,
           .on_device_reset = clear_device, .reset_rank = PILOT_RESET_ALLOCATIONS);
