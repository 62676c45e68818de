/* The session's device allocations, mirrored in the client: a sorted array of ranges.
 * It lets the shim infer cudaMemcpyDefault directions and reject out-of-range asynchronous
 * copies and memsets at the call, as CUDA does, without a round trip. The daemon still checks
 * every pointer itself: this table is a convenience, never the authority. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

struct range {
    uint64_t base, size;
};

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct range *g_ranges;
static size_t g_count, g_cap;

/* Index of the last range whose base <= ptr, or -1. */
static long find_le(uint64_t ptr)
{
    size_t lo = 0, hi = g_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_ranges[mid].base <= ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (long)lo - 1;
}

void pilot_alloc_add(uint64_t base, uint64_t size)
{
    pthread_rwlock_wrlock(&g_lock);
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
    g_count++;
    pthread_rwlock_unlock(&g_lock);
}

int pilot_alloc_remove(uint64_t base)
{
    int rc = -1;
    pthread_rwlock_wrlock(&g_lock);
    long i = find_le(base);
    if (i >= 0 && g_ranges[i].base == base) {
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

void pilot_alloc_clear(void)
{
    pthread_rwlock_wrlock(&g_lock);
    g_count = 0;
    pthread_rwlock_unlock(&g_lock);
}
