/* Moving the program's pages (cudaHostRegister, api_host.c, and its fork handler): the pages are
 * read-only while they are copied, and a write to them meanwhile faults; the SIGSEGV handler
 * (coherence.c) asks pilot_host_fault, which waits until the move is done. Below both. */
#define _GNU_SOURCE /* mremap */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

#define MOVE_GRACE_NS 1000000000LL /* faults this soon after a move are retried (see host_fault) */

/* ---- moving the program's pages ---- */

static pthread_mutex_t g_move_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_move_lo, g_move_hi; /* the range being moved, or last moved */
static unsigned g_move_gen;           /* odd while a move is in progress */
static int64_t g_move_end_ns;         /* CLOCK_MONOTONIC at the end of the last move */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* From the SIGSEGV handler: a write to pages being moved waits until they are writable again,
 * then retries. A fault that comes in just after the move ended (the handler ran late) is
 * retried too; a genuine fault there later, past the grace period, goes to the program. */
int pilot_host_fault(uint64_t addr)
{
    unsigned gen = __atomic_load_n(&g_move_gen, __ATOMIC_ACQUIRE);
    if (addr < __atomic_load_n(&g_move_lo, __ATOMIC_ACQUIRE) ||
        addr >= __atomic_load_n(&g_move_hi, __ATOMIC_ACQUIRE))
        return 0;
    if (!(gen & 1))
        return now_ns() - __atomic_load_n(&g_move_end_ns, __ATOMIC_ACQUIRE) < MOVE_GRACE_NS;
    struct timespec pause = {0, 20000};
    while (__atomic_load_n(&g_move_gen, __ATOMIC_ACQUIRE) == gen)
        nanosleep(&pause, NULL); /* async-signal-safe */
    return 1;
}

/* Replaces the pages [base, base+len) by `replacement` (a mapping of len bytes elsewhere) with
 * their contents: the pages are read-only while they are copied, then the replacement is moved
 * over them in one mremap. `replacement` is consumed either way. */
int pilot_move_pages(uint64_t base, uint64_t len, void *replacement)
{
    void *at = (void *)(uintptr_t)base;
    pthread_mutex_lock(&g_move_lock);
    __atomic_store_n(&g_move_lo, base, __ATOMIC_RELEASE);
    __atomic_store_n(&g_move_hi, base + len, __ATOMIC_RELEASE);
    __atomic_add_fetch(&g_move_gen, 1, __ATOMIC_ACQ_REL);
    int rc = mprotect(at, len, PROT_READ);
    if (rc == 0) {
        memcpy(replacement, at, len);
        rc = mremap(replacement, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, at) == at ? 0 : -1;
        if (rc != 0)
            mprotect(at, len, PROT_READ | PROT_WRITE);
    }
    int saved = errno;
    if (rc != 0)
        munmap(replacement, len);
    __atomic_store_n(&g_move_end_ns, now_ns(), __ATOMIC_RELEASE);
    __atomic_add_fetch(&g_move_gen, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&g_move_lock);
    if (rc != 0)
        LOG_ERROR("cannot move the pages at %#llx+%llu: %s", (unsigned long long)base,
                  (unsigned long long)len, strerror(saved));
    return rc;
}

static void fork_child(void)
{
    pthread_mutex_init(&g_move_lock, NULL);
}

/* Before api_host.c's in link order: its child handler moves pages (privatize). */
PILOT_HOOK(page_move, .on_fork_child = fork_child);
