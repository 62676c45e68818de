/* The shared-memory rings of a vGPU connection (issue 25 item 4): one definition for both ends,
 * compiled into the shim (shim/transport/zmtp.c) and into pilotd's endpoint
 * (daemon/native/vgpu_server.c).
 *
 * Why: a synchronous call used to cost four socket system calls (the shim's send, the
 * endpoint's epoll and recv, its reply's send) besides the shim's recv, on top of the work.
 * After RING_OPEN a connection's byte stream runs through two single-producer single-consumer
 * byte rings in one memfd pilotd creates and hands over with SCM_RIGHTS: requests shim ->
 * pilotd, replies pilotd -> shim. The ZMTP framing inside the stream is unchanged. While both
 * ends are awake (each spins a little before it sleeps) a call is memory writes only.
 *
 * The socket stays: it carries the set-up, then only doorbells (one byte, contents ignored) and
 * the end of the connection (EOF when either side goes away, so a dead pilotd is still an
 * immediate error, never a hang). A consumer about to sleep sets `consumer_sleeping` and looks
 * at the ring once more; a producer publishes `head`, then (after a full fence) rings the
 * doorbell if the consumer sleeps: Dekker's pattern, so a wake-up cannot be lost. A producer
 * that finds the ring full does the same with `producer_waiting` and the consumer's `tail`.
 *
 * Trust: each end keeps its own index privately and reads only the other's from shared memory,
 * checked (an index that moves backwards or past the ring's size ends the connection); pilotd
 * copies every request out of the ring before it parses it, so a client writing the ring
 * concurrently changes nothing pilotd has checked. The memfd is sealed against shrinking, so a
 * client cannot make pilotd's mapping fault. */
#ifndef PILOT_RING_H
#define PILOT_RING_H

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#define PILOT_RING_MAGIC 0x32676e69522d5450ull /* "PT-Ring2": with the GPU page */
#define PILOT_RING_REQ_BYTES (256u << 10)       /* shim -> pilotd; a power of two */
#define PILOT_RING_REP_BYTES (128u << 10)       /* pilotd -> shim; a power of two */

/* One direction's indices: the producer's cache line, then the consumer's. */
struct pilot_ring_side {
    _Atomic uint64_t head;             /* bytes written so far (producer) */
    _Atomic uint32_t producer_waiting; /* the producer waits for space: doorbell after taking */
    uint8_t pad0[64 - 12];
    _Atomic uint64_t tail;             /* bytes taken so far (consumer) */
    _Atomic uint32_t consumer_sleeping; /* the consumer sleeps: doorbell after writing */
    uint8_t pad1[64 - 12];
};

/* The page the GPU writes (issue 25, "the completion word"): pilotd registers it with the driver
 * (page-aligned, the ring's control is on the page before), and a synchronization or a small
 * device-to-host copy answered with PILOT_F_WORD_PENDING is finished when the GPU, behind the
 * work, has written `word` (cuStreamWriteValue32 in stream order; a copy's bytes land in `data`
 * first, the same stream). The shim polls the word, as the driver's own synchronization polls
 * a host semaphore, so no pilotd thread waits for the GPU on a tenant's behalf. The word only
 * grows (wrapping), per connection, and the shim's calls on one connection are serialized, so
 * "done" is `(int32_t)(word - target) >= 0`. pilotd never reads this page. */
#define PILOT_RING_PAGE 4096u
struct pilot_ring_gpu_page {
    _Atomic uint32_t word;
    uint8_t pad[60];
    uint8_t data[PILOT_RING_PAGE - 64]; /* a small device-to-host copy's bytes */
};
#define PILOT_RING_GPU_DATA (PILOT_RING_PAGE - 64u)

struct pilot_ring_shm {
    uint64_t magic;
    uint32_t req_bytes, rep_bytes;
    uint8_t pad[48];
    struct pilot_ring_side req, rep;
    uint8_t pad_page[PILOT_RING_PAGE - 64 - 2 * sizeof(struct pilot_ring_side)];
    struct pilot_ring_gpu_page gpu; /* at PILOT_RING_PAGE from the (page-aligned) mapping */
    /* then req_bytes of request data, then rep_bytes of reply data */
};
_Static_assert(offsetof(struct pilot_ring_shm, gpu) == PILOT_RING_PAGE, "GPU page on its own page");

/* Whether the word has reached `target` (it wraps; the shim waits for one target at a time). */
static inline int pilot_ring_word_reached(const struct pilot_ring_gpu_page *page, uint32_t target)
{
    return (int32_t)(atomic_load_explicit(&page->word, memory_order_acquire) - target) >= 0;
}

#define PILOT_RING_SHM_BYTES \
    (sizeof(struct pilot_ring_shm) + PILOT_RING_REQ_BYTES + PILOT_RING_REP_BYTES)

/* In a polling loop: lets a hyperthread sibling (pilotd's thread doing the call, say) have the
 * core's execution units while this one only waits. */
static inline void pilot_ring_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One end's view of one ring: the shared side, the data, and this end's own index (the only
 * copy it trusts). */
struct pilot_ring {
    struct pilot_ring_side *side;
    uint8_t *data;
    uint64_t size; /* a power of two */
    uint64_t own;  /* head when this end produces, tail when it consumes */
};

