/* The daemon's fast launch path (see fast_launch.h). Compiled into pilot.shim._proto with the
 * vGPU endpoint; one pilot_fast per vGPU thread, used only by that thread (no locks). */
#include "fast_launch.h"
#include "fast_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "pilot_proto.h"
#include "spin_budget.h"
#include "vgpu_server.h"

pilot_fast *pilot_fast_new(void *cuda_launch, void *cuda_dtoh, void *cuda_htod, void *cuda_sync,
                           pilot_fast_launch_fn generic_launch, pilot_fast_copy_fn generic_copy,
                           pilot_fast_sync_fn generic_sync, const double *bounds, int nbounds,
                           uint16_t protocol_version)
{
    if (cuda_launch ? !cuda_dtoh || !cuda_htod || !cuda_sync
                    : !generic_launch || !generic_copy || !generic_sync)
        return NULL;
    if (nbounds < 0 || nbounds >= PILOT_FAST_BUCKETS)
        return NULL;
    pilot_fast *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->reply = malloc(PILOT_INLINE_MAX);
    if (!f->reply) {
        free(f);
        return NULL;
    }
    f->cuda = (cu_launch_kernel_fn)cuda_launch;
    f->dtoh = (cu_dtoh_fn)cuda_dtoh;
    f->htod = (cu_htod_fn)cuda_htod;
    f->sync = (cu_sync_fn)cuda_sync;
    f->generic = generic_launch;
    f->generic_copy = generic_copy;
    f->generic_sync = generic_sync;
    for (int i = 0; i < nbounds; i++)
        f->bounds[i] = bounds[i];
    f->nbounds = nbounds;
    f->version = protocol_version;
    f->output_fd = -1;
    return f;
}

static void free_conn(struct fconn *c)
{
    fast_library_free_conn(c);
    free(c->functions.slots);
    free(c->streams.slots);
    free(c->graphs.slots);
    free(c->ranges.items);
    free(c->shadows.items);
    free(c->segments.items);
    free(c->syncs);
    free(c->sync_dirty);
    free(c);
}

int pilot_fast_waits(pilot_fast *f, void *stream_query, void *event_create, void *event_record,
                     void *event_synchronize, void *event_destroy, void *ctx_get_current)
{
    if (!stream_query || !event_create || !event_record || !event_synchronize || !event_destroy ||
        !ctx_get_current)
        return -1;
    f->query = (cu_sync_fn)stream_query;
    f->event_create = (cu_event_create_fn)event_create;
    f->event_record = (cu_event_record_fn)event_record;
    f->event_sync = (cu_event_fn)event_synchronize;
    f->event_destroy = (cu_event_fn)event_destroy;
    f->ctx_get = (cu_ctx_get_fn)ctx_get_current;
    return 0;
}

void pilot_fast_free(pilot_fast *f)
{
    if (!f)
        return;
    fast_words_free(f);
    if (f->srv)
        pilot_srv_set_ring_release(f->srv, NULL, NULL);
    for (uint32_t i = 0; i < f->nevents; i++)
        f->event_destroy(f->events[i].event);
    for (uint32_t i = 0; i < f->nconns; i++)
        free_conn(f->conns[i]);
    free(f->conns);
    free(f->reply);
    free(f);
}

int pilot_fast_session(pilot_fast *f, uint32_t conn, uint64_t session, int enabled,
                       uint64_t legacy_stream, int legacy_slow, int deferred, uint64_t context)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c) {
        if (!enabled)
            return 0;
        if (f->nconns == f->cap) {
            uint32_t cap = f->cap ? f->cap * 2 : 8;
            struct fconn **grown = realloc(f->conns, cap * sizeof *grown);
            if (!grown)
                return -1;
            f->conns = grown;
            f->cap = cap;
        }
        c = calloc(1, sizeof *c);
        if (!c)
            return -1;
        c->conn = c->count.conn = conn;
        c->owner = f;
        f->conns[f->nconns++] = c;
    }
    if (c->session != session) { /* another session on this connection: nothing carries over */
        free(c->functions.slots);
        free(c->streams.slots);
        memset(&c->functions, 0, sizeof c->functions);
        memset(&c->streams, 0, sizeof c->streams);
        c->ranges.n = c->shadows.n = c->segments.n = 0;
        fast_library_free_conn(c);
        c->staging = NULL;
        c->nsyncs = 0;
        c->preempt = NULL;
        c->raises = 0;
        c->printer = 0;
    }
    c->session = session;
    c->enabled = enabled;
    c->legacy = legacy_stream;
    c->legacy_slow = legacy_slow;
    c->deferred = deferred;
    c->context = context;
    return 0;
}

