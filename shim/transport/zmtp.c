#include "zmtp.h"
#include "zmtp_wire.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int write_all(int fd, struct iovec *iov, int iovcnt)
{
    while (iovcnt > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

/* One recv of up to len bytes: how many came, or -errno (-ECONNRESET when the peer closed). */
static ssize_t recv_some(int fd, void *buf, size_t len)
{
    for (;;) {
        ssize_t n = recv(fd, buf, len, 0);
        if (n > 0)
            return n;
        if (n == 0)
            return -ECONNRESET;
        if (errno != EINTR)
            return -errno;
    }
}

/* ---- the rings (pilot_ring.h): the stream after RING_OPEN ---- */

static long long elapsed_us(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000LL + (t.tv_nsec - t0->tv_nsec) / 1000;
}

/* Sleeps until the socket says something: a doorbell (read and dropped) or pilotd's end
 * (-ECONNRESET). Every alive_ms without one, alive() is asked (-ETIMEDOUT when it says no).
 * Returns 0 when the caller should look at the ring again. */
static int ring_sleep(struct zmtp_conn *c)
{
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    int r = poll(&pfd, 1, c->alive_ms > 0 && c->alive ? c->alive_ms : -1);
    if (r < 0)
        return errno == EINTR ? 0 : -errno;
    if (r == 0)
        return c->alive() ? 0 : -ETIMEDOUT;
    return pilot_ring_drain_doorbells(c->fd);
}

/* Whether a caller that found its ring empty (or full) may poll it again: for spin_us from its
 * first look (*spinning is set then, with *t0), relaxing the core in between. */
static int keep_polling(const struct zmtp_conn *c, struct timespec *t0, int *spinning)
{
    if (!*spinning) {
        *spinning = 1;
        clock_gettime(CLOCK_MONOTONIC, t0);
    }
    if (elapsed_us(t0) >= c->spin_us)
        return 0;
    pilot_ring_relax();
    return 1;
}

/* Up to len bytes of replies: waits (spinning spin_us first) until some are there. */
static ssize_t ring_recv_some(struct zmtp_conn *c, void *buf, size_t len)
{
    struct timespec t0;
    int spinning = 0;
    for (;;) {
        int64_t n = pilot_ring_get(&c->rin, buf, len);
        if (n < 0)
            return -EPROTO;
        if (n > 0) {
            if (pilot_ring_producer_waits(&c->rin))
                pilot_ring_doorbell(c->fd);
            return (ssize_t)n;
        }
        if (keep_polling(c, &t0, &spinning))
            continue;
        if (pilot_ring_prepare_sleep(&c->rin)) {
            int rc = ring_sleep(c);
            pilot_ring_awake(&c->rin);
            if (rc)
                return rc;
        }
    }
}

/* Puts the whole of iov into the request ring, waiting for room as long as pilotd takes. */
static int ring_write_all(struct zmtp_conn *c, struct iovec *iov, int iovcnt)
{
    int wrote = 0;
    struct timespec t0;
    int spinning = 0;
    while (iovcnt > 0) {
        int64_t n = pilot_ring_put(&c->rout, iov->iov_base, iov->iov_len);
        if (n < 0)
            return -EPROTO;
        if (n > 0) {
            wrote = 1;
            spinning = 0;
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
            if (iov->iov_len == 0) {
                iov++;
                iovcnt--;
            }
            continue;
        }
        /* full: pilotd must take some; make sure it knows there is something to take */
        if (wrote && pilot_ring_consumer_asleep(&c->rout))
            pilot_ring_doorbell(c->fd);
        wrote = 0;
        if (keep_polling(c, &t0, &spinning))
            continue;
        if (pilot_ring_prepare_wait(&c->rout)) {
            int rc = ring_sleep(c);
            pilot_ring_done_waiting(&c->rout);
            if (rc)
                return rc;
        }
    }
    if (wrote && pilot_ring_consumer_asleep(&c->rout))
        pilot_ring_doorbell(c->fd);
    return 0;
}

static ssize_t conn_recv_some(struct zmtp_conn *c, void *buf, size_t len)
{
    return c->ring_map ? ring_recv_some(c, buf, len) : recv_some(c->fd, buf, len);
}

static int conn_read_all(struct zmtp_conn *c, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = conn_recv_some(c, p, len);
        if (n < 0)
            return (int)n;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int zmtp_use_ring(struct zmtp_conn *c, int fd)
{
    struct stat st;
    void *map = MAP_FAILED;
    errno = 0;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size == PILOT_RING_SHM_BYTES)
        map = mmap(NULL, PILOT_RING_SHM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = map == MAP_FAILED ? (errno ? errno : EPROTO) : 0;
    close(fd);
    if (err)
        return -err;
    const struct pilot_ring_shm *shm = map;
    if (shm->magic != PILOT_RING_MAGIC || shm->req_bytes != PILOT_RING_REQ_BYTES ||
        shm->rep_bytes != PILOT_RING_REP_BYTES) {
        munmap(map, PILOT_RING_SHM_BYTES);
        return -EPROTO;
    }
    c->ring_map = map;
    pilot_ring_views(map, 1, &c->rout, &c->rin);
    return 0;
}

/* The completion word (pilot_ring.h's GPU page): polled with the core relaxed for the first
 * WORD_SPIN_US, as the driver's own synchronization spins, then giving the core away between
 * looks (sched_yield), so tenants that wait long leave the CPU to those that work. */
#define WORD_SPIN_US 20

int zmtp_wait_word(struct zmtp_conn *c, uint32_t target, long budget_us, void *out, size_t len)
{
    const struct pilot_ring_gpu_page *page =
        c->ring_map ? &((const struct pilot_ring_shm *)c->ring_map)->gpu : NULL;
    if (!page || len > PILOT_RING_GPU_DATA)
        return -1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0; !pilot_ring_word_reached(page, target); i++) {
        if ((i & 63) != 63) {
            pilot_ring_relax();
            continue;
        }
        long long us = elapsed_us(&t0);
        if (us >= budget_us)
            return -1;
        if (us >= WORD_SPIN_US)
            sched_yield();
    }
    if (len)
        memcpy(out, page->data, len);
    return 0;
}

int zmtp_has_word(const struct zmtp_conn *c)
{
    return c->ring_map != NULL;
}

static void ring_unmap(struct zmtp_conn *c)
{
    if (c->ring_map)
        munmap(c->ring_map, PILOT_RING_SHM_BYTES);
    c->ring_map = NULL;
}

void zmtp_abandon(struct zmtp_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    ring_unmap(c);
}

/* len bytes of the connection's stream: first what was read ahead, then straight from the
 * socket when len is large, else through the read-ahead buffer (one recv of whatever has
 * arrived). */
static int conn_read(struct zmtp_conn *c, void *dst, size_t len)
{
    uint8_t *p = dst;
    size_t have = c->rlen - c->rpos;
    if (have) {
        size_t n = have < len ? have : len;
        memcpy(p, c->ahead + c->rpos, n);
        c->rpos += (uint32_t)n;
        p += n;
        len -= n;
    }
    if (len >= sizeof c->ahead)
        return conn_read_all(c, p, len);
    while (len > 0) {
        ssize_t n = conn_recv_some(c, c->ahead, sizeof c->ahead);
        if (n < 0)
            return (int)n;
        size_t k = (size_t)n < len ? (size_t)n : len;
        memcpy(p, c->ahead, k);
        c->rpos = (uint32_t)k;
        c->rlen = (uint32_t)n;
        p += k;
        len -= k;
    }
    return 0;
}

/* Reads one frame header; returns 0 and fills flags/size. */
static int read_frame_header(struct zmtp_conn *c, uint8_t *flags, uint64_t *size)
{
    uint8_t hdr[ZMTP_HEADER_MAX];
    int rc = conn_read(c, hdr, 2);
    if (rc == 0 && (hdr[0] & ZMTP_FLAG_LONG))
        rc = conn_read(c, hdr + 2, 7);
    if (rc)
        return rc;
    zmtp_decode_header(hdr, sizeof hdr, flags, size);
    return 0;
}

static int ensure_cap(struct zmtp_conn *c, size_t need)
{
    if (need <= c->cap)
        return 0;
    size_t cap = c->cap ? c->cap : 4096;
    while (cap < need)
        cap *= 2;
    uint8_t *nb = realloc(c->buf, cap);
    if (!nb)
        return -ENOMEM;
    c->buf = nb;
    c->cap = cap;
    return 0;
}

static int discard(struct zmtp_conn *c, uint64_t size)
{
    char sink[256];
    while (size > 0) {
        size_t n = size > sizeof sink ? sizeof sink : (size_t)size;
        int rc = conn_read(c, sink, n);
        if (rc)
            return rc;
        size -= n;
    }
    return 0;
}

static int handshake(struct zmtp_conn *c)
{
    /* Greeting: signature, version 3.0, mechanism NULL, as-server 0, filler. */
    uint8_t greeting[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0};
    memcpy(greeting + 12, "NULL", 4);
    /* READY command with Socket-Type=DEALER. */
    static const char ready_body[] = "\x05READY\x0bSocket-Type\x00\x00\x00\x06" "DEALER";
    uint8_t ready_hdr[2] = {ZMTP_FLAG_COMMAND, sizeof ready_body - 1};
    struct iovec iov[3] = {
        {greeting, sizeof greeting},
        {ready_hdr, sizeof ready_hdr},
        {(void *)ready_body, sizeof ready_body - 1},
    };
    int rc = write_all(c->fd, iov, 3);
    if (rc)
        return rc;

    uint8_t peer[64];
    rc = conn_read(c, peer, sizeof peer);
    if (rc)
        return rc;
    if (peer[0] != 0xff || peer[9] != 0x7f || peer[10] < 3 || memcmp(peer + 12, "NULL", 5) != 0)
        return -EPROTO;
    /* The peer's READY command (properties are not needed). */
    uint8_t flags;
    uint64_t size;
    rc = read_frame_header(c, &flags, &size);
    if (rc)
        return rc;
    if (!(flags & ZMTP_FLAG_COMMAND) || size < 6 || size > 4096)
        return -EPROTO;
    if ((rc = ensure_cap(c, (size_t)size)))
        return rc;
    rc = conn_read(c, c->buf, (size_t)size);
    if (rc)
        return rc;
    if (c->buf[0] != 5 || memcmp(c->buf + 1, "READY", 5) != 0)
        return -EPROTO;
    return 0;
}

int zmtp_set_timeout(struct zmtp_conn *c, int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    if (c->fd < 0)
        return -ENOTCONN;
    if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
        return -errno;
    return 0;
}

int zmtp_connect(struct zmtp_conn *c, const char *path)
{
    return zmtp_connect_timeout(c, path, 0);
}

int zmtp_connect_timeout(struct zmtp_conn *c, const char *path, int ms)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    c->fd = -1;
    c->rpos = c->rlen = 0;
    c->ring_map = NULL;
    if (strlen(path) >= sizeof addr.sun_path)
        return -ENAMETOOLONG;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    c->fd = fd;
    int rc = ms > 0 ? zmtp_set_timeout(c, ms) : 0;
    if (rc == 0)
        rc = handshake(c);
    if (rc) {
        zmtp_close(c);
        return rc;
    }
    return 0;
}

void zmtp_close(struct zmtp_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    ring_unmap(c);
    c->rpos = c->rlen = 0;
    free(c->buf);
    c->buf = NULL;
    c->cap = 0;
}

int zmtp_send(struct zmtp_conn *c, const struct zmtp_frame *frames, int nframes)
{
    uint8_t hdrs[ZMTP_MAX_FRAMES][ZMTP_HEADER_MAX];
    struct iovec iov[2 * ZMTP_MAX_FRAMES];
    int n = 0;
    if (c->fd < 0)
        return -ENOTCONN;
    if (nframes < 1 || nframes > ZMTP_MAX_FRAMES)
        return -EINVAL;
    for (int i = 0; i < nframes; i++) {
        uint8_t flags = i + 1 < nframes ? ZMTP_FLAG_MORE : 0;
        size_t hl = zmtp_encode_header(hdrs[i], flags, frames[i].len);
        iov[n].iov_base = hdrs[i];
        iov[n++].iov_len = hl;
        if (frames[i].len) {
            iov[n].iov_base = (void *)frames[i].data;
            iov[n++].iov_len = frames[i].len;
        }
    }
    return c->ring_map ? ring_write_all(c, iov, n) : write_all(c->fd, iov, n);
}

/* Replies to short calls arrive within tens of microseconds: polling for that long avoids the
 * scheduler's wake-up latency. Longer waits (a synchronize on a long kernel) then block. */
static int spin_until_readable(struct zmtp_conn *c)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        /* what arrives is read ahead at once: the parse then needs no further recv */
        ssize_t n = recv(c->fd, c->ahead, sizeof c->ahead, MSG_DONTWAIT);
        if (n > 0) {
            c->rpos = 0;
            c->rlen = (uint32_t)n;
            return 1;
        }
        if (n == 0 || errno != EAGAIN)
            return 1; /* closed or failed: the reads below report it */
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 >= c->spin_us)
            return 0;
    }
}

