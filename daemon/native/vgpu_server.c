/* ZMTP/3.0 server side for the vGPU endpoints (see vgpu_server.h for why it exists).
 *
 * One thread drives a server. Each connection has an input buffer; wait() compacts the buffers
 * (everything it handed out before is consumed by then), reads what the sockets hold, and cuts
 * whole messages out of the buffers without copying them. Level-triggered epoll, non-blocking
 * sockets; a connection that breaks the protocol is closed, never the server. */
#define _GNU_SOURCE
#include "vgpu_server.h"
#include "fast_launch.h"
#include "pilot_proto.h"
#include "pilot_ring.h"
#include "spin_budget.h"
#include "zmtp_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAMES 4
#define MAX_MESSAGE (1ull << 30)     /* no request is larger (fatbin images included) */
#define PRE_ATTACH_MAX (64u << 10)   /* until ATTACH succeeds: ATTACH (and a refusal) is small */
#define READ_CHUNK (256u << 10)      /* bytes read per connection per wake-up, at most */
#define MAX_CONNECTIONS 4096
#define OUT_MAX (1u << 20)           /* replies queued for a peer that does not read, at most */
#define ERR_NOT_SUPPORTED 801        /* cudaErrorNotSupported: a RING_OPEN refused */

enum conn_state { ST_GREETING, ST_READY, ST_OPEN };

struct conn {
    int fd;
    uint32_t id;
    enum conn_state state;
    int dead;
    uint32_t uid, gid;
    int32_t pid;
    uint64_t max_message; /* PRE_ATTACH_MAX until pilot_srv_trust, then MAX_MESSAGE */
    int fast_state;       /* in filter_fast: STATE_FAST until one of its messages goes to Python */
    uint8_t *buf;
    size_t cap, len, pos; /* unparsed bytes are buf[pos, len) */
    uint8_t *out;         /* replies the socket did not take yet: out[out_pos, out_len) */
    size_t out_len, out_pos;
    /* After RING_OPEN the byte stream runs through shared-memory rings (pilot_ring.h) and the
     * socket carries only doorbells and EOF. */
    void *ring_map;
    struct pilot_ring rin, rout; /* requests in, replies out */
    struct conn *next;
};

struct pilot_srv {
    int lfd, efd, cfd;
    int spare; /* a descriptor kept to be given up when accept() meets EMFILE (refuse_one) */
    uint32_t next_id;
    int nconns;
    struct conn *conns;
    struct conn *rr; /* where the next collect() starts, for fairness */
    pilot_srv_filter_fn filter; /* runs messages in C as they arrive (fast_launch.c), or NULL */
    void *filter_ctx;
    pilot_srv_ring_release_fn ring_release; /* before a ring is unmapped (fast_words.c) */
    void *ring_release_ctx;
    size_t *starts;   /* where each collected message began in its connection's buffer */
    int starts_cap;
};

static char LISTEN_TAG, CONTROL_TAG;

/* pilot_srv_set_limits: over every server of the process, and per uid on one server */
static _Atomic int g_conns_total, g_conns_max = MAX_CONNECTIONS, g_conns_per_uid = MAX_CONNECTIONS;
static _Atomic uint64_t g_refused;
static _Atomic uint32_t g_refused_uid = UINT32_MAX;

static void count_refusal(uint32_t uid)
{
    g_refused++;
    g_refused_uid = uid;
}

void pilot_srv_refusals(uint64_t *count, uint32_t *last_uid)
{
    *count = g_refused;
    *last_uid = g_refused_uid;
}

void pilot_srv_set_limits(int total, int per_uid)
{
    g_conns_max = total > 0 ? total : MAX_CONNECTIONS;
    g_conns_per_uid = per_uid > 0 ? per_uid : MAX_CONNECTIONS;
}

/* pilot_srv_session_uid: the uids that hold sessions in this process, with their counts. */
#define SESSION_UIDS 4096
static struct { uint32_t uid; int sessions; } g_session_uids[SESSION_UIDS];
static int g_session_uid_count, g_session_uids_full;
static pthread_mutex_t g_session_uids_lock = PTHREAD_MUTEX_INITIALIZER;