int pilot_fast_printer(pilot_fast *f, uint32_t conn)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c)
        return -1;
    c->printer = 1;
    return 0;
}

int pilot_fast_raises(pilot_fast *f, uint32_t conn, pilot_preempt *p, uint32_t words)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c)
        return -1;
    c->preempt = words ? p : NULL;
    c->raises = p ? words : 0;
    return 0;
}

int pilot_fast_sync_streams(pilot_fast *f, uint32_t conn, const uint64_t *streams, uint32_t n)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c)
        return -1;
    if (n > c->cap_syncs) {
        uint64_t *grown = realloc(c->syncs, n * sizeof *grown);
        uint8_t *dirty = grown ? realloc(c->sync_dirty, n) : NULL;
        if (!dirty) {
            c->syncs = grown ? grown : c->syncs;
            c->nsyncs = 0;
            return -1;
        }
        c->syncs = grown;
        c->sync_dirty = dirty;
        c->cap_syncs = n;
    }
    if (n) {
        memcpy(c->syncs, streams, n * sizeof *streams);
        memset(c->sync_dirty, 0, n);
    }
    c->nsyncs = n;
    c->all_dirty = 1;
    return 0;
}

void pilot_fast_python_work(pilot_fast *f, uint32_t conn)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (c)
        c->all_dirty = 1;
}

/* Sessions attached to this pilotd (every vGPU): the kernels' printf output reaches a program
 * only while its session is the only one (daemon/vgpu/device_output.py). */
static _Atomic int g_output_sessions;

void pilot_fast_output_sessions(int n)
{
    g_output_sessions = n;
}

void pilot_fast_output(pilot_fast *f, int fd, uint64_t taken)
{
    f->output_fd = fd;
    f->output_taken = taken;
}

void pilot_fast_mark_launched(pilot_fast *f, uint32_t conn)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (c)
        c->unflushed = 1;
}

/* Whether the kernels printed since Python last took their output. */
static int printed(const pilot_fast *f)
{
    struct stat st;
    return f->output_fd >= 0 && fstat(f->output_fd, &st) == 0 &&
           (uint64_t)st.st_size > f->output_taken;
}

void pilot_fast_context(pilot_fast *f, uint64_t context)
{
    f->context = context;
}

int pilot_fast_function(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t function,
                        uint32_t arg_bytes)
{
    struct fconn *c = fast_find_conn(f, conn);
    return c ? map_put(&c->functions, token, function, arg_bytes) : -1;
}

int pilot_fast_stream(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t stream, int slow)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c)
        return -1;
    /* a slow stream is kept as the value ~0 (never a launch's stream) */
    return map_put(&c->streams, token, stream && slow ? ~(uint64_t)0 : stream, 0);
}

int pilot_fast_range(pilot_fast *f, uint32_t conn, uint64_t base, uint64_t size)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c)
        return -1;
    struct range *known = sorted_find(&c->ranges, sizeof *known, base);
    if (known) /* forget it (and add it again if sized) */
        sorted_remove(&c->ranges, sizeof *known, (uint32_t)(known - (struct range *)c->ranges.items));
    if (!size)
        return 0;
    struct range *r = sorted_insert(&c->ranges, sizeof *r, base);
    if (!r)
        return -1;
    *r = (struct range){base, size};
    return 0;
}

int pilot_fast_shadow(pilot_fast *f, uint32_t conn, uint64_t base, uint64_t length,
                      uint64_t chunk, pilot_fast_shadow_count *left)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c)
        return -1;
    struct shadow *known = sorted_find(&c->shadows, sizeof *known, base);
    if (known) {
        if (left)
            *left = known->n;
        sorted_remove(&c->shadows, sizeof *known, (uint32_t)(known - (struct shadow *)c->shadows.items));
        for (uint32_t i = c->segments.n; i-- > 0;) /* and its segments */
            if (((struct segment *)sorted_item(&c->segments, sizeof(struct segment), i))->shadow == base)
                sorted_remove(&c->segments, sizeof(struct segment), i);
    } else if (left) {
        memset(left, 0, sizeof *left);
    }
    if (!length)
        return 0;
    struct shadow *sh = sorted_insert(&c->shadows, sizeof *sh, base);
    if (!sh)
        return -1;
    *sh = (struct shadow){.base = base, .length = length, .chunk = chunk ? chunk : 1};
    sh->n.base = base;
    return 0;
}