int zmtp_recv(struct zmtp_conn *c, struct zmtp_frame *frames, int max_frames)
{
    size_t offsets[ZMTP_MAX_FRAMES];
    size_t lens[ZMTP_MAX_FRAMES];
    size_t used = 0;
    int count = 0;
    if (c->fd < 0)
        return -ENOTCONN;
    /* with rings, conn_read waits itself (spinning, then sleeping on the doorbell) */
    int ready = c->ring_map || c->rpos < c->rlen || (c->spin_us > 0 && spin_until_readable(c));
    while (!ready && c->alive_ms > 0 && c->alive) { /* a long wait: is the peer still there? */
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int r = poll(&pfd, 1, c->alive_ms);
        if (r > 0 || (r < 0 && errno != EINTR))
            break;
        if (r == 0 && !c->alive())
            return -ETIMEDOUT;
    }
    for (;;) {
        uint8_t flags;
        uint64_t size;
        int rc = read_frame_header(c, &flags, &size);
        if (rc)
            return rc;
        if (flags & ZMTP_FLAG_COMMAND) { /* PING and friends: not used by pilotd; skip */
            if ((rc = discard(c, size)))
                return rc;
            continue;
        }
        if (count >= max_frames || count >= ZMTP_MAX_FRAMES || size > (1ull << 40))
            return -EPROTO;
        if ((rc = ensure_cap(c, used + (size_t)size + 1)))
            return rc;
        if ((rc = conn_read(c, c->buf + used, (size_t)size)))
            return rc;
        offsets[count] = used;
        lens[count] = (size_t)size;
        used += (size_t)size;
        used = (used + 7) & ~(size_t)7; /* keep each frame 8-byte aligned for struct access */
        count++;
        if (!(flags & ZMTP_FLAG_MORE))
            break;
    }
    for (int i = 0; i < count; i++) {
        frames[i].data = c->buf + offsets[i];
        frames[i].len = lens[i];
    }
    return count;
}

int zmtp_recv_fd(struct zmtp_conn *c, struct zmtp_frame *frames, int max_frames, int *fd)
{
    *fd = -1;
    if (c->fd < 0 || c->ring_map)
        return -ENOTCONN;
    if (c->rpos != c->rlen)
        return -EPROTO;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {c->ahead, sizeof c->ahead};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t n;
    while ((n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
        ;
    if (n <= 0)
        return n == 0 ? -ECONNRESET : -errno;
    c->rpos = 0;
    c->rlen = (uint32_t)n;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN(sizeof(int)) && *fd < 0)
            memcpy(fd, CMSG_DATA(cm), sizeof(int));
    int rc = zmtp_recv(c, frames, max_frames);
    if (rc < 0 && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}
