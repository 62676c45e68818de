/* Completion words (issue 25): a synchronization or a small device-to-host copy of the fast
 * path answered before the GPU is done. The vGPU thread puts, behind the tenant's work on its
 * stream, a write of the next value of the connection's word (cuStreamWriteValue32 into the
 * ring's GPU page, pilot_ring.h, registered with the driver) and replies "pending" at once; the
 * shim polls the word as the driver's own synchronization polls a host semaphore. So no pilotd
 * thread waits for the GPU on a tenant's behalf, and the tenant sees the end of its work without
 * a hop through pilotd.
 *
 * The page stays registered while the GPU may still write it: one write per connection may be
 * outstanding (a call that finds the last one unfinished is answered the usual way), an event
 * recorded behind each write says when it is done (the page itself is the client's to scribble
 * on, so it proves nothing), and a connection that ends meanwhile hands its ring mapping over
 * (word_release): it is unregistered and unmapped once the event has completed
 * (fast_words_retire), never before, since a GPU write to memory no longer registered would
 * fault the context every tenant shares. */
#include "fast_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pilot_ring.h"

#define CU_SUCCESS 0
#define CU_ERROR_NOT_READY 600
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEMHOSTREGISTER_PORTABLE 0x1
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x2

typedef int (*cu_host_register_fn)(void *p, size_t bytes, unsigned flags);
typedef int (*cu_host_dptr_fn)(uint64_t *dptr, void *p, unsigned flags);
typedef int (*cu_host_unregister_fn)(void *p);
typedef int (*cu_write_value_fn)(uint64_t stream, uint64_t addr, uint32_t value, unsigned flags);

/* One connection's GPU page. */
struct word_page {
    uint32_t conn;
    int state;        /* 1 registered, -1 not usable (registration failed: calls go the usual way) */
    uint8_t *map;     /* the ring mapping (owned here once the connection ended) */
    uint64_t device;  /* the page's device address */
    uint32_t seq;     /* the last value written (or being written) */
    /* behind the last write: the page's event (native: made once, recorded behind each write)
     * or the sim's marker of that write; 0: none yet */
    uint64_t marker;
    int pending;      /* a write is (or may be) on its way */
    int untracked;    /* a write went out that no marker follows: the page stays registered */
    int orphan;       /* the connection ended: unmap once the write is done */
};

/* Pages of ended connections kept for a write still on its way, at most, per vGPU: past it no
 * new word is written (calls go the usual way) until some have gone, so connections that end
 * one after another behind work that never finishes cannot pile up mappings and pinned pages. */
#define MAX_ORPHANS 64

struct pilot_fast_words {
    uint32_t orphans;
    cu_host_register_fn host_register;
    cu_host_dptr_fn host_dptr;
    cu_host_unregister_fn host_unregister;
    cu_write_value_fn write_value;
    cu_sync_fn event_query;
    pilot_fast_word_fn generic;
    struct word_page *pages;
    uint32_t n, cap;
};

static struct pilot_fast_words *words_of(pilot_fast *f)
{
    if (!f->words)
        f->words = calloc(1, sizeof *f->words);
    return f->words;
}

int pilot_fast_words(pilot_fast *f, void *host_register, void *host_device_pointer,
                     void *host_unregister, void *write_value, void *event_query)
{
    struct pilot_fast_words *w = words_of(f);
    if (!w || !host_register || !host_device_pointer || !host_unregister || !write_value ||
        !event_query || !f->event_create || !f->event_record || !f->event_destroy || !f->cuda)
        return -1;
    w->host_register = (cu_host_register_fn)host_register;
    w->host_dptr = (cu_host_dptr_fn)host_device_pointer;
    w->host_unregister = (cu_host_unregister_fn)host_unregister;
    w->write_value = (cu_write_value_fn)write_value;
    w->event_query = (cu_sync_fn)event_query;
    return 0;
}

int pilot_fast_words_generic(pilot_fast *f, pilot_fast_word_fn generic)
{
    struct pilot_fast_words *w = words_of(f);
    if (!w || !generic || f->cuda)
        return -1;
    w->generic = generic;
    return 0;
}

static int usable(const struct pilot_fast_words *w)
{
    return w && (w->generic || w->write_value);
}

static struct word_page *find_page(struct pilot_fast_words *w, uint32_t conn)
{
    for (uint32_t i = 0; i < w->n; i++)
        if (w->pages[i].conn == conn && !w->pages[i].orphan)
            return &w->pages[i];
    return NULL;
}

/* Whether the page's last write is done (an error of the event is the context's, which is gone
 * with its writes); a write no marker follows never is. */
static int write_done(struct pilot_fast_words *w, struct word_page *p)
{
    if (p->untracked)
        return 0;
    if (p->pending)
        p->pending = w->generic ? w->generic(PILOT_WORD_DONE, p->marker, 0, 0, NULL) == 0
                                : w->event_query(p->marker) == CU_ERROR_NOT_READY;
    return !p->pending;
}

static void forget_marker(pilot_fast *f, struct pilot_fast_words *w, struct word_page *p)
{
    if (p->marker) {
        if (w->generic)
            w->generic(PILOT_WORD_FORGET, p->marker, 0, 0, NULL);
        else
            f->event_destroy(p->marker);
    }
    p->marker = 0;
}