int pilot_fast_segment(pilot_fast *f, uint32_t conn, uint64_t lo, uint64_t hi)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c || lo >= hi)
        return -1;
    const struct shadow *sh = sorted_holding(&c->shadows, sizeof *sh, lo, 0);
    if (!sh || hi - sh->base > sh->length)
        return -1;
    if (sorted_find(&c->segments, sizeof(struct segment), lo))
        return 0; /* known */
    struct segment *seg = sorted_insert(&c->segments, sizeof *seg, lo);
    if (!seg)
        return -1;
    *seg = (struct segment){lo, hi, sh->base};
    return 0;
}

int pilot_fast_staging(pilot_fast *f, uint32_t conn, const uint8_t *base, uint64_t slot_bytes,
                       uint32_t slots)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c)
        return -1;
    c->staging = base;
    c->slot_bytes = base ? slot_bytes : 0;
    c->slots = base ? slots : 0;
    return 0;
}

void pilot_fast_coherence(pilot_fast *f, uint64_t stream)
{
    f->coherence = stream;
}

int pilot_fast_take_shadows(pilot_fast *f, uint32_t conn, pilot_fast_shadow_count *out, int max)
{
    struct fconn *c = fast_find_conn(f, conn);
    int n = 0;
    for (uint32_t i = 0; c && i < c->shadows.n && n < max; i++) {
        struct shadow *sh = sorted_item(&c->shadows, sizeof *sh, i);
        if (sh->n.launches || sh->n.flushes) {
            out[n++] = sh->n;
            memset(&sh->n, 0, sizeof sh->n);
            sh->n.base = sh->base;
        }
    }
    return n;
}

/* Each shadow a launch passes a pointer into (any 8-byte-aligned argument word) counts it once. */
static void count_managed(struct fconn *c, const uint8_t *args, uint64_t arg_bytes)
{
    uint64_t seq = ++c->launch_seq;
    for (uint64_t at = 0; at + 8 <= arg_bytes; at += 8) {
        uint64_t word;
        memcpy(&word, args + at, sizeof word);
        const struct segment *seg = word ? sorted_holding(&c->segments, sizeof *seg, word, 1) : NULL;
        struct shadow *sh = seg ? sorted_find(&c->shadows, sizeof *sh, seg->shadow) : NULL;
        if (sh && sh->stamp != seq) {
            sh->stamp = seq;
            sh->n.launches++;
            c->count.shadows_touched = 1;
        }
    }
}

void pilot_fast_forget(pilot_fast *f, uint32_t conn)
{
    for (uint32_t i = 0; i < f->nconns; i++) {
        if (f->conns[i]->conn == conn) {
            free_conn(f->conns[i]);
            f->conns[i] = f->conns[--f->nconns];
            return;
        }
    }
}

int pilot_fast_take(pilot_fast *f, pilot_fast_count *out, int max)
{
    fast_words_retire(f); /* every fold: pages of ended connections whose last write is done */
    int n = 0;
    for (uint32_t i = 0; i < f->nconns && n < max; i++) {
        struct fconn *c = f->conns[i];
        int library = c->count.lt_matmuls || c->count.memsets || c->count.dnn_executes ||
                      c->count.dnn_bn[0] || c->count.dnn_bn[1];
        for (int k = 0; k < PILOT_FAST_GEMM_FNS && !library; k++)
            library = c->count.gemms[k] != 0;
        if (c->count.launches || c->count.d2h || c->count.h2d || c->count.syncs[0] ||
            c->count.syncs[1] || c->count.flushes || c->count.shadows_touched || c->count.graphs ||
            library) {
            out[n++] = c->count;
            memset(&c->count, 0, sizeof c->count);
            c->count.conn = c->conn;
        }
    }
    return n;
}

/* The latency bucket of dt seconds. */
static int bucket(const pilot_fast *f, double dt)
{
    int b = 0;
    while (b < f->nbounds && dt > f->bounds[b])
        b++;
    return b;
}

#define CU_SUCCESS 0
#define CU_ERROR_NOT_READY 600
#define CU_EVENT_BLOCKING_SYNC 0x1
#define CU_EVENT_DISABLE_TIMING 0x2