int pilot_srv_session_uid(uint32_t uid, int delta)
{
    pthread_mutex_lock(&g_session_uids_lock);
    int i = 0, now = -1;
    while (i < g_session_uid_count && g_session_uids[i].uid != uid)
        i++;
    if (i == g_session_uid_count && delta > 0) {
        if (i < SESSION_UIDS) {
            g_session_uids[i].uid = uid;
            g_session_uids[i].sessions = 0;
            g_session_uid_count++;
        } else {
            g_session_uids_full = 1;
        }
    }
    if (i < g_session_uid_count) {
        int n = g_session_uids[i].sessions + delta;
        now = n > 0 ? n : 0;
        if (now > 0) {
            g_session_uids[i].sessions = now;
        } else { /* the last one of the uid: its slot goes to the end's */
            g_session_uids[i] = g_session_uids[--g_session_uid_count];
        }
    }
    if (g_session_uids_full)
        now = -1;
    pthread_mutex_unlock(&g_session_uids_lock);
    return now;
}

static int holds_session(uint32_t uid)
{
    if (uid == 0)
        return 1;
    pthread_mutex_lock(&g_session_uids_lock);
    int found = g_session_uids_full;
    for (int i = 0; !found && i < g_session_uid_count; i++)
        found = g_session_uids[i].uid == uid;
    pthread_mutex_unlock(&g_session_uids_lock);
    return found;
}

/* Whether a connection of `uid` may be kept: it holds a session here, and the server's and the
 * process's limits. */
static int admit(const pilot_srv *s, uint32_t uid)
{
    if (s->nconns >= MAX_CONNECTIONS || g_conns_total >= g_conns_max || !holds_session(uid))
        return 0;
    int held = 0;
    for (const struct conn *c = s->conns; c; c = c->next)
        held += !c->dead && c->uid == uid;
    return held < g_conns_per_uid;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static size_t write_some(int fd, struct iovec *iov, int *iovcnt);
static void flush_out(pilot_srv *s, struct conn *c);

static void kill_conn(pilot_srv *s, struct conn *c)
{
    if (c->dead)
        return;
    if (c->out_len != c->out_pos && !c->ring_map) { /* what the socket takes now of the queued replies */
        struct iovec iov = {c->out + c->out_pos, c->out_len - c->out_pos};
        int iovcnt = 1;
        write_some(c->fd, &iov, &iovcnt);
    }
    epoll_ctl(s->efd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    c->dead = 1;
    if (c->ring_map) { /* no frame points into it: messages are copied out before parsing */
        if (!s->ring_release || !s->ring_release(s->ring_release_ctx, c->id, c->ring_map))
            munmap(c->ring_map, PILOT_RING_SHM_BYTES);
        c->ring_map = NULL;
    }
}

/* write_some for a ring connection: puts what the reply ring takes now. Returns the bytes left,
 * or (size_t)-1 when the peer's index is impossible. Rings the doorbell if the peer sleeps. */
static size_t ring_write_some(struct conn *c, struct iovec *iov, int *iovcnt)
{
    int wrote = 0;
    while (*iovcnt > 0) {
        int64_t n = pilot_ring_put(&c->rout, iov->iov_base, iov->iov_len);
        if (n < 0)
            return (size_t)-1;
        wrote |= n > 0;
        if ((size_t)n < iov->iov_len) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
            break;
        }
        iov++;
        (*iovcnt)--;
    }
    if (wrote && pilot_ring_consumer_asleep(&c->rout))
        pilot_ring_doorbell(c->fd);
    size_t left = 0;
    for (int i = 0; i < *iovcnt; i++)
        left += iov[i].iov_len;
    return left;
}

/* Writes what the socket takes now, without waiting; advances iov. Returns the bytes left, or
 * (size_t)-1 when the peer is gone. */
static size_t write_some(int fd, struct iovec *iov, int *iovcnt)
{
    while (*iovcnt > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)*iovcnt};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                break;
            return (size_t)-1;
        }
        while (*iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            (*iovcnt)--;
        }
        if (*iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    size_t left = 0;
    for (int i = 0; i < *iovcnt; i++)
        left += iov[i].iov_len;
    return left;
}

/* The vGPU thread never waits for a peer: what its socket does not take is queued (at most
 * OUT_MAX; a peer that lets more pile up is dropped) and written when it becomes writable. */