/* The connection's page, registered on first use; NULL when it has none or cannot have one. */
static struct word_page *page_of(struct pilot_fast_words *w, pilot_srv *srv, uint32_t conn)
{
    struct word_page *p = find_page(w, conn);
    if (p)
        return p->state == 1 ? p : NULL;
    uint8_t *map = srv ? pilot_srv_ring_map(srv, conn) : NULL;
    if (!map)
        return NULL;
    if (w->n == w->cap) {
        uint32_t cap = w->cap ? w->cap * 2 : 8;
        struct word_page *grown = realloc(w->pages, cap * sizeof *grown);
        if (!grown)
            return NULL;
        w->pages = grown;
        w->cap = cap;
    }
    p = &w->pages[w->n++];
    *p = (struct word_page){.conn = conn, .state = -1, .map = map};
    void *page = map + PILOT_RING_PAGE;
    uint64_t device = 0;
    int err;
    if (w->generic) {
        err = w->generic(PILOT_WORD_REGISTER, (uint64_t)(uintptr_t)page, PILOT_RING_PAGE, 0,
                         &device);
    } else {
        err = w->host_register(page, PILOT_RING_PAGE,
                               CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
        if (!err && (err = w->host_dptr(&device, page, 0)) != CU_SUCCESS)
            w->host_unregister(page);
    }
    if (err || !device)
        return NULL; /* stays -1: this connection's calls go the usual way */
    p->state = 1;
    p->device = device;
    p->seq = atomic_load_explicit(&((struct pilot_ring_shm *)map)->gpu.word, memory_order_relaxed);
    return p;
}

/* Unregisters a page whose last write is done; 0 if it had to stay (its write is not done). */
static int unregister_page(pilot_fast *f, struct pilot_fast_words *w, struct word_page *p)
{
    if (p->state == 1 && !write_done(w, p))
        return 0;
    forget_marker(f, w, p);
    if (p->state == 1) {
        void *page = p->map + PILOT_RING_PAGE;
        if (w->generic)
            w->generic(PILOT_WORD_UNREGISTER, (uint64_t)(uintptr_t)page, 0, 0, NULL);
        else
            w->host_unregister(page);
    }
    p->state = -1;
    return 1;
}

static void drop_page(struct pilot_fast_words *w, struct word_page *p)
{
    if (p->orphan) {
        munmap(p->map, PILOT_RING_SHM_BYTES);
        w->orphans--;
    }
    *p = w->pages[--w->n];
}

/* The page of a connection whose last write is done, ready for the next; NULL: answer the
 * call the usual way. */
static struct word_page *ready_page(pilot_fast *f, pilot_srv *srv, uint32_t conn)
{
    struct pilot_fast_words *w = f->words;
    if (!usable(w) || w->orphans >= MAX_ORPHANS)
        return NULL;
    struct word_page *p = page_of(w, srv, conn);
    return p && write_done(w, p) ? p : NULL; /* at most one write outstanding per connection */
}

/* The copy's bytes into the page, behind the stream's work: 0 or the driver's error. */
static int copy_in(pilot_fast *f, struct word_page *p, uint64_t src, uint64_t count,
                   uint64_t stream)
{
    uint8_t *data = ((struct pilot_ring_shm *)p->map)->gpu.data;
    return f->cuda ? f->dtoh(data, src, count, stream)
                   : f->generic_copy(1, (uint64_t)(uintptr_t)data, src, count, stream);
}

int fast_word_write(pilot_fast *f, pilot_srv *srv, uint32_t conn, uint64_t stream, uint64_t src,
                    uint64_t count, uint32_t *target)
{
    struct word_page *p = count <= PILOT_RING_GPU_DATA ? ready_page(f, srv, conn) : NULL;
    if (!p || (count && copy_in(f, p, src, count, stream) != 0))
        return -1;
    struct pilot_fast_words *w = f->words;
    uint32_t value = p->seq + 1;
    int err;
    if (w->generic) {
        uint64_t marker = 0;
        err = w->generic(PILOT_WORD_WRITE, stream, p->device, value, &marker);
        if (!err) {
            forget_marker(f, w, p);
            p->marker = marker;
        }
    } else {
        err = !p->marker && f->event_create(&p->marker, CU_EVENT_DISABLE_TIMING) != CU_SUCCESS;
        if (err)
            p->marker = 0;
        else
            err = w->write_value(stream, p->device, value, 0);
        if (!err && f->event_record(p->marker, stream) != CU_SUCCESS)
            p->untracked = 1;
    }
    if (err) {
        /* a copy into the page that no write, so no event, follows: waited for here, or the
         * page could be unregistered under it (the call then goes the usual way) */
        if (count && f->cuda)
            f->sync(stream);
        return -1;
    }
    p->pending = 1;
    p->seq = value;
    *target = value;
    return 0;
}

void fast_words_retire(pilot_fast *f)
{
    struct pilot_fast_words *w = f->words;
    if (!w)
        return;
    for (uint32_t i = 0; i < w->n;) {
        struct word_page *p = &w->pages[i];
        if (p->orphan && unregister_page(f, w, p))
            drop_page(w, p); /* the last page moved to i: look at it next */
        else
            i++;
    }
}

int fast_words_release(pilot_fast *f, uint32_t conn, void *map)
{
    struct pilot_fast_words *w = f->words;
    struct word_page *p = w ? find_page(w, conn) : NULL;
    if (!p || p->map != map)
        return 0;
    if (unregister_page(f, w, p)) {
        drop_page(w, p); /* not an orphan: the server unmaps it */
        return 0;
    }
    p->orphan = 1; /* the GPU may still write it: kept mapped and registered until it has */
    w->orphans++;
    return 1;
}

void fast_words_free(pilot_fast *f)
{
    struct pilot_fast_words *w = f->words;
    if (!w)
        return;
    for (uint32_t i = 0; i < w->n; i++) {
        struct word_page *p = &w->pages[i];
        if (unregister_page(f, w, p) && p->orphan)
            munmap(p->map, PILOT_RING_SHM_BYTES);
        /* else: a write still on its way; the page stays pinned and mapped until the process
         * ends (pilotd is ending or the fast path was switched off) */
    }
    free(w->pages);
    free(w);
    f->words = NULL;
}
