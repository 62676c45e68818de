/* What the fast path's two files (fast_launch.c: launches, copies, synchronizations, flushes;
 * fast_library.c: library calls and memsets) share: the per-vGPU and per-connection state and
 * the lookups over it. Internal to pilotd's C module; not read by cffi. */
#ifndef PILOT_FAST_INTERNAL_H
#define PILOT_FAST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fast_launch.h"
#include "pilot_proto.h"
#include "vgpu_server.h"

typedef int (*cu_launch_kernel_fn)(uint64_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned shmem, uint64_t stream,
                                   void **params, void **extra);

typedef int (*cu_dtoh_fn)(void *dst, uint64_t src, size_t count, uint64_t stream);
typedef int (*cu_htod_fn)(uint64_t dst, const void *src, size_t count, uint64_t stream);
typedef int (*cu_sync_fn)(uint64_t stream);
typedef int (*cu_event_create_fn)(uint64_t *event, unsigned flags);
typedef int (*cu_event_record_fn)(uint64_t event, uint64_t stream);
typedef int (*cu_event_fn)(uint64_t event);
typedef int (*cu_ctx_get_fn)(uint64_t *ctx);

/* A blocking-sync event of one context (fast_launch.c's GPU waits). */
struct wait_event {
    uint64_t context, event;
};
/* How long a GPU wait holding a spin token polls before it sleeps on its event: waits shorter
 * than this (a small graph, a few kernels) answer without a wake-up; longer ones free the core,
 * and a wake-up (some microseconds) is small beside them. */
#define PILOT_FAST_SPIN_WAIT_US 500
#define WAIT_EVENTS 8 /* contexts a vGPU thread keeps an event for (its green contexts) */

/* cuda.h's CU_LAUNCH_PARAM_* (the pointers 1, 2 and 0). */
#define LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define LAUNCH_PARAM_BUFFER_SIZE ((void *)2)
#define LAUNCH_PARAM_END ((void *)0)

/* Open-addressing map of nonzero 64-bit keys to two values; 0 keys mark free slots and deleted
 * slots keep a tombstone value so probes go on past them. */
struct entry {
    uint64_t key;
    uint64_t value;  /* CUfunction or CUstream; 0: deleted */
    uint32_t extra;  /* arg_bytes */
};

struct map {
    struct entry *slots;
    uint32_t cap, used; /* used counts tombstones too */
};

struct range {
    uint64_t base, size;
};

struct shadow {
    uint64_t base, length, chunk;
    uint64_t stamp; /* the launch that counted it last (launch_seq) */
    pilot_fast_shadow_count n;
};

struct segment {
    uint64_t lo, hi, shadow; /* shadow: the base of the shadow it lies in */
};

/* A sorted array of structs that begin with their uint64_t key. */
struct sorted {
    void *items;
    uint32_t n, cap;
};

struct fconn {
    const struct pilot_fast *owner;
    uint32_t conn;
    int enabled, legacy_slow, deferred;
    int unflushed; /* kernels launched since the driver last printed their printf output */
    uint64_t session, legacy, context;
    struct map functions, streams;
    struct sorted ranges;   /* struct range, by base, disjoint */
    struct sorted shadows;  /* struct shadow, by base, disjoint */
    struct sorted segments; /* struct segment, by lo, disjoint */
    uint64_t launch_seq;
    const uint8_t *staging; /* the session's staging area in this process, or NULL */
    uint64_t slot_bytes;
    uint32_t slots;
    struct map handles; /* library handle token -> struct fhandle * (fast_library.c) */
    struct map lt_plans; /* hash of (token, records) -> struct lt_plan * (fast_library.c) */
    struct map dnn_plans; /* plan token -> struct dnn_plan * (fast_library.c) */
    struct map dnn_bns;   /* hash of a batch normalization shape -> struct dnn_bn * */
    struct map graphs;    /* executable graph token -> CUgraphExec (fast_launch.c) */
    uint64_t *syncs; /* what cudaDeviceSynchronize waits for (nsyncs 0: Python's) */
    uint32_t nsyncs, cap_syncs;
    /* which of them may have work since the last cudaDeviceSynchronize here: C marks the
     * streams it issues to; all_dirty after Python handled a call of the session (a process
     * with many idle streams, PyTorch's pools, must not pay a synchronize for each) */
    uint8_t *sync_dirty;
    int all_dirty;
    pilot_fast_count count;
    int printer;                   /* it loaded code that may print (pilot_fast_printer) */
    struct pilot_preempt *preempt; /* the retreat words its kernels raise (preempt_words.h) */
    uint32_t raises;               /* which of them; 0: none */
};