/* The thread's current context's blocking-sync event (made the first time), or 0. */
static uint64_t wait_event(pilot_fast *f)
{
    uint64_t ctx = 0, event = 0;
    if (f->ctx_get(&ctx) != CU_SUCCESS || !ctx)
        return 0;
    for (uint32_t i = 0; i < f->nevents; i++)
        if (f->events[i].context == ctx)
            return f->events[i].event;
    if (f->event_create(&event, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING) != CU_SUCCESS)
        return 0;
    if (f->nevents == WAIT_EVENTS) { /* more contexts than kept: the oldest one's goes */
        f->event_destroy(f->events[0].event);
        memmove(f->events, f->events + 1, (WAIT_EVENTS - 1) * sizeof f->events[0]);
        f->nevents--;
    }
    f->events[f->nevents++] = (struct wait_event){ctx, event};
    return event;
}

/* Until the stream's work is done: polled while this thread holds a spin token, for at most
 * PILOT_FAST_SPIN_WAIT_US; else asleep on the blocking-sync event recorded behind the work. */
static void wait_quietly(pilot_fast *f, uint64_t stream)
{
    int r = f->query(stream);
    if (r != CU_ERROR_NOT_READY)
        return;
    int spin = pilot_spin_take();
    if (spin) {
        double until = fast_now() + PILOT_FAST_SPIN_WAIT_US * 1e-6;
        do
            r = f->query(stream);
        while (r == CU_ERROR_NOT_READY && fast_now() < until);
        pilot_spin_give(spin);
        if (r != CU_ERROR_NOT_READY)
            return;
    }
    uint64_t event = wait_event(f);
    if (event && f->event_record(event, stream) == CU_SUCCESS)
        f->event_sync(event); /* an error here is the stream's: the synchronization reports it */
}

/* Whether GPU waits go through the spin budget: the driver's waits are known (pilot_fast_waits)
 * and the budget has a limit. Without a limit a wait is the driver's own spin, which answers a
 * little sooner than polling cuStreamQuery and synchronizing after (on the H100 the polled wait
 * made launch + synchronize 15.6 us against 11.8, bench/RESULTS.md tenth session). */
static int budgeted(const pilot_fast *f)
{
    return f->query && pilot_spin_limit() > 0;
}

/* cuStreamSynchronize, after waiting within the spin budget when budgeted(): the
 * synchronization then finds the work done. */
static int sync_stream(pilot_fast *f, uint64_t stream)
{
    if (!f->cuda)
        return f->generic_sync(stream);
    if (budgeted(f))
        wait_quietly(f, stream);
    return f->sync(stream);
}

int pilot_fast_sync(pilot_fast *f, uint64_t stream)
{
    return sync_stream(f, stream);
}

/* The reply to a call answered by the completion word (fast_words.c): done when the ring's word
 * reaches `target`; a copy's `bytes` are then in the GPU page. */
static void reply_pending(pilot_srv *srv, const pilot_srv_msg *m, uint32_t target, uint64_t bytes)
{
    pilot_envelope env;
    memcpy(&env, m->frame[0], sizeof env);
    env.flags = PILOT_F_WORD_PENDING;
    pilot_rep_u64 rep = {{0, 0}, target, bytes};
    pilot_srv_send(srv, m->conn, &env, sizeof env, &rep, sizeof rep, NULL, 0);
}

/* Whether a call may be answered by the completion word: the shim asked for it, and no printf
 * output of the session's kernels may wait to be printed at this synchronization (only Python
 * sends output with a reply, after a synchronization in the driver). Output is delivered only
 * to a session no other attached session could have printed beside: with two that may print it
 * goes to pilotd's log whenever it comes; a session that cannot print has none. */
static int word_asked(const pilot_fast *f, const struct fconn *c, const pilot_envelope *env)
{
    return (env->flags & PILOT_F_GPU_WORD) &&
           !(f->output_fd >= 0 && c->unflushed && c->printer && g_output_sessions <= 1);
}

/* cudaMemcpy D2H / H2D of the session's device memory, carried inline: done and answered here
 * when the range is the session's, the stream known, no error is waiting to be reported. */
