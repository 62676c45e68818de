/* Small managed allocations, packed: a cudaMallocManaged of at most PILOT_UM_PACK_MAX bytes
 * (cudaMemAttachGlobal) is a piece of a 2 MiB managed range the session holds for its small
 * allocations only (PILOT_MANAGED_PACKED_RANGE: charged in full, never shared with another
 * session, so two tenants never have bytes on one page). Pieces start PILOT_UM_PACK_ALIGN
 * (512) bytes apart, as the H100's driver packs them, and are served here without a round trip
 * to pilotd; a range is asked for only when none of the session's has room.
 *
 * Each range is one managed allocation in pilotd and one shadow here (coherence.c), so the
 * coherence protocol, advice, prefetch, the capacity enforcer and the policies see whole
 * ranges; the alloc table (alloc_table.c) holds the range, flagged PILOT_ALLOC_PACKED, not its
 * pieces. A piece freed is free for the session's next small allocation (zeroed when handed out
 * again, as fresh managed memory reads); an empty range is returned to pilotd once another empty
 * one is held, so the slack a session is charged stays below one range plus the gaps between
 * its live pieces. cudaFree of an address that is not the start of a live piece is
 * cudaErrorInvalidValue, as natively. docs/ARCHITECTURE.md, "Small managed allocations". */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

#define UNITS (PILOT_UM_PACK_RANGE / PILOT_UM_PACK_ALIGN) /* 4096 units of 512 bytes */
#define WORDS (UNITS / 64)

struct pack_range {
    uint64_t base;
    int device;              /* the device whose part of the session holds it */
    uint32_t free_units;
    uint32_t high;           /* units at and above it were never handed out: they read zero */
    uint32_t cursor;         /* where the next search starts (after the last piece given) */
    uint32_t live;           /* pieces */
    uint64_t used[WORDS];    /* a bit per unit in use */
    uint16_t units[UNITS];   /* at a piece's first unit: its length in units; else 0 */
    uint16_t asked[UNITS];   /* at a piece's first unit: the bytes asked for, less one */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pack_range **g_ranges; /* sorted by base */
static size_t g_count, g_cap, g_next; /* g_next: the range tried first */
static size_t g_empty;                /* ranges without a live piece */
static uint64_t g_synced;             /* pilot_um_device_work() at the last free's synchronize */

static int unit_used(const struct pack_range *r, uint32_t i)
{
    return (int)(r->used[i / 64] >> (i % 64)) & 1;
}

static void mark(struct pack_range *r, uint32_t first, uint32_t n, int used)
{
    for (uint32_t i = first; i < first + n; i++) {
        uint64_t bit = 1ull << (i % 64);
        r->used[i / 64] = used ? r->used[i / 64] | bit : r->used[i / 64] & ~bit;
    }
}

/* The first unit of a run of n free units in [from, UNITS), or -1. */
static long find_run(const struct pack_range *r, uint32_t n, uint32_t from)
{
    uint32_t run = 0;
    for (uint32_t i = from; i < UNITS; i++) {
        if (i % 64 == 0 && r->used[i / 64] == ~0ull) { /* a whole word in use */
            run = 0;
            i += 63;
            continue;
        }
        if (unit_used(r, i))
            run = 0;
        else if (++run == n)
            return (long)(i + 1 - n);
    }
    return -1;
}

static long find_in(const struct pack_range *r, uint32_t n)
{
    if (r->free_units < n)
        return -1;
    long at = find_run(r, n, r->cursor);
    return at >= 0 || r->cursor == 0 ? at : find_run(r, n, 0);
}

static long index_of_locked(uint64_t base)
{
    size_t lo = 0, hi = g_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_ranges[mid]->base < base)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < g_count && g_ranges[lo]->base == base ? (long)lo : -1;
}