static int queue_out(pilot_srv *s, struct conn *c, struct iovec *iov, int iovcnt)
{
    if (c->out_len == c->out_pos) {
        c->out_len = c->out_pos = 0;
        size_t left = c->ring_map ? ring_write_some(c, iov, &iovcnt)
                                  : write_some(c->fd, iov, &iovcnt);
        if (left == (size_t)-1)
            return -1;
        if (left == 0)
            return 0;
        /* iov now holds the rest */
    }
    size_t add = 0;
    for (int i = 0; i < iovcnt; i++)
        add += iov[i].iov_len;
    if (c->out_len - c->out_pos + add > OUT_MAX)
        return -1;
    if (c->out_pos > 0) {
        memmove(c->out, c->out + c->out_pos, c->out_len - c->out_pos);
        c->out_len -= c->out_pos;
        c->out_pos = 0;
    }
    uint8_t *nb = realloc(c->out, c->out_len + add);
    if (!nb)
        return -1;
    c->out = nb;
    for (int i = 0; i < iovcnt; i++) {
        memcpy(c->out + c->out_len, iov[i].iov_base, iov[i].iov_len);
        c->out_len += iov[i].iov_len;
    }
    if (c->ring_map) { /* the peer's doorbell says when it took some; wait() flushes then */
        if (!pilot_ring_prepare_wait(&c->rout))
            flush_out(s, c);
        return 0;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    return epoll_ctl(s->efd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* The peer's socket is writable: write what is queued; stop watching for it once done. */
static void flush_out(pilot_srv *s, struct conn *c)
{
    if (c->dead || c->out_len == c->out_pos)
        return;
    struct iovec iov = {c->out + c->out_pos, c->out_len - c->out_pos};
    int iovcnt = 1;
    size_t left = c->ring_map ? ring_write_some(c, &iov, &iovcnt) : write_some(c->fd, &iov, &iovcnt);
    if (left == (size_t)-1) {
        kill_conn(s, c);
        return;
    }
    c->out_pos = c->out_len - left;
    if (c->ring_map) {
        if (left == 0) {
            c->out_len = c->out_pos = 0;
            pilot_ring_done_waiting(&c->rout);
        } else if (!pilot_ring_prepare_wait(&c->rout)) {
            flush_out(s, c); /* the peer took some meanwhile */
        }
        return;
    }
    if (left == 0) {
        c->out_len = c->out_pos = 0;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->efd, EPOLL_CTL_MOD, c->fd, &ev) != 0)
            kill_conn(s, c);
    }
}

/* Out of descriptors (EMFILE, ENFILE): give up the spare one to take a connection off the
 * listen queue and close it, then take the spare again. Without it the connection would stay
 * queued and the listening socket readable: this thread would spin. 1: one was refused. */
static int refuse_one(pilot_srv *s)
{
    if (s->spare >= 0)
        close(s->spare);
    int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        count_refusal(UINT32_MAX);
    }
    s->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd >= 0;
}

/* Connections accepted (or refused) per wake-up of the thread: the rest wait in the backlog for
 * its next round (the listening socket is level-triggered), so the sessions' messages and rings
 * are served between batches. A flood of another user's connections on a vGPU's socket, each
 * accepted and closed here, delayed its tenant's copies 2.5x at p99 on the H200 when the thread
 * took the whole backlog at once (tests/gpu/flood_latency.py). */
#define ACCEPT_BATCH 4

static void accept_all(pilot_srv *s)
{
    /* Greeting (ZMTP 3.0, NULL mechanism, as-server) and READY (Socket-Type ROUTER), sent at once. */
    static const char ready[] = "\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER";
    uint8_t hello[64 + 2 + sizeof ready - 1] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0};
    memcpy(hello + 12, "NULL", 4);
    hello[32] = 1; /* as-server */
    hello[64] = ZMTP_FLAG_COMMAND;
    hello[65] = sizeof ready - 1;
    memcpy(hello + 66, ready, sizeof ready - 1);

    for (int taken = 0; taken < ACCEPT_BATCH; taken++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if ((errno == EMFILE || errno == ENFILE) && refuse_one(s))
                continue;
            return;
        }
        struct ucred cred;
        socklen_t len = sizeof cred;
        struct conn *c = NULL;
        int known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
        if (!known || !admit(s, cred.uid) || !(c = calloc(1, sizeof *c))) {
            close(fd);
            count_refusal(known ? cred.uid : UINT32_MAX);
            continue;
        }
        c->fd = fd;
        c->id = ++s->next_id;
        c->uid = cred.uid;
        c->gid = cred.gid;
        c->pid = cred.pid;
        c->max_message = PRE_ATTACH_MAX;
        struct iovec iov = {hello, sizeof hello};
        int iovcnt = 1;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        /* a fresh socket's buffer takes the 100-byte greeting whole */
        if (write_some(fd, &iov, &iovcnt) != 0 || epoll_ctl(s->efd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = s->conns;
        s->conns = c;
        s->nconns++;
        g_conns_total++;
    }
}