static int try_copy(pilot_fast *f, pilot_srv *srv, struct fconn *c, const pilot_srv_msg *m,
                    const pilot_envelope *env)
{
    int to_host = env->opcode == PILOT_OP_MEMCPY_D2H;
    if (!srv || c->deferred || (env->flags & PILOT_F_NO_REPLY) ||
        m->len[1] < sizeof(pilot_req_memcpy) || m->nframes != (to_host ? 2 : 3))
        return FAST_PYTHON;
    pilot_req_memcpy req;
    memcpy(&req, m->frame[1], sizeof req);
    uint64_t dev = to_host ? req.src : req.dst;
    if (!req.count || req.count > PILOT_INLINE_MAX || (!to_host && m->len[2] != req.count) ||
        !fast_owns(c, dev, req.count))
        return FAST_PYTHON;
    uint64_t stream = fast_stream(c, req.stream);
    if (!stream)
        return FAST_PYTHON;
    double t0 = fast_now();
    int err, pending = 0;
    uint32_t target;
    if (to_host && word_asked(f, c, env) &&
        fast_word_write(f, srv, m->conn, stream, dev, req.count, &target) == 0) {
        reply_pending(srv, m, target, req.count); /* the bytes go by the GPU page */
        pending = 1;
        goto answered;
    }
    if (f->cuda && to_host && budgeted(f))
        wait_quietly(f, stream); /* the copy waits for the work before it: not in a spin */
    if (f->cuda)
        err = to_host ? f->dtoh(f->reply, dev, req.count, stream)
                      : f->htod(dev, m->frame[2], req.count, stream);
    else
        err = to_host ? f->generic_copy(1, (uint64_t)(uintptr_t)f->reply, dev, req.count, stream)
                      : f->generic_copy(0, dev, (uint64_t)(uintptr_t)m->frame[2], req.count,
                                        stream);
    /* a blocking copy to the host is where the driver prints kernels' printf output: the
     * copy's stream synchronized (done by now) makes it print, when it is captured */
    if (!err && to_host && f->output_fd >= 0 && c->unflushed) {
        err = sync_stream(f, stream);
        c->unflushed = err != 0;
    }
    if (err || printed(f))
        return FAST_PYTHON; /* Python makes the same copy again and reports its error, or
                             * sends the output with it */
    pilot_rep_status rep = {{0, 0}};
    if (pilot_srv_send(srv, m->conn, m->frame[0], sizeof(pilot_envelope), &rep, sizeof rep,
                       to_host ? f->reply : NULL, to_host ? req.count : 0) != 0)
        return FAST_DONE; /* the client is gone: nothing to answer */
answered:;
    double dt = fast_now() - t0;
    int b = bucket(f, dt);
    pilot_fast_count *n = &c->count;
    if (to_host) {
        n->d2h++;
        n->d2h_bytes += req.count;
        n->d2h_buckets[b]++;
        n->d2h_seconds += dt;
    } else {
        n->h2d++;
        n->h2d_bytes += req.count;
        n->h2d_buckets[b]++;
        n->h2d_seconds += dt;
    }
    if (!req.stream)
        n->legacy++; /* work on the legacy stream, as Python counts it (blocking-stream order) */
    n->synced = !pending; /* answered by the word: the work may still run (fault suspects) */
    n->words += pending;
    return FAST_DONE;
}

/* cudaDeviceSynchronize (every stream of the session) or cudaStreamSynchronize (the legacy
 * stream, or one C launches on), answered here while the session's work is all on streams C
 * knows and no error waits to be reported. An error of the synchronization itself (a kernel
 * fault) goes to Python, which synchronizes again and reports it. */