static int insert_locked(struct pack_range *r)
{
    if (g_count == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 16;
        struct pack_range **nr = realloc(g_ranges, cap * sizeof *nr);
        if (!nr)
            return -1;
        g_ranges = nr;
        g_cap = cap;
    }
    size_t at = 0;
    while (at < g_count && g_ranges[at]->base < r->base)
        at++;
    memmove(g_ranges + at + 1, g_ranges + at, (g_count - at) * sizeof *g_ranges);
    g_ranges[at] = r;
    g_count++;
    return (int)at;
}

static void remove_locked(size_t i)
{
    free(g_ranges[i]);
    memmove(g_ranges + i, g_ranges + i + 1, (g_count - i - 1) * sizeof *g_ranges);
    g_count--;
    if (g_next >= g_count)
        g_next = 0;
}

/* A new range from pilotd, shadowed and in the alloc table; NULL if none was given. */
static struct pack_range *new_range_locked(cudaError_t *err)
{
    struct pack_range *r = calloc(1, sizeof *r);
    if (!r) {
        *err = cudaErrorMemoryAllocation;
        return NULL;
    }
    *err = pilot_um_new_range(PILOT_UM_PACK_RANGE,
                              PILOT_MANAGED_ATTACH_GLOBAL | PILOT_MANAGED_PACKED_RANGE, &r->base);
    if (*err == cudaSuccess && insert_locked(r) < 0) {
        pilot_um_release_range(r->base, pilot_route_device());
        *err = cudaErrorMemoryAllocation;
    }
    if (*err) {
        free(r);
        return NULL;
    }
    r->device = pilot_route_device();
    r->free_units = UNITS;
    g_empty++;
    pilot_alloc_add_flags(r->base, PILOT_UM_PACK_RANGE, PILOT_ALLOC_MANAGED | PILOT_ALLOC_PACKED);
    return r;
}

static uint64_t take(struct pack_range *r, uint32_t at, uint32_t n, size_t size)
{
    mark(r, at, n, 1);
    r->units[at] = (uint16_t)n;
    r->asked[at] = (uint16_t)(size - 1);
    r->free_units -= n;
    r->cursor = at + n < UNITS ? at + n : 0;
    g_empty -= r->live++ == 0;
    uint64_t ptr = r->base + (uint64_t)at * PILOT_UM_PACK_ALIGN;
    if (at < r->high) /* bytes an earlier piece held: as fresh memory, zero */
        memset((void *)(uintptr_t)ptr, 0,
               (size_t)((at + n < r->high ? n : r->high - at)) * PILOT_UM_PACK_ALIGN);
    if (at + n > r->high)
        r->high = at + n;
    return ptr;
}

int pilot_um_pack_wanted(size_t size, unsigned int flags)
{
    return size > 0 && size <= PILOT_UM_PACK_MAX && flags == cudaMemAttachGlobal;
}

cudaError_t pilot_um_pack_alloc(size_t size, void **out)
{
    const uint32_t n = (uint32_t)((size + PILOT_UM_PACK_ALIGN - 1) / PILOT_UM_PACK_ALIGN);
    const int device = pilot_route_device();
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&g_lock);
    struct pack_range *r = NULL;
    long at = -1;
    for (size_t k = 0; k < g_count && at < 0; k++) {
        size_t i = (g_next + k) % g_count;
        if (g_ranges[i]->device == device && (at = find_in(g_ranges[i], n)) >= 0) {
            r = g_ranges[i];
            g_next = i;
        }
    }
    if (at < 0 && (r = new_range_locked(&err)) != NULL) {
        at = 0;
        g_next = (size_t)index_of_locked(r->base);
    }
    if (r)
        *out = (void *)(uintptr_t)take(r, (uint32_t)at, n, size);
    pthread_mutex_unlock(&g_lock);
    return err;
}

/* Waits for the device before a piece is freed, as cudaFree does natively, when device work
 * touching managed memory was sent since the last such wait (a free after a kernel, then more
 * frees: one round trip). */