/* Room for at least 64 KiB more in c's input buffer; 0, or -1 (the connection is closed). */
static int reserve_input(pilot_srv *s, struct conn *c)
{
    if (c->cap - c->len >= 65536)
        return 0;
    size_t cap = c->cap ? c->cap * 2 : 131072;
    uint8_t *nb = realloc(c->buf, cap);
    if (!nb) {
        kill_conn(s, c);
        return -1;
    }
    c->buf = nb;
    c->cap = cap;
    return 0;
}

/* A ring connection's requests: copied out of the ring into its input buffer (parsed there, so
 * nothing the client writes to the ring later changes them), up to READ_CHUNK per round. */
static void pull_ring(pilot_srv *s, struct conn *c)
{
    size_t budget = READ_CHUNK;
    int took = 0;
    while (budget > 0 && !c->dead) {
        uint64_t avail = pilot_ring_available(&c->rin);
        if (avail == 0)
            break;
        if (reserve_input(s, c) != 0)
            return;
        size_t room = c->cap - c->len < budget ? c->cap - c->len : budget;
        int64_t n = pilot_ring_get(&c->rin, c->buf + c->len, room);
        if (n < 0) {
            kill_conn(s, c); /* an impossible index: a broken or hostile client */
            return;
        }
        c->len += (size_t)n;
        budget -= (size_t)n;
        took = 1;
    }
    if (took && pilot_ring_producer_waits(&c->rin))
        pilot_ring_doorbell(c->fd);
}

static void read_available(pilot_srv *s, struct conn *c)
{
    size_t budget = READ_CHUNK;
    if (c->ring_map) {
        if (pilot_ring_drain_doorbells(c->fd) != 0) { /* the peer is gone */
            kill_conn(s, c);
            return;
        }
        flush_out(s, c); /* a doorbell may say the peer made room for queued replies */
        pull_ring(s, c);
        return;
    }
    while (budget > 0 && !c->dead) {
        if (reserve_input(s, c) != 0)
            return;
        size_t want = c->cap - c->len < budget ? c->cap - c->len : budget;
        ssize_t n = recv(c->fd, c->buf + c->len, want, 0);
        if (n > 0) {
            c->len += (size_t)n;
            budget -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EINTR))
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        kill_conn(s, c); /* EOF or error: the peer is gone */
    }
}

/* Moves a connection through the handshake. Returns 1 if it is open for messages. */
static int handshake(pilot_srv *s, struct conn *c)
{
    if (c->state == ST_GREETING) {
        if (c->len - c->pos < 64)
            return 0;
        const uint8_t *g = c->buf + c->pos;
        if (g[0] != 0xff || g[9] != 0x7f || g[10] < 3 || memcmp(g + 12, "NULL", 5) != 0) {
            kill_conn(s, c);
            return 0;
        }
        c->pos += 64;
        c->state = ST_READY;
    }
    if (c->state == ST_READY) {
        uint8_t flags;
        uint64_t size;
        size_t h = zmtp_decode_header(c->buf + c->pos, c->len - c->pos, &flags, &size);
        if (!h)
            return 0;
        if (!(flags & ZMTP_FLAG_COMMAND) || size < 6 || size > 4096) {
            kill_conn(s, c);
            return 0;
        }
        if (c->len - c->pos < h + size)
            return 0;
        const uint8_t *body = c->buf + c->pos + h;
        if (body[0] != 5 || memcmp(body + 1, "READY", 5) != 0) {
            kill_conn(s, c);
            return 0;
        }
        c->pos += h + size;
        c->state = ST_OPEN;
    }
    return 1;
}