static int try_sync(pilot_fast *f, pilot_srv *srv, struct fconn *c, const pilot_srv_msg *m,
                    const pilot_envelope *env)
{
    int device = env->opcode == PILOT_OP_DEVICE_SYNCHRONIZE;
    if (!srv || c->deferred || !c->nsyncs || (env->flags & PILOT_F_NO_REPLY))
        return FAST_PYTHON;
    double t0 = fast_now();
    uint32_t target;
    int pending = 0;
    if (word_asked(f, c, env)) {
        /* one stream to wait for: the completion word behind its work (its dirty mark stays,
         * so a synchronization after a shim that gave up waiting still waits for it) */
        uint64_t stream = 0;
        uint32_t dirty = 0;
        if (device) {
            for (uint32_t i = 0; i < c->nsyncs; i++)
                if (c->all_dirty || c->sync_dirty[i]) {
                    dirty++;
                    stream = c->syncs[i];
                }
        } else {
            pilot_req_handle req;
            if (m->len[1] >= sizeof req) {
                memcpy(&req, m->frame[1], sizeof req);
                stream = fast_stream(c, req.handle);
                dirty = stream != 0;
            }
        }
        if (dirty == 1 && fast_word_write(f, srv, m->conn, stream, 0, 0, &target) == 0) {
            reply_pending(srv, m, target, 0);
            pending = 1;
            goto answered;
        }
    }
    if (device) {
        for (uint32_t i = 0; i < c->nsyncs; i++)
            if ((c->all_dirty || c->sync_dirty[i]) && sync_stream(f, c->syncs[i]) != 0)
                return FAST_PYTHON;
        memset(c->sync_dirty, 0, c->nsyncs);
        c->all_dirty = 0;
    } else {
        pilot_req_handle req;
        if (m->len[1] < sizeof req)
            return FAST_PYTHON;
        memcpy(&req, m->frame[1], sizeof req);
        uint64_t stream = fast_stream(c, req.handle);
        if (!stream || sync_stream(f, stream) != 0)
            return FAST_PYTHON;
    }
    c->unflushed = 0; /* the synchronization made the driver print */
    if (printed(f))
        return FAST_PYTHON; /* the output goes with Python's reply */
    pilot_rep_status rep = {{0, 0}};
    if (pilot_srv_send(srv, m->conn, m->frame[0], sizeof(pilot_envelope), &rep, sizeof rep, NULL,
                       0) != 0)
        return FAST_DONE; /* the client is gone: nothing to answer */
answered:;
    double dt = fast_now() - t0;
    int kind = device ? 0 : 1;
    pilot_fast_count *n = &c->count;
    n->syncs[kind]++;
    n->sync_buckets[kind][bucket(f, dt)]++;
    n->sync_seconds[kind] += dt;
    n->synced = !pending;
    n->words += pending;
    return FAST_DONE;
}

/* A shadow flush (SHADOW_FLUSH: host-written bytes of a unified-memory shadow, in a staging
 * slot, to the device), done and answered here when C knows the shadow, the session's staging
 * area and the coherence stream, as daemon/ops/unified.py does it: the slot's bytes that lie in
 * managed segments are copied on the coherence stream, which is then synchronized, so later
 * work on any stream sees them. A failed copy or synchronization goes to Python, which flushes
 * again and reports the error. */
static int try_flush(pilot_fast *f, pilot_srv *srv, struct fconn *c, const pilot_srv_msg *m,
                     const pilot_envelope *env)
{
    if (!srv || c->deferred || !f->coherence || !c->staging || (env->flags & PILOT_F_NO_REPLY) ||
        m->nframes != 2 || m->len[1] < sizeof(pilot_req_memcpy))
        return FAST_PYTHON;
    pilot_req_memcpy req;
    memcpy(&req, m->frame[1], sizeof req);
    struct shadow *sh = sorted_holding(&c->shadows, sizeof *sh, req.dst, 0);
    if (!req.count || req.count > c->slot_bytes || req.slot >= c->slots || !sh ||
        req.count > sh->length - (req.dst - sh->base))
        return FAST_PYTHON;
    double t0 = fast_now();
    const uint8_t *slot = c->staging + (uint64_t)req.slot * c->slot_bytes;
    const uint64_t end = req.dst + req.count;
    uint64_t moved = 0;
    uint32_t i = sorted_after(&c->segments, sizeof(struct segment), req.dst);
    for (i = i ? i - 1 : 0; i < c->segments.n; i++) { /* from the segment at or before dst */
        const struct segment *seg = sorted_item(&c->segments, sizeof *seg, i);
        if (seg->lo >= end)
            break;
        uint64_t lo = seg->lo > req.dst ? seg->lo : req.dst, hi = seg->hi < end ? seg->hi : end;
        if (lo >= hi)
            continue;
        const uint8_t *src = slot + (lo - req.dst);
        int err = f->cuda ? f->htod(lo, src, hi - lo, f->coherence)
                          : f->generic_copy(0, lo, (uint64_t)(uintptr_t)src, hi - lo, f->coherence);
        if (err)
            return FAST_PYTHON;
        moved += hi - lo;
    }
    if (sync_stream(f, f->coherence) != 0)
        return FAST_PYTHON;
    pilot_rep_status rep = {{0, 0}};
    if (pilot_srv_send(srv, m->conn, m->frame[0], sizeof(pilot_envelope), &rep, sizeof rep, NULL,
                       0) != 0)
        return FAST_DONE; /* the client is gone: nothing to answer */
    double dt = fast_now() - t0;
    pilot_fast_count *n = &c->count;
    n->flushes++;
    n->flush_bytes += moved;
    n->flush_buckets[bucket(f, dt)]++;
    n->flush_seconds += dt;
    n->shadows_touched = 1;
    sh->n.flushes++;
    sh->n.flushed_bytes += moved;
    /* the chunks starting in the piece: a flushed run starts at a chunk and may be cut into
     * pieces of any size, so each chunk is counted once */
    uint64_t off = req.dst - sh->base;
    sh->n.dirty_chunks += (off + req.count - 1) / sh->chunk + 1 - (off + sh->chunk - 1) / sh->chunk;
    return FAST_DONE;
}