/* The request and reply rings of a mapping; `client` picks which one this end produces. */
static inline void pilot_ring_views(void *map, int client, struct pilot_ring *out,
                                    struct pilot_ring *in)
{
    struct pilot_ring_shm *shm = map;
    uint8_t *req = (uint8_t *)map + sizeof *shm;
    struct pilot_ring r_req = {&shm->req, req, PILOT_RING_REQ_BYTES, 0};
    struct pilot_ring r_rep = {&shm->rep, req + PILOT_RING_REQ_BYTES, PILOT_RING_REP_BYTES, 0};
    *out = client ? r_req : r_rep;
    *in = client ? r_rep : r_req;
}

/* Bytes written by the producer and not yet taken; (uint64_t)-1 when the peer's index is
 * impossible (a broken or hostile peer). */
static inline uint64_t pilot_ring_used(const struct pilot_ring *r, uint64_t head, uint64_t tail)
{
    uint64_t used = head - tail;
    return used > r->size ? (uint64_t)-1 : used;
}

/* Producer: copies up to len bytes in and publishes them. Returns the bytes written (0: full),
 * or -1 when the consumer's index is impossible. */
static inline int64_t pilot_ring_put(struct pilot_ring *r, const void *src, size_t len)
{
    uint64_t used = pilot_ring_used(r, r->own, atomic_load_explicit(&r->side->tail,
                                                                     memory_order_acquire));
    if (used == (uint64_t)-1)
        return -1;
    uint64_t n = r->size - used < len ? r->size - used : len;
    uint64_t at = r->own & (r->size - 1);
    uint64_t first = r->size - at < n ? r->size - at : n;
    memcpy(r->data + at, src, first);
    memcpy(r->data, (const uint8_t *)src + first, n - first);
    r->own += n;
    atomic_store_explicit(&r->side->head, r->own, memory_order_release);
    return (int64_t)n;
}

/* Consumer: bytes available now, or (uint64_t)-1 when the producer's index is impossible. */
static inline uint64_t pilot_ring_available(const struct pilot_ring *r)
{
    return pilot_ring_used(r, atomic_load_explicit(&r->side->head, memory_order_acquire), r->own);
}

/* Consumer: copies up to cap available bytes out. Returns the bytes taken, or -1 as above. */
static inline int64_t pilot_ring_get(struct pilot_ring *r, void *dst, size_t cap)
{
    uint64_t avail = pilot_ring_available(r);
    if (avail == (uint64_t)-1)
        return -1;
    uint64_t n = avail < cap ? avail : cap;
    uint64_t at = r->own & (r->size - 1);
    uint64_t first = r->size - at < n ? r->size - at : n;
    memcpy(dst, r->data + at, first);
    memcpy((uint8_t *)dst + first, r->data, n - first);
    r->own += n;
    atomic_store_explicit(&r->side->tail, r->own, memory_order_release);
    return (int64_t)n;
}

/* After a put: whether the consumer sleeps and needs the doorbell. */
static inline int pilot_ring_consumer_asleep(const struct pilot_ring *r)
{
    atomic_thread_fence(memory_order_seq_cst);
    return atomic_load_explicit(&r->side->consumer_sleeping, memory_order_relaxed) != 0;
}

/* After a get: whether the producer waits for space and needs the doorbell. */
static inline int pilot_ring_producer_waits(const struct pilot_ring *r)
{
    atomic_thread_fence(memory_order_seq_cst);
    return atomic_load_explicit(&r->side->producer_waiting, memory_order_relaxed) != 0;
}

/* Consumer about to sleep: 1 if it may (the flag is set and nothing arrived meanwhile), 0 if
 * bytes are there after all (the flag is cleared again). */
static inline int pilot_ring_prepare_sleep(struct pilot_ring *r)
{
    atomic_store_explicit(&r->side->consumer_sleeping, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    if (pilot_ring_available(r) != 0) {
        atomic_store_explicit(&r->side->consumer_sleeping, 0, memory_order_relaxed);
        return 0;
    }
    return 1;
}

static inline void pilot_ring_awake(struct pilot_ring *r)
{
    atomic_store_explicit(&r->side->consumer_sleeping, 0, memory_order_relaxed);
}

/* Producer about to wait for space: 1 if it must (flag set, still full), 0 if space came. */
static inline int pilot_ring_prepare_wait(struct pilot_ring *r)
{
    atomic_store_explicit(&r->side->producer_waiting, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t used = pilot_ring_used(r, r->own, atomic_load_explicit(&r->side->tail,
                                                                    memory_order_acquire));
    if (used != r->size) { /* space, or an impossible index the next put reports */
        atomic_store_explicit(&r->side->producer_waiting, 0, memory_order_relaxed);
        return 0;
    }
    return 1;
}

static inline void pilot_ring_done_waiting(struct pilot_ring *r)
{
    atomic_store_explicit(&r->side->producer_waiting, 0, memory_order_relaxed);
}

/* The doorbell: one byte on the connection's socket for a peer that sleeps. A full socket buffer
 * holds doorbells the peer has not read yet, so EAGAIN loses nothing; a gone peer shows as EOF
 * on the next read. */
static inline void pilot_ring_doorbell(int fd)
{
    static const char bell = 'd';
    while (send(fd, &bell, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno == EINTR)
        ;
}

/* Reads every doorbell waiting on the socket (their bytes mean nothing). 0 when it is empty,
 * -ECONNRESET when the peer has gone, else -errno. */
static inline int pilot_ring_drain_doorbells(int fd)
{
    uint8_t sink[256];
    for (;;) {
        ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n == 0)
            return -ECONNRESET;
        if (errno != EINTR)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
    }
}

#endif