static cudaError_t fence(int device)
{
    cudaError_t err = pilot_callbacks_fence_device(device);
    uint64_t work = pilot_um_device_work();
    if (err == cudaSuccess && work != __atomic_load_n(&g_synced, __ATOMIC_ACQUIRE)) {
        err = pilot_call_on(device, PILOT_OP_DEVICE_SYNCHRONIZE, NULL, 0, NULL, 0, NULL, 0, NULL,
                            0, NULL);
        if (err == cudaSuccess)
            __atomic_store_n(&g_synced, work, __ATOMIC_RELEASE);
    }
    return err;
}

cudaError_t pilot_um_pack_free(uint64_t ptr, uint64_t range_base)
{
    pthread_mutex_lock(&g_lock);
    long i = index_of_locked(range_base);
    uint64_t off = ptr - range_base;
    struct pack_range *r = i >= 0 ? g_ranges[i] : NULL;
    uint32_t at = (uint32_t)(off / PILOT_UM_PACK_ALIGN);
    int device = r ? r->device : 0;
    int live = r && off % PILOT_UM_PACK_ALIGN == 0 && r->units[at];
    pthread_mutex_unlock(&g_lock);
    if (!live)
        return cudaErrorInvalidValue; /* not the start of a live piece */
    cudaError_t err = fence(device);
    if (err)
        return err;
    uint64_t release = 0;
    pthread_mutex_lock(&g_lock);
    i = index_of_locked(range_base);
    r = i >= 0 ? g_ranges[i] : NULL;
    if (!r || !r->units[at]) { /* another thread freed it meanwhile */
        pthread_mutex_unlock(&g_lock);
        return cudaErrorInvalidValue;
    }
    uint32_t n = r->units[at];
    r->units[at] = 0;
    mark(r, at, n, 0);
    r->free_units += n;
    if (--r->live == 0) {
        r->cursor = 0;
        if (g_empty++ > 0) { /* another empty range is held: this one goes back */
            release = r->base;
            remove_locked((size_t)i);
            g_empty--;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (release) {
        pilot_alloc_remove(release);
        pilot_um_release_range(release, device);
    }
    return cudaSuccess;
}

int pilot_um_pack_piece(uint64_t ptr, uint64_t range_base, uint64_t *base, uint64_t *size)
{
    int rc = -1;
    pthread_mutex_lock(&g_lock);
    long i = index_of_locked(range_base);
    if (i >= 0 && ptr - range_base < PILOT_UM_PACK_RANGE) {
        const struct pack_range *r = g_ranges[i];
        const uint32_t at = (uint32_t)((ptr - range_base) / PILOT_UM_PACK_ALIGN);
        const uint32_t lowest = at >= PILOT_UM_PACK_MAX / PILOT_UM_PACK_ALIGN
                                    ? at - PILOT_UM_PACK_MAX / PILOT_UM_PACK_ALIGN : 0;
        for (uint32_t k = at + 1; k-- > lowest;)
            if (r->units[k]) { /* the nearest piece starting at or below ptr */
                uint64_t b = range_base + (uint64_t)k * PILOT_UM_PACK_ALIGN, n = r->asked[k] + 1u;
                if (ptr - b < n) {
                    *base = b;
                    *size = n;
                    rc = 0;
                }
                break;
            }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

void pilot_um_pack_forget(int device)
{
    pthread_mutex_lock(&g_lock);
    for (size_t i = g_count; i-- > 0;)
        if (device < 0 || g_ranges[i]->device == device) {
            g_empty -= g_ranges[i]->live == 0;
            remove_locked(i);
        }
    pthread_mutex_unlock(&g_lock);
}

static void fork_child(void)
{
    /* The child has no session: the ranges are the parent's (alloc_table.c forgets them too). */
    pthread_mutex_init(&g_lock, NULL);
    while (g_count)
        remove_locked(g_count - 1);
    g_empty = 0;
}

PILOT_HOOK(um_pack, .on_fork_child = fork_child,
           .on_device_reset = pilot_um_pack_forget, .reset_rank = PILOT_RESET_PACKED_MANAGED);