static int send_frames(pilot_srv *s, uint32_t conn, const void *const *data, const size_t *lens,
                       int nframes);
static int frames_iov(uint8_t (*hdr)[ZMTP_HEADER_MAX], struct iovec *iov, const void *const *data,
                      const size_t *lens, int nframes);

/* RING_OPEN (pilot_ring.h): a memfd sealed against resizing, mapped here, handed to the client
 * with the status reply (SCM_RIGHTS); from the byte after the request on, both directions of the
 * stream run through its rings. Refused (cudaErrorNotSupported, the connection stays on its
 * socket) before ATTACH, a second time, or while replies or further requests are buffered. */
static void open_ring(pilot_srv *s, struct conn *c, const pilot_srv_msg *m)
{
    pilot_envelope env;
    memcpy(&env, m->frame[0], sizeof env);
    env.flags = 0;
    pilot_rep_status st = {.hdr = {.err = ERR_NOT_SUPPORTED}};
    const void *data[2] = {&env, &st};
    size_t lens[2] = {sizeof env, sizeof st};
    int fd = -1;
    void *map = MAP_FAILED;
    if (c->max_message != MAX_MESSAGE || c->ring_map || c->out_len != c->out_pos || c->pos != c->len)
        goto refuse;
    fd = memfd_create("pilot-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, PILOT_RING_SHM_BYTES) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        goto refuse;
    map = mmap(NULL, PILOT_RING_SHM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        goto refuse;
    struct pilot_ring_shm *shm = map;
    shm->magic = PILOT_RING_MAGIC;
    shm->req_bytes = PILOT_RING_REQ_BYTES;
    shm->rep_bytes = PILOT_RING_REP_BYTES;
    st.hdr.err = 0;
    uint8_t hdr[2][ZMTP_HEADER_MAX];
    struct iovec iov[4];
    int iovcnt = frames_iov(hdr, iov, data, lens, 2);
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control = {0};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++)
        total += iov[i].iov_len;
    ssize_t sent;
    while ((sent = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT)) < 0 && errno == EINTR)
        ;
    close(fd);
    if (sent != (ssize_t)total) { /* an empty socket buffer takes 40 bytes: the peer is gone */
        munmap(map, PILOT_RING_SHM_BYTES);
        kill_conn(s, c);
        return;
    }
    c->ring_map = map;
    pilot_ring_views(map, 0, &c->rout, &c->rin);
    return;
refuse:
    if (map != MAP_FAILED)
        munmap(map, PILOT_RING_SHM_BYTES);
    if (fd >= 0)
        close(fd);
    send_frames(s, c->id, data, lens, 2);
}

static int is_ring_open(const pilot_srv_msg *m)
{
    pilot_envelope env;
    if (m->nframes < 1 || m->len[0] < sizeof env)
        return 0;
    memcpy(&env, m->frame[0], sizeof env);
    return env.opcode == PILOT_OP_RING_OPEN;
}

/* Cuts one whole message out of c's buffer. 1: got one; 0: none complete yet. */
static int next_message(pilot_srv *s, struct conn *c, pilot_srv_msg *m)
{
    if (c->dead || !handshake(s, c))
        return 0;
    for (;;) {
        size_t p = c->pos;
        uint32_t n = 0;
        int command = 0;
        for (;;) {
            uint8_t flags;
            uint64_t size;
            size_t h = zmtp_decode_header(c->buf + p, c->len - p, &flags, &size);
            if (!h)
                return 0;
            if (size > c->max_message || (!(flags & ZMTP_FLAG_COMMAND) && n >= MAX_FRAMES)) {
                kill_conn(s, c);
                return 0;
            }
            if (c->len - p - h < size)
                return 0;
            command = flags & ZMTP_FLAG_COMMAND;
            if (!command) {
                m->frame[n] = c->buf + p + h;
                m->len[n] = size;
                n++;
            }
            p += h + size;
            if (command || !(flags & ZMTP_FLAG_MORE))
                break;
        }
        c->pos = p;
        if (command)
            continue; /* PING and friends: pilot's clients send none; skip */
        m->conn = c->id;
        m->nframes = n;
        if (is_ring_open(m)) {
            open_ring(s, c, m);
            if (c->dead)
                return 0;
            continue;
        }
        return 1;
    }
}