int pilot_fast_graph(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t graph_exec)
{
    struct fconn *c = fast_find_conn(f, conn);
    return c ? map_put(&c->graphs, token, graph_exec, 0) : -1;
}

/* C put kernels on program stream `token` (a launch, a graph): what Python counts per launch,
 * and the driver has printf output of theirs to print at the next synchronization. */
static void kernels_queued(struct fconn *c, uint64_t token)
{
    c->unflushed = 1;
    if (!token)
        c->count.legacy++;
    c->count.synced = 0;
}

/* A posted GRAPH_LAUNCH of a graph Python registered, on a stream C knows: one cuGraphLaunch. */
static int try_graph(pilot_fast *f, struct fconn *c, const pilot_srv_msg *m,
                     const pilot_envelope *env)
{
    if (c->enabled != PILOT_FAST_ALL || !(env->flags & PILOT_F_NO_REPLY) ||
        m->len[1] < sizeof(pilot_req_graph))
        return FAST_PYTHON;
    pilot_req_graph req;
    memcpy(&req, m->frame[1], sizeof req);
    const struct entry *g = map_find(&c->graphs, req.exec);
    uint64_t stream = fast_stream(c, req.stream);
    if (!g || !stream)
        return FAST_PYTHON;
    typedef int (*graph_launch_fn)(uint64_t exec, uint64_t stream);
    graph_launch_fn launch = (graph_launch_fn)f->libfns[PILOT_FAST_GRAPH_LAUNCH];
    if (!f->generic_call && !launch)
        return FAST_PYTHON;
    int err;
    pilot_preempt_enter(c->preempt, c->raises);
    if (f->generic_call)
        err = f->generic_call(m->conn, PILOT_OP_GRAPH_LAUNCH, stream, &g->value, sizeof g->value,
                              NULL, 0);
    else
        err = launch(g->value, stream);
    pilot_preempt_leave(c->preempt);
    if (err)
        return FAST_PYTHON; /* Python launches it again and reports the error */
    c->count.graphs++;
    kernels_queued(c, req.stream);
    return FAST_DONE;
}

