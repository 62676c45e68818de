/* Unified memory in the client: shadows of managed ranges at the daemon's addresses, kept
 * coherent with the device by page protection.
 *
 * A managed range (cudaMallocManaged or a __managed__ variable) is real managed memory in the
 * daemon. Here it is a shadow: private anonymous memory mapped at the same virtual address, with
 * transparent huge pages where the kernel offers them (one fault per 2 MiB when the host first
 * writes). Data moves through pinned shared-memory staging areas, never over the socket: flushes
 * through the session's (the shim fills slots, the daemon DMAs them), fetches through the fault
 * channel's (the daemon DMAs, the shim copies into a fresh buffer and moves that over the chunk
 * with mremap, so no other thread ever sees a half-fetched chunk). Each shadow is cut into chunks
 * (PILOT_UM_CHUNK, default 2 MiB), each in one of three states:
 *
 *   INVALID  PROT_NONE   the device may hold newer data; a host access faults and fetches it
 *   CLEAN    PROT_READ   the shadow equals the device; a host write faults and marks it DIRTY
 *   DIRTY    PROT_RW     the host wrote it; flushed to the device before any device work
 *
 * Device work that may read managed memory (launches, copies and memsets touching it,
 * prefetches) first flushes every DIRTY chunk (DIRTY -> CLEAN). A launch then invalidates every
 * chunk (the kernel may write anything reachable); a copy or memset invalidates the chunks it
 * writes. Host reads after the synchronization CUDA requires fault and fetch. docs/ARCHITECTURE.md
 * has the whole protocol.
 *
 * Locking: one mutex (g_lock) guards the table and every state; the SIGSEGV handler takes it too.
 * The shim never touches shadow bytes itself while it holds g_lock or the transport lock (copies
 * of managed memory run in the daemon), so a fault never waits for a lock its own thread holds.
 * Fetches go over the separate fault channel (transport.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

enum chunk_state { CHUNK_INVALID = 0, CHUNK_CLEAN = 1, CHUNK_DIRTY = 2 };

struct region {
    uint64_t base, len;  /* the shadow mapping: page-aligned, whole pages */
    uint64_t chunk;      /* bytes per chunk (the last may be shorter) */
    size_t nchunks;
    size_t valid, dirty; /* chunks not INVALID / DIRTY */
    uint8_t *state;
    int kind;            /* PILOT_UM_ALLOCATION or PILOT_UM_VARIABLE */
    int lost;            /* the daemon went away: the shadow is all the program has */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *g_regions; /* sorted by base */
static size_t g_count, g_cap;
static int g_any;        /* g_count > 0, read without the lock on hot paths */
static uint64_t g_chunk; /* PILOT_UM_CHUNK */
static uint64_t g_device_work; /* pilot_um_device_work() */

/* ---- the table ---- */

static long find_locked(uint64_t addr)
{
    long i = pilot_find_le(g_regions, g_count, sizeof *g_regions, addr);
    return i >= 0 && addr - g_regions[i].base < g_regions[i].len ? i : -1;
}

uint64_t pilot_um_chunk_bytes(void)
{
    if (!g_chunk) {
        uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), c = 2u << 20;
        const char *env = getenv("PILOT_UM_CHUNK");
        if (env && *env) {
            char *end;
            unsigned long long v = strtoull(env, &end, 0);
            if (*end == 'k' || *end == 'K')
                v <<= 10;
            else if (*end == 'm' || *end == 'M')
                v <<= 20;
            if (v >= page && v <= (1ull << 30) && !(v & (v - 1)))
                c = v;
            else
                LOG_WARN("PILOT_UM_CHUNK=%s is not a power of two between the page size and 1G; "
                         "using 2M", env);
        }
        g_chunk = c;
    }
    return g_chunk;
}

static uint8_t *chunk_addr(const struct region *r, size_t i)
{
    return (uint8_t *)(uintptr_t)(r->base + i * r->chunk);
}

static uint64_t chunk_len(const struct region *r, size_t i)
{
    uint64_t off = i * r->chunk;
    return r->len - off < r->chunk ? r->len - off : r->chunk;
}