static int collect(pilot_srv *s, pilot_srv_msg *out, int max)
{
    int n = 0, progress = 1;
    if (s->filter && s->starts_cap < max) {
        size_t *starts = realloc(s->starts, (size_t)max * sizeof *starts);
        if (!starts)
            return -1;
        s->starts = starts;
        s->starts_cap = max;
    }
    while (n < max && progress) {
        progress = 0;
        struct conn *start = s->rr ? s->rr : s->conns;
        struct conn *c = start;
        while (c && n < max) {
            size_t at = c->pos;
            if (next_message(s, c, &out[n])) {
                if (s->starts)
                    s->starts[n] = at;
                n++;
                progress = 1;
            }
            c = c->next ? c->next : s->conns;
            if (c == start)
                break;
        }
        s->rr = c;
    }
    return n;
}

static struct conn *find(pilot_srv *s, uint32_t id);

/* A connection's messages in filter_fast: all run here so far; one went to Python, so the rest
 * go too; one went to Python and will teach the fast path, so the rest are put back. */
enum { STATE_FAST = 0, STATE_PYTHON, STATE_LEARNING };

/* Runs the launches of out[0..n) that the fast path can (fast_launch.c) and returns how many
 * messages are left for Python, moved to the front in order. Per connection, once one message
 * goes to Python the later ones do too; and when that one teaches the fast path something (the
 * first launch of a kernel or on a stream), the later ones are put back unread, to be taken
 * again after Python has handled it, when most of them can run here. */
static int filter_fast(pilot_srv *s, pilot_srv_msg *out, int n)
{
    int kept = 0;
    for (int i = 0; i < n; i++) {
        struct conn *c = find(s, out[i].conn);
        if (!c) {
            out[kept++] = out[i];
            continue;
        }
        if (c->fast_state == STATE_LEARNING) {
            if (c->pos > s->starts[i]) /* the first message after: read again from here */
                c->pos = s->starts[i];
            continue;
        }
        if (c->fast_state == STATE_FAST) {
            int r = s->filter(s->filter_ctx, s, &out[i]);
            if (r == FAST_DONE)
                continue;
            c->fast_state = r == FAST_LEARN ? STATE_LEARNING : STATE_PYTHON;
        }
        out[kept++] = out[i];
    }
    for (struct conn *c = s->conns; c; c = c->next)
        c->fast_state = STATE_FAST;
    return kept;
}

static void reap_and_compact(pilot_srv *s)
{
    struct conn **pp = &s->conns;
    while (*pp) {
        struct conn *c = *pp;
        if (c->dead) {
            *pp = c->next;
            if (s->rr == c)
                s->rr = NULL;
            free(c->buf);
            free(c->out);
            free(c);
            s->nconns--;
            g_conns_total--;
            continue;
        }
        if (c->pos) {
            memmove(c->buf, c->buf + c->pos, c->len - c->pos);
            c->len -= c->pos;
            c->pos = 0;
        }
        pp = &c->next;
    }
}

pilot_srv *pilot_srv_open(const char *path, int control_fd, char *err, size_t errlen)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    pilot_srv *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->lfd = s->efd = -1;
    s->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->cfd = control_fd;
    if (strlen(path) >= sizeof addr.sun_path) {
        snprintf(err, errlen, "socket path too long: %s", path);
        goto fail;
    }
    strcpy(addr.sun_path, path);
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    s->efd = epoll_create1(EPOLL_CLOEXEC);
    if (s->lfd < 0 || s->efd < 0 || bind(s->lfd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(s->lfd, 128) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &LISTEN_TAG};
    epoll_ctl(s->efd, EPOLL_CTL_ADD, s->lfd, &ev);
    if (control_fd >= 0) {
        struct epoll_event cev = {.events = EPOLLIN, .data.ptr = &CONTROL_TAG};
        epoll_ctl(s->efd, EPOLL_CTL_ADD, control_fd, &cev);
    }
    return s;
fail:
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->efd >= 0)
        close(s->efd);
    if (s->spare >= 0)
        close(s->spare);
    free(s);
    return NULL;
}

void pilot_srv_close(pilot_srv *s)
{
    if (!s)
        return;
    for (struct conn *c = s->conns; c; c = c->next)
        kill_conn(s, c);
    reap_and_compact(s);
    close(s->lfd);
    close(s->efd);
    if (s->spare >= 0)
        close(s->spare);
    free(s->starts);
    free(s);
}