int pilot_fast_try(pilot_fast *f, pilot_srv *srv, const pilot_srv_msg *m)
{
    struct fconn *c = fast_find_conn(f, m->conn);
    if (!c || !c->enabled || c->context != f->context || m->nframes < 2 || m->nframes > 3 ||
        m->len[0] < sizeof(pilot_envelope))
        return FAST_PYTHON;
    pilot_envelope env;
    pilot_req_launch req;
    memcpy(&env, m->frame[0], sizeof env); /* frames are not aligned */
    if (env.version != f->version || env.session != c->session)
        return FAST_PYTHON;
    if (env.opcode == PILOT_OP_MEMCPY_D2H || env.opcode == PILOT_OP_MEMCPY_H2D)
        return try_copy(f, srv, c, m, &env);
    if (env.opcode == PILOT_OP_DEVICE_SYNCHRONIZE || env.opcode == PILOT_OP_STREAM_SYNCHRONIZE)
        return try_sync(f, srv, c, m, &env);
    if (env.opcode == PILOT_OP_SHADOW_FLUSH)
        return try_flush(f, srv, c, m, &env);
    if (env.opcode == PILOT_OP_GRAPH_LAUNCH)
        return try_graph(f, c, m, &env);
    if (env.opcode == PILOT_OP_BLAS_GEMM || env.opcode == PILOT_OP_BLASLT_MATMUL ||
        env.opcode == PILOT_OP_MEMSET || env.opcode == PILOT_OP_DNN_EXECUTE ||
        env.opcode == PILOT_OP_DNN_BATCHNORM) {
        if (c->enabled != PILOT_FAST_ALL && c->enabled != PILOT_FAST_NEXT_LAUNCH)
            return FAST_PYTHON;
        pilot_preempt_enter(c->preempt, c->raises);
        int r = fast_try_library(f, c, m, &env);
        pilot_preempt_leave(c->preempt);
        if (r == FAST_DONE && (env.flags & PILOT_F_NO_REPLY) == 0) {
            pilot_rep_status rep = {{0, 0}};
            pilot_srv_send(srv, m->conn, m->frame[0], sizeof(pilot_envelope), &rep, sizeof rep,
                           NULL, 0); /* a client gone meanwhile has nothing to hear */
        }
        return r;
    }
    if (env.opcode == PILOT_OP_FREE_ASYNC && (env.flags & PILOT_F_NO_REPLY))
        return FAST_LEARN; /* Python frees it; the launches posted after it may still run here */
    if (env.opcode != PILOT_OP_LAUNCH || !(env.flags & PILOT_F_NO_REPLY) ||
        m->len[1] < sizeof(pilot_req_launch))
        return FAST_PYTHON;
    if (c->enabled == PILOT_FAST_NEXT_LAUNCH)
        return FAST_LEARN; /* the policy sees this one; the later messages are read again after */
    if (c->enabled != PILOT_FAST_ALL)
        return FAST_PYTHON;
    memcpy(&req, m->frame[1], sizeof req);
    uint64_t arg_bytes = m->nframes == 3 ? m->len[2] : 0;
    const struct entry *fn = map_find(&c->functions, req.function);
    if (!fn)
        return FAST_LEARN;
    if (fn->extra != arg_bytes || req.arg_bytes != arg_bytes)
        return FAST_PYTHON; /* Python reports the mismatch */
    uint64_t stream;
    if (req.stream) {
        const struct entry *st = map_find(&c->streams, req.stream);
        if (!st)
            return FAST_LEARN;
        stream = st->value;
    } else {
        if (c->legacy_slow)
            return FAST_PYTHON;
        stream = c->legacy;
    }
    if (!stream)
        return FAST_LEARN;
    if (stream == ~(uint64_t)0)
        return FAST_PYTHON;
    fast_stream_dirty(c, stream);
    const void *args = arg_bytes ? m->frame[2] : NULL;
    int err;
    pilot_preempt_enter(c->preempt, c->raises);
    if (f->cuda) {
        size_t size = (size_t)arg_bytes;
        void *extra[] = {LAUNCH_PARAM_BUFFER_POINTER, (void *)args, LAUNCH_PARAM_BUFFER_SIZE,
                         &size, LAUNCH_PARAM_END};
        err = f->cuda(fn->value, req.grid[0], req.grid[1], req.grid[2], req.block[0],
                      req.block[1], req.block[2], req.shared_bytes, stream, NULL,
                      arg_bytes ? extra : NULL);
    } else {
        err = f->generic(fn->value, req.grid, req.block, req.shared_bytes, stream, args,
                         (uint32_t)arg_bytes);
    }
    pilot_preempt_leave(c->preempt);
    /* A launch the driver refused put nothing on the stream: Python makes the same call again
     * and reports its error as it reports every posted call's. */
    if (err)
        return FAST_PYTHON;
    if (c->segments.n)
        count_managed(c, args, arg_bytes);
    c->count.launches++;
    kernels_queued(c, req.stream);
    return FAST_DONE;
}

static int try_filter(void *f, pilot_srv *srv, const pilot_srv_msg *m)
{
    return pilot_fast_try(f, srv, m);
}

static int ring_release(void *f, uint32_t conn, void *map)
{
    return fast_words_release(f, conn, map);
}

/* The release hook stays while f lives (pilot_fast_free takes it away): a connection that ends
 * after the filter was switched off may still have a completion word on its way. */
void pilot_srv_set_fast(pilot_srv *s, pilot_fast *f)
{
    pilot_srv_set_filter(s, f ? try_filter : NULL, f);
    if (f) {
        f->srv = s;
        pilot_srv_set_ring_release(s, ring_release, f);
    }
}