/* Protection and state for chunks [first, last]. */
static void set_chunks(struct region *r, size_t first, size_t last, enum chunk_state st)
{
    static const int prot[] = {PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE};
    uint64_t off = first * r->chunk, end = (last + 1) * r->chunk;
    if (end > r->len)
        end = r->len;
    if (mprotect((void *)(uintptr_t)(r->base + off), end - off, prot[st]) != 0)
        LOG_ERROR("mprotect of managed shadow %#llx+%llu failed: %s",
                  (unsigned long long)(r->base + off), (unsigned long long)(end - off),
                  strerror(errno));
    for (size_t i = first; i <= last; i++) {
        r->valid -= r->state[i] != CHUNK_INVALID;
        r->dirty -= r->state[i] == CHUNK_DIRTY;
        r->state[i] = (uint8_t)st;
        r->valid += st != CHUNK_INVALID;
        r->dirty += st == CHUNK_DIRTY;
    }
}

int pilot_um_add(uint64_t base, uint64_t len, int valid, int kind)
{
    uint64_t chunk = pilot_um_chunk_bytes();
    struct region r = {.base = base, .len = len, .chunk = chunk, .kind = kind,
                       .nchunks = (size_t)((len + chunk - 1) / chunk)};
    r.state = malloc(r.nchunks);
    if (!r.state)
        return -1;
    memset(r.state, valid ? CHUNK_CLEAN : CHUNK_INVALID, r.nchunks);
    r.valid = valid ? r.nchunks : 0;
    pthread_mutex_lock(&g_lock);
    if (g_count == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 16;
        struct region *nr = realloc(g_regions, cap * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&g_lock);
            free(r.state);
            return -1;
        }
        g_regions = nr;
        g_cap = cap;
    }
    size_t at = 0;
    while (at < g_count && g_regions[at].base < base)
        at++;
    memmove(g_regions + at + 1, g_regions + at, (g_count - at) * sizeof *g_regions);
    g_regions[at] = r;
    g_count++;
    __atomic_store_n(&g_any, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return 0;
}

static void remove_locked(size_t i)
{
    munmap((void *)(uintptr_t)g_regions[i].base, g_regions[i].len);
    free(g_regions[i].state);
    memmove(g_regions + i, g_regions + i + 1, (g_count - i - 1) * sizeof *g_regions);
    g_count--;
    __atomic_store_n(&g_any, g_count > 0, __ATOMIC_RELEASE);
}