/* Whether a ring connection has requests waiting in its ring (an impossible index counts: the
 * pull that follows closes the connection). */
static int rings_pending(const pilot_srv *s)
{
    for (const struct conn *c = s->conns; c; c = c->next)
        if (c->ring_map && !c->dead && pilot_ring_available(&c->rin) != 0)
            return 1;
    return 0;
}

/* Before the endpoint sleeps: every ring peer is told to ring the doorbell. 0 if a ring got
 * requests meanwhile (then it must not sleep; the flags are cleared again). */
static int rings_prepare_sleep(pilot_srv *s)
{
    int may = 1;
    for (struct conn *c = s->conns; c; c = c->next)
        if (c->ring_map && !c->dead && !pilot_ring_prepare_sleep(&c->rin))
            may = 0;
    if (!may)
        for (struct conn *c = s->conns; c; c = c->next)
            if (c->ring_map && !c->dead)
                pilot_ring_awake(&c->rin);
    return may;
}

static void rings_awake(pilot_srv *s)
{
    for (struct conn *c = s->conns; c; c = c->next)
        if (c->ring_map && !c->dead)
            pilot_ring_awake(&c->rin);
}

static void pull_rings(pilot_srv *s)
{
    for (struct conn *c = s->conns; c; c = c->next)
        if (c->ring_map && !c->dead)
            pull_ring(s, c);
}

/* One round: flush, then messages already read, else wait (spinning first) and read. Returns
 * the messages left for Python, or -1. *fast_round: messages came and C handled them all. */
static int wait_round(pilot_srv *s, int timeout_ms, int spin_us, pilot_srv_msg *out, int max,
                      int *control, int *fast_round)
{
    struct epoll_event ev[64];
    *fast_round = 0;
    for (struct conn *c = s->conns; c; c = c->next) /* replies queued for slow readers */
        if (c->out_len != c->out_pos)
            flush_out(s, c);
    reap_and_compact(s);
    pull_rings(s);
    int n = collect(s, out, max);
    if (n == 0) {
        int k = 0, rings = 0, spin = 0;
        /* else crowded, or the budget is spent: sleep */
        if (spin_us > 0 && pilot_spin_endpoint() && (spin = pilot_spin_take())) {
            uint64_t deadline = now_us() + (uint64_t)spin_us;
            do
                k = epoll_wait(s->efd, ev, 64, 0);
            while (k == 0 && !(rings = rings_pending(s)) && now_us() < deadline);
            pilot_spin_give(spin);
        }
        if (k == 0 && !rings && rings_prepare_sleep(s)) {
            k = epoll_wait(s->efd, ev, 64, timeout_ms);
            rings_awake(s);
        }
        if (k < 0)
            return errno == EINTR ? 0 : -1;
        for (int i = 0; i < k; i++) {
            if (ev[i].data.ptr == &LISTEN_TAG)
                accept_all(s);
            else if (ev[i].data.ptr == &CONTROL_TAG)
                *control = 1;
            else {
                struct conn *c = ev[i].data.ptr;
                if (ev[i].events & EPOLLOUT)
                    flush_out(s, c);
                if (ev[i].events & ~(uint32_t)EPOLLOUT)
                    read_available(s, c);
            }
        }
        pull_rings(s);
        n = collect(s, out, max);
    }
    if (!s->filter || n == 0)
        return n;
    int kept = filter_fast(s, out, n);
    *fast_round = kept == 0;
    return kept;
}

/* How long the endpoint goes on serving messages C handles whole before it returns to Python,
 * which folds what C did into its bookkeeping (metrics, work in flight): a sequence of round
 * trips (small copies, synchronizations) then waits for Python at most once per this period,
 * which is what the tail of their latency is made of. The vGPU's periodic work has the same
 * period (WAKE_MS in daemon/vgpu/server.py); a control command or a message for Python ends it
 * at once. */
#define FAST_HOLD_US 10000