struct pilot_fast {
    cu_launch_kernel_fn cuda;
    cu_dtoh_fn dtoh;
    cu_htod_fn htod;
    cu_sync_fn sync;
    cu_sync_fn query;                 /* cuStreamQuery (pilot_fast_waits), or NULL */
    cu_event_create_fn event_create;
    cu_event_record_fn event_record;
    cu_event_fn event_sync, event_destroy;
    cu_ctx_get_fn ctx_get;
    struct wait_event events[WAIT_EVENTS];
    uint32_t nevents;
    pilot_fast_launch_fn generic;
    pilot_fast_copy_fn generic_copy;
    pilot_fast_sync_fn generic_sync;
    uint64_t coherence; /* the vGPU's coherence stream, or 0 */
    double bounds[PILOT_FAST_BUCKETS - 1];
    int nbounds;
    uint8_t *reply; /* a device-to-host copy's bytes, on their way back */
    uint16_t version;
    uint64_t context;
    int output_fd;          /* the kernels' printf output (-1: not captured) */
    uint64_t output_taken;  /* how much of it Python has taken */
    void *libfns[PILOT_FAST_LIBFNS]; /* fast_library.c (native mode) */
    pilot_fast_call_fn generic_call;  /* fast_library.c (generic mode) */
    uint8_t type_sizes[128];
    int dnn_constants[6]; /* pilot_fast_dnn_constants, in its order */
    struct pilot_fast_words *words; /* completion words (fast_words.c), or NULL */
    pilot_srv *srv;                 /* the endpoint this path filters (pilot_srv_set_fast) */
    struct fconn **conns; /* small: one per attached session of this vGPU */
    uint32_t nconns, cap;
};

/* fast_state.c */
struct entry *map_find(const struct map *m, uint64_t key);
int map_put(struct map *m, uint64_t key, uint64_t value, uint32_t extra);
struct fconn *fast_find_conn(pilot_fast *f, uint32_t conn);
/* Whether [ptr, ptr+count) lies inside one of the session's device allocations. */
int fast_owns(const struct fconn *c, uint64_t ptr, uint64_t count);
/* The CUstream for work on program stream `token`, or 0 when Python must see it; the stream is
 * marked as one a device synchronization must wait for. */
uint64_t fast_stream(struct fconn *c, uint64_t token);
/* Work goes on `stream`: the next device synchronization waits for it. */
void fast_stream_dirty(struct fconn *c, uint64_t stream);
double fast_now(void);
/* Sorted tables of items of `size` bytes, each led by its uint64_t key. The index of the first
 * item whose key is above `at`; the i-th item; the item keyed exactly `key` (or NULL); removing
 * the i-th; room for a new item at its key's place (the caller fills it; NULL when out of
 * memory); the item whose [key, key+extent) holds `at` (extent: the uint64_t after the key, or
 * the end if extent_is_end), or NULL. */
uint32_t sorted_after(const struct sorted *a, size_t size, uint64_t at);
void *sorted_item(const struct sorted *a, size_t size, uint32_t i);
void *sorted_find(const struct sorted *a, size_t size, uint64_t key);
void sorted_remove(struct sorted *a, size_t size, uint32_t i);
void *sorted_insert(struct sorted *a, size_t size, uint64_t key);
void *sorted_holding(const struct sorted *a, size_t size, uint64_t at, int extent_is_end);

/* fast_words.c: the completion words. fast_word_write puts the next value of the connection's
 * word behind the work on `stream`, after copying `count` bytes (0: none, at most
 * PILOT_RING_GPU_DATA) of device memory at `src` into the GPU page's data, and says which value
 * (0), or -1: no word for this call (none set up, the connection has no ring, its last write is
 * not done, a copy too large or refused): answer it the usual way. fast_words_release: the
 * endpoint is about to unmap a ring; 1 when this file keeps the mapping instead (a write on its
 * way), unmapped by fast_words_retire once it is done. */
int fast_word_write(pilot_fast *f, pilot_srv *srv, uint32_t conn, uint64_t stream, uint64_t src,
                    uint64_t count, uint32_t *target);
int fast_words_release(pilot_fast *f, uint32_t conn, void *map);
void fast_words_retire(pilot_fast *f);
void fast_words_free(pilot_fast *f);

/* fast_library.c */
int fast_try_library(pilot_fast *f, struct fconn *c, const pilot_srv_msg *m,
                     const pilot_envelope *env);
void fast_library_free_conn(struct fconn *c);

#endif