int pilot_um_remove(uint64_t base)
{
    int rc = -1;
    pthread_mutex_lock(&g_lock);
    long i = find_locked(base);
    if (i >= 0 && g_regions[i].base == base) {
        remove_locked((size_t)i);
        rc = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* cudaDeviceReset: variables stay with their modules. */
static void remove_allocations(void)
{
    pthread_mutex_lock(&g_lock);
    for (size_t i = g_count; i-- > 0;)
        if (g_regions[i].kind == PILOT_UM_ALLOCATION)
            remove_locked(i);
    pthread_mutex_unlock(&g_lock);
}

#define HUGE_PAGE (2ull << 20)

/* PILOT_UM_HUGEPAGE=0 keeps shadows on small pages (for measurement). */
static int huge_pages_wanted(void)
{
    static int wanted = -1;
    if (wanted < 0) {
        const char *env = getenv("PILOT_UM_HUGEPAGE");
        wanted = !(env && *env == '0');
    }
    return wanted;
}

/* Asks for transparent huge pages on the 2 MiB-aligned part of [p, p+len). */
static void advise_huge(void *p, uint64_t len)
{
    uint64_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), hi = ((uintptr_t)p + len) & ~(HUGE_PAGE - 1);
    if (huge_pages_wanted() && lo < hi)
        madvise((void *)(uintptr_t)lo, hi - lo, MADV_HUGEPAGE); /* advice: failure is harmless */
}

cudaError_t pilot_um_map_shadow(uint64_t base, uint64_t len, int valid, int kind, int *taken)
{
    *taken = 0;
    /* MAP_FIXED_NOREPLACE: never replace a mapping of the program; kernels before 4.17 treat it
     * as a hint and may map elsewhere, which counts as taken too. */
    void *want = (void *)(uintptr_t)base;
    void *p = mmap(want, len, valid ? PROT_READ : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != want) {
        if (p != MAP_FAILED)
            munmap(p, len);
        LOG_INFO("managed range %#llx+%llu is taken in this process",
                 (unsigned long long)base, (unsigned long long)len);
        *taken = 1;
        return cudaErrorMemoryAllocation;
    }
    advise_huge(p, len);
    pilot_req_shadow_attach req = {.base = base, .length = len, .chunk = pilot_um_chunk_bytes()};
    cudaError_t err = pilot_call(PILOT_OP_SHADOW_ATTACH, &req, sizeof req, NULL, 0, NULL, 0, NULL,
                                 0, NULL);
    if (err == cudaSuccess && pilot_um_add(base, len, valid, kind) != 0)
        err = cudaErrorMemoryAllocation;
    if (err)
        munmap(p, len);
    return err;
}

uint64_t pilot_um_next_gap(uint64_t from, uint64_t to, uint64_t *gap_end)
{
    pthread_mutex_lock(&g_lock);
    for (;;) {
        long i = find_locked(from);
        if (i < 0 || from >= to)
            break;
        from = g_regions[i].base + g_regions[i].len; /* skip what is mapped */
    }
    uint64_t end = to;
    for (size_t k = 0; k < g_count; k++)
        if (g_regions[k].base > from && g_regions[k].base < end)
            end = g_regions[k].base;
    pthread_mutex_unlock(&g_lock);
    *gap_end = from < to ? end : from;
    return from;
}

int pilot_um_active(void)
{
    return __atomic_load_n(&g_any, __ATOMIC_ACQUIRE);
}

int pilot_um_contains(uint64_t addr)
{
    if (!__atomic_load_n(&g_any, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&g_lock);
    int yes = find_locked(addr) >= 0;
    pthread_mutex_unlock(&g_lock);
    return yes;
}

static void fork_child(void)
{
    /* After fork: the child has copies of the shadows (private memory) and no session. Leave
     * the mappings (pointers into them stay mapped) but stop managing them. */
    pthread_mutex_init(&g_lock, NULL);
    for (size_t i = 0; i < g_count; i++)
        free(g_regions[i].state);
    g_count = 0;
    g_any = 0;
}

/* ---- moving data ---- */

/* Sends every DIRTY run of r to the device through the staging area (the shim reads the run,
 * which is readable: CLEAN); they become CLEAN. Unified memory is device 0's (part 0). */
static cudaError_t flush_region_locked(struct region *r)
{
    cudaError_t err = cudaSuccess;
    size_t i = 0;
    int previous = pilot_route_begin(0);
    while (i < r->nchunks && err == cudaSuccess) {
        if (r->state[i] != CHUNK_DIRTY) {
            i++;
            continue;
        }
        size_t j = i;
        while (j + 1 < r->nchunks && r->state[j + 1] == CHUNK_DIRTY)
            j++;
        /* Read-only first: a write from another thread now faults and waits for g_lock. */
        set_chunks(r, i, j, CHUNK_CLEAN);
        uint64_t at = r->base + i * r->chunk, len = (j - i) * r->chunk + chunk_len(r, j);
        err = pilot_staged_upload(PILOT_OP_SHADOW_FLUSH, at, (const void *)(uintptr_t)at, len);
        i = j + 1;
    }
    pilot_route_end(previous);
    return err;
}

static cudaError_t flush_all_locked(void)
{
    for (size_t k = 0; k < g_count; k++) {
        struct region *r = &g_regions[k];
        if (r->dirty && !r->lost) {
            cudaError_t err = flush_region_locked(r);
            if (err)
                return err;
        }
    }
    return cudaSuccess;
}

cudaError_t pilot_um_flush(void)
{
    if (!__atomic_load_n(&g_any, __ATOMIC_ACQUIRE))
        return cudaSuccess;
    pthread_mutex_lock(&g_lock);
    cudaError_t err = flush_all_locked();
    pthread_mutex_unlock(&g_lock);
    return err;
}

uint64_t pilot_um_device_work(void)
{
    return __atomic_load_n(&g_device_work, __ATOMIC_ACQUIRE);
}

cudaError_t pilot_um_before_launch(void)
{
    if (!__atomic_load_n(&g_any, __ATOMIC_ACQUIRE))
        return cudaSuccess;
    __atomic_add_fetch(&g_device_work, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g_lock);
    cudaError_t err = flush_all_locked();
    for (size_t k = 0; k < g_count && err == cudaSuccess; k++) {
        struct region *r = &g_regions[k];
        if (r->valid && !r->lost)
            set_chunks(r, 0, r->nchunks - 1, CHUNK_INVALID);
    }
    pthread_mutex_unlock(&g_lock);
    return err;
}

static void invalidate_range(uint64_t ptr, uint64_t count)
{
    pthread_mutex_lock(&g_lock);
    long k = find_locked(ptr);
    if (k >= 0 && !g_regions[k].lost) {
        struct region *r = &g_regions[k];
        uint64_t end = ptr + count - r->base;
        size_t first = (size_t)((ptr - r->base) / r->chunk);
        size_t last = (size_t)(((end > r->len ? r->len : end) - 1) / r->chunk);
        for (size_t i = first; i <= last; i++)
            if (r->state[i] != CHUNK_INVALID)
                set_chunks(r, i, i, CHUNK_INVALID);
    }
    pthread_mutex_unlock(&g_lock);
}

/* The chunks the copy or memset wrote become INVALID. A synchronous one then waits for its
 * stream: the host may touch the memory next, and the fetch that brings it runs on the daemon's
 * coherence stream, which would overtake the copy (the driver's own fault handling waits for the
 * work on the page). */
cudaError_t pilot_um_device_wrote(uint64_t ptr, uint64_t count, uint64_t stream, int sync,
                                  cudaError_t err)
{
    if (count && __atomic_load_n(&g_any, __ATOMIC_ACQUIRE)) {
        invalidate_range(ptr, count);
        __atomic_add_fetch(&g_device_work, 1, __ATOMIC_RELEASE);
    }
    return sync && err == cudaSuccess ? pilot_stream_sync(stream) : err;
}

/* A fresh buffer for a fetched chunk of len bytes, 2 MiB-aligned when len is a multiple of it
 * (so it can be one huge page and keeps being one when moved); NULL if none. */
static uint8_t *fetch_buffer(uint64_t len)
{
    uint64_t align = len % HUGE_PAGE == 0 ? HUGE_PAGE : (uint64_t)sysconf(_SC_PAGESIZE);
    uint8_t *p = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uint8_t *aligned = (uint8_t *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
    if (aligned > p)
        munmap(p, (size_t)(aligned - p));
    munmap(aligned + len, (size_t)(p + align - aligned));
    advise_huge(aligned, len);
    return aligned;
}

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* A spare fetch buffer (guarded by g_lock): the pages a fetch took out of the chunk it
 * replaced, so the next fetch fills memory that is already there instead of faulting in (and
 * zeroing) fresh pages. */
static uint8_t *g_spare;
static uint64_t g_spare_len;

static uint8_t *take_buffer(uint64_t len)
{
    uint8_t *buf = g_spare;
    if (buf && g_spare_len == len) {
        g_spare = NULL;
        return buf;
    }
    if (buf)
        munmap(buf, g_spare_len);
    g_spare = NULL;
    return fetch_buffer(len);
}

/* Moves the pages of the chunk at `at` into a new spare buffer, leaving the chunk mapped (empty,
 * protection unchanged), so no other mapping can take its place before the fetched buffer does. */
static void keep_old_pages(uint64_t at, uint64_t len)
{
    uint8_t *dest = g_spare ? NULL : fetch_buffer(len);
    if (!dest)
        return;
    if (mremap((void *)(uintptr_t)at, len, len, MREMAP_MAYMOVE | MREMAP_DONTUNMAP | MREMAP_FIXED,
               dest) == MAP_FAILED ||
        mprotect(dest, len, PROT_READ | PROT_WRITE) != 0) {
        munmap(dest, len); /* an older kernel (DONTUNMAP: 5.7): fresh buffers each time */
        return;
    }
    g_spare = dest;
    g_spare_len = len;
}

/* The device's bytes of chunk i, fetched over the fault channel into a buffer given the chunk's
 * next protection, then moved over the chunk in one step (mremap): another thread sees the old
 * protection (and faults, waiting for g_lock) or the whole new chunk, never a part. */
static cudaError_t fetch_chunk(struct region *r, size_t i, int prot)
{
    const struct pilot_staging *stage = pilot_fault_staging();
    const uint64_t at = r->base + i * r->chunk, len = chunk_len(r, i);
    if (!stage->base)
        return cudaErrorDevicesUnavailable;
    uint8_t *buf = take_buffer(len);
    if (!buf)
        return cudaErrorMemoryAllocation;
    cudaError_t err = cudaSuccess;
    for (uint64_t off = 0; off < len && err == cudaSuccess; off += stage->slot_bytes) {
        uint64_t n = len - off < stage->slot_bytes ? len - off : stage->slot_bytes;
        pilot_req_memcpy req = {.src = at + off, .count = n, .slot = 0};
        err = pilot_fault_call(PILOT_OP_SHADOW_FETCH, &req, sizeof req);
        if (err == cudaSuccess)
            memcpy(buf + off, stage->base, n);
    }
    if (err == cudaSuccess && mprotect(buf, len, prot) != 0)
        err = cudaErrorOperatingSystem;
    if (err == cudaSuccess)
        keep_old_pages(at, len);
    if (err == cudaSuccess &&
        mremap(buf, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)at) != MAP_FAILED)
        return cudaSuccess;
    if (err == cudaSuccess) {
        /* Out of mappings (each moved chunk is a mapping of its own until the range is freed;
         * vm.max_map_count): copy in place instead. Another thread touching this chunk right
         * now could see part of it, so say so once. */
        static int warned;
        if (!warned++)
            LOG_WARN("cannot move fetched chunks over managed memory (%s); copying them in place",
                     strerror(errno));
        if (mprotect((void *)(uintptr_t)at, len, PROT_READ | PROT_WRITE) == 0) {
            memcpy((void *)(uintptr_t)at, buf, len);
            mprotect((void *)(uintptr_t)at, len, prot);
        } else {
            err = cudaErrorOperatingSystem;
        }
    }
    munmap(buf, len);
    return err;
}

/* Brings chunk i up to date from the device and opens it for reading, or for writing too. */
static void fetch_locked(struct region *r, size_t i, int write)
{
    cudaError_t err = fetch_chunk(r, i, write ? PROT_READ | PROT_WRITE : PROT_READ);
    if (err != cudaSuccess) {
        /* Nothing can report an error from a load or store: keep the program running on what
         * the shadow holds; its next CUDA call reports the lost session. */
        if (!r->lost)
            fprintf(stderr, "pilot: cannot fetch managed memory at %p (%s); the host now sees "
                            "stale data there\n", (void *)chunk_addr(r, i),
                    pilot_error_name(err) ? pilot_error_name(err) : "error");
        r->lost = 1;
        set_chunks(r, 0, r->nchunks - 1, CHUNK_DIRTY);
        return;
    }
    set_chunks(r, i, i, write ? CHUNK_DIRTY : CHUNK_CLEAN);
}

/* ---- the fault handler ----
 * It also serves api_host.c: a write to pages cudaHostRegister is moving waits there until the
 * move is done (pilot_host_fault, page_move.c). */

static struct sigaction g_app; /* the program's SIGSEGV action */
static int g_installed;

/* glibc's own entry point (sigaction is a weak alias of it): the real call under our override. */
extern int __sigaction(int sig, const struct sigaction *act, struct sigaction *old);

/* 1 if the fault was a write, 0 a read, -1 unknown. */
static int fault_is_write(const void *uctx)
{
#if defined(__x86_64__)
    return (((const ucontext_t *)uctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
    (void)uctx;
    return -1;
#endif
}

/* Resolves a fault on a shadow. Returns 1 if it was ours (retry the access), 0 if not. */
static int resolve(void *addr, int write)
{
    if (!__atomic_load_n(&g_any, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&g_lock);
    long k = find_locked((uint64_t)(uintptr_t)addr);
    if (k < 0) {
        pthread_mutex_unlock(&g_lock);
        return 0;
    }
    struct region *r = &g_regions[k];
    size_t i = (size_t)(((uint64_t)(uintptr_t)addr - r->base) / r->chunk);
    switch (r->state[i]) {
    case CHUNK_INVALID:
        fetch_locked(r, i, write == 1);
        break;
    case CHUNK_CLEAN: /* a read cannot fault here: a write (or another thread got here first) */
        set_chunks(r, i, i, CHUNK_DIRTY);
        break;
    default: /* DIRTY: another thread resolved it in between */
        break;
    }
    pthread_mutex_unlock(&g_lock);
    return 1;
}

static void chain(int sig, siginfo_t *info, void *uctx)
{
    struct sigaction *app = &g_app;
    if (app->sa_flags & SA_SIGINFO) {
        if (app->sa_flags & SA_RESETHAND)
            app->sa_handler = SIG_DFL, app->sa_flags &= ~SA_SIGINFO;
        app->sa_sigaction(sig, info, uctx);
        return;
    }
    if (app->sa_handler == SIG_DFL || app->sa_handler == SIG_IGN) {
        /* A genuine fault with no handler: die of it as the program would have. Ignoring a
         * SIGSEGV from a fault only repeats it, so SIG_IGN dies too. */
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigemptyset(&dfl.sa_mask);
        __sigaction(sig, &dfl, NULL);
        return; /* the access repeats and now kills the process */
    }
    void (*fn)(int) = app->sa_handler;
    if (app->sa_flags & SA_RESETHAND)
        app->sa_handler = SIG_DFL;
    fn(sig);
}

static void on_fault(int sig, siginfo_t *info, void *uctx)
{
    int saved = errno;
    if (info->si_code == SEGV_ACCERR &&
        (pilot_host_fault((uintptr_t)info->si_addr) || resolve(info->si_addr, fault_is_write(uctx)))) {
        errno = saved;
        return;
    }
    errno = saved;
    chain(sig, info, uctx);
}

int pilot_um_install_handler(void)
{
    int rc = 0;
    pthread_mutex_lock(&g_lock);
    if (!g_installed) {
        struct sigaction sa = {.sa_sigaction = on_fault,
                               .sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK | SA_NODEFER};
        sigemptyset(&sa.sa_mask);
        if (__sigaction(SIGSEGV, &sa, &g_app) != 0)
            rc = -1;
        else
            __atomic_store_n(&g_installed, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* The program's own sigaction()/signal() for SIGSEGV, once our handler is in place: recorded
 * as the action faults that are not ours chain to, and reported back as if installed. Other
 * signals, and SIGSEGV before the first managed range, go straight to libc. */
PILOT_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (sig != SIGSEGV || !__atomic_load_n(&g_installed, __ATOMIC_ACQUIRE))
        return __sigaction(sig, act, old);
    sigset_t all, prev;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &prev); /* no fault handler mid-update on this thread */
    if (old)
        *old = g_app;
    if (act)
        g_app = *act;
    pthread_sigmask(SIG_SETMASK, &prev, NULL);
    return 0;
}

/* sigset() (System V) and bsd_signal() (BSD): glibc implements them with its own sigaction,
 * which would put the program's SIGSEGV handler in place of ours; here they go through ours.
 * sigset keeps its System V meaning: SIG_HOLD blocks the signal, any other disposition is
 * installed and the signal unblocked; the previous disposition (SIG_HOLD if it was blocked) is
 * returned. */
PILOT_EXPORT __sighandler_t sigset(int sig, __sighandler_t disp)
{
    struct sigaction old;
    sigset_t one, prev;
    sigemptyset(&one);
    if (disp == SIG_ERR || sigaddset(&one, sig) != 0) {
        errno = EINVAL;
        return SIG_ERR;
    }
    if (disp == SIG_HOLD) {
        if (sigaction(sig, NULL, &old) != 0 || sigprocmask(SIG_BLOCK, &one, &prev) != 0)
            return SIG_ERR;
        return sigismember(&prev, sig) ? SIG_HOLD : old.sa_handler;
    }
    struct sigaction act = {.sa_handler = disp};
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) != 0 || sigprocmask(SIG_UNBLOCK, &one, &prev) != 0)
        return SIG_ERR;
    return sigismember(&prev, sig) ? SIG_HOLD : old.sa_handler;
}

PILOT_EXPORT __sighandler_t bsd_signal(int sig, __sighandler_t handler)
{
    return signal(sig, handler);
}

PILOT_EXPORT __sighandler_t signal(int sig, __sighandler_t handler)
{
    struct sigaction act = {.sa_handler = handler, .sa_flags = SA_RESTART}, old;
    sigemptyset(&act.sa_mask);
    if (handler == SIG_ERR || sigaction(sig, &act, &old) != 0) {
        errno = EINVAL;
        return SIG_ERR;
    }
    return old.sa_handler;
}

/* cudaDeviceReset destroyed the managed ranges (of every device: they are the session's). */
static void reset_device(int device)
{
    (void)device;
    remove_allocations();
}

PILOT_HOOK(coherence, .on_fork_child = fork_child,
           .on_device_reset = reset_device, .reset_rank = PILOT_RESET_MANAGED);