int pilot_srv_wait(pilot_srv *s, int timeout_ms, int spin_us, pilot_srv_msg *out, int max,
                   int *control)
{
    *control = 0;
    int fast_round;
    int n = wait_round(s, timeout_ms, spin_us, out, max, control, &fast_round);
    if (n != 0 || !fast_round || *control)
        return n;
    uint64_t until = now_us() + FAST_HOLD_US;
    for (;;) {
        uint64_t now = now_us();
        if (now >= until)
            return 0;
        int left_ms = (int)((until - now + 999) / 1000);
        int wait_ms = timeout_ms >= 0 && timeout_ms < left_ms ? timeout_ms : left_ms;
        n = wait_round(s, wait_ms, spin_us, out, max, control, &fast_round);
        if (n != 0 || !fast_round || *control)
            return n;
    }
}

void pilot_srv_set_filter(pilot_srv *s, pilot_srv_filter_fn filter, void *ctx)
{
    s->filter = filter;
    s->filter_ctx = ctx;
}

void pilot_srv_set_ring_release(pilot_srv *s, pilot_srv_ring_release_fn fn, void *ctx)
{
    s->ring_release = fn;
    s->ring_release_ctx = ctx;
}

void *pilot_srv_ring_map(pilot_srv *s, uint32_t conn)
{
    struct conn *c = find(s, conn);
    return c && !c->dead ? c->ring_map : NULL;
}

static struct conn *find(pilot_srv *s, uint32_t id)
{
    for (struct conn *c = s->conns; c; c = c->next)
        if (c->id == id)
            return c->dead ? NULL : c;
    return NULL;
}

/* The iovec of a message of nframes frames (each header written into hdr[i]); its length. */
static int frames_iov(uint8_t (*hdr)[ZMTP_HEADER_MAX], struct iovec *iov, const void *const *data,
                      const size_t *lens, int nframes)
{
    int n = 0;
    for (int i = 0; i < nframes; i++) {
        iov[n].iov_base = hdr[i];
        iov[n++].iov_len = zmtp_encode_header(hdr[i], i + 1 < nframes ? ZMTP_FLAG_MORE : 0, lens[i]);
        if (lens[i]) {
            iov[n].iov_base = (void *)data[i];
            iov[n++].iov_len = lens[i];
        }
    }
    return n;
}

static int send_frames(pilot_srv *s, uint32_t conn, const void *const *data, const size_t *lens,
                       int nframes)
{
    struct conn *c = find(s, conn);
    if (!c)
        return -1;
    uint8_t hdr[4][ZMTP_HEADER_MAX];
    struct iovec iov[8];
    int n = frames_iov(hdr, iov, data, lens, nframes);
    if (queue_out(s, c, iov, n) != 0) {
        kill_conn(s, c);
        return -1;
    }
    return 0;
}

int pilot_srv_send(pilot_srv *s, uint32_t conn, const void *f0, size_t l0, const void *f1,
                   size_t l1, const void *f2, size_t l2)
{
    const void *data[3] = {f0, f1, f2};
    size_t lens[3] = {l0, l1, l2};
    return send_frames(s, conn, data, lens, f2 ? 3 : 2);
}

int pilot_srv_send4(pilot_srv *s, uint32_t conn, const void *f0, size_t l0, const void *f1,
                    size_t l1, const void *f2, size_t l2, const void *f3, size_t l3)
{
    const void *data[4] = {f0, f1, f2 ? f2 : f3, f3};
    size_t lens[4] = {l0, l1, f2 ? l2 : l3, l3};
    return send_frames(s, conn, data, lens, f2 ? 4 : 3);
}

int pilot_srv_peer(pilot_srv *s, uint32_t conn, uint32_t *uid, uint32_t *gid, int32_t *pid)
{
    struct conn *c = find(s, conn);
    if (!c)
        return -1;
    *uid = c->uid;
    *gid = c->gid;
    *pid = c->pid;
    return 0;
}

int pilot_srv_trust(pilot_srv *s, uint32_t conn)
{
    struct conn *c = find(s, conn);
    if (!c)
        return -1;
    c->max_message = MAX_MESSAGE;
    return 0;
}

int pilot_srv_disconnect(pilot_srv *s, uint32_t conn)
{
    struct conn *c = find(s, conn);
    if (!c)
        return -1;
    kill_conn(s, c); /* freed at the next wait, after any message of it still being handled */
    return 0;
}

int pilot_srv_connections(pilot_srv *s)
{
    return s->nconns;
}
