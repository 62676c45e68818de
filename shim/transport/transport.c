/* The session with pilotd: connection set-up, request/reply, asynchronous posts.
 *
 * A session has one part per device the program uses (daemon/devices.py): HELLO opens the
 * session and its part on device 0; the first call routed to another device sends DEVICE_JOIN,
 * which places a part on a vGPU of that GPU. Each part is one connection, to its vGPU's socket,
 * guarded by its own mutex: a synchronous call holds it from send to reply, so replies never
 * interleave, and threads working on different devices never wait for each other.
 *
 * Which part a call goes to: the calling thread's *route*, its current device (cudaSetDevice)
 * unless a pilot_route_begin() scope names the device of the pointer, stream or event the call
 * is about. Everything is blocking I/O on the calling thread; a daemon that exits closes the
 * sockets and every waiting call returns at once with an error.
 *
 * Layering (tests/unit/test_shim_layers.py checks it on the compiled objects): a module calls
 * only modules of its own layer or below.
 *   below the transport: log.c, socket_path.c, zmtp.c, error_state.c, the generated errors.c
 *   the transport:       this file
 *   above it:            everything else: api_*.c, registry.c, coherence.c, callbacks.c,
 *                        alloc_table.c, parallel_copy.c, device_props.c, cuda12_compat.c, and
 *                        the generated stubs.c
 * So the transport keeps what it needs to know of the threads above it (the current device
 * cudaSetDevice sets; whether a thread may call CUDA at all: pilot_refuse_thread_calls), and the
 * modules above arrange for themselves what they must do when a session ends: after fork each
 * resets its own state in its own child handler (see fork_child). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "shim.h"
#include "socket_path.h"
#include "zmtp.h"
#include "hooks.h"

/* CONN_FAILED: the set-up timed out or was refused (a stopped pilotd, a socket that is not
 * pilotd's main one): like CUDA's own initialisation errors, that is final for the process, so
 * later calls fail at once instead of each waiting PILOT_CONNECT_TIMEOUT again. A socket nobody
 * listens on is not: it fails fast, and pilotd may be started meanwhile. */
enum conn_state { CONN_NONE, CONN_READY, CONN_LOST, CONN_FAILED };

struct part {
    pthread_mutex_t lock;
    struct zmtp_conn conn;
    enum conn_state state;
};

static pthread_mutex_t g_session_lock = PTHREAD_MUTEX_INITIALIZER; /* HELLO, device info */
static enum conn_state g_state = CONN_NONE;                        /* of the session */
static uint64_t g_session;
static uint64_t g_seq;
static int g_device_count = 1;
static char g_callbacks[PILOT_ENDPOINT_MAX];
static int g_warned_absent;
static struct part g_parts[PILOT_MAX_DEVICES];
static pilot_rep_device_info g_infos[PILOT_MAX_DEVICES];
static int g_info_known[PILOT_MAX_DEVICES]; /* set (release) once g_infos[d] is filled */

static char g_endpoint[PILOT_ENDPOINT_MAX];  /* part 0's vGPU socket */
/* The main socket of the pilotd serving this session when HELLO was redirected there (the
 * program's tenant is isolated: router/isolation.py); empty: the usual one (socket_path.c). */
static char g_main_path[PILOT_ENDPOINT_MAX];
static __thread int t_refused;              /* pilot_refuse_thread_calls() was called */
static __thread int t_device;               /* the thread's current device (cudaSetDevice) */
static __thread int t_route = -1;           /* device of the call at hand, -1: t_device */

/* The fault channel: a second connection to the vGPU of the session's part 0, used only by the
 * unified-memory fault handler (coherence.c) to fetch shadow chunks. Its own lock and sequence
 * numbers mean a fault taken while this thread or another holds a part's lock never waits for
 * it. */
static pthread_mutex_t g_fault_lock = PTHREAD_MUTEX_INITIALIZER;
static struct zmtp_conn g_fault_conn = {.fd = -1};
static uint64_t g_fault_seq;
static struct pilot_staging g_fault_stage; /* the fault channel's own staging area (SHADOW_FETCH) */
static __thread struct part *t_locked;      /* the part pilot_lock_session locked */

/* Error every call returns while pilotd cannot be reached: to the program, no usable GPU. */
#define ERR_NO_DAEMON cudaErrorNoDevice
/* Error after the daemon went away mid-session: the session's state is gone for good. */
#define ERR_LOST cudaErrorDevicesUnavailable

static void init_parts(void)
{
    for (int d = 0; d < PILOT_MAX_DEVICES; d++) {
        pthread_mutex_init(&g_parts[d].lock, NULL);
        g_parts[d].conn.fd = -1;
        g_parts[d].state = CONN_NONE;
    }
}

static int g_ready_hooks_pending = 1; /* pilot_enter_session has not run the hooks yet */

/* After fork the child must not use the parent's connections or session: it starts afresh on
 * first use. This resets the transport's own state only: each module above that keeps state of
 * the parent's session registers its own child handler with PILOT_HOOK (shim/core/hooks.h), and
 * the registry's one pthread_atfork handler, registered before the program's constructors run
 * (a program's own child handler that calls CUDA finds the shim reset), runs them in the link
 * order of shim/build.py's SHIM_SOURCES, this one first; their relative order does not
 * matter. Each resets only its own module's state (api_symbols.c's also drops alloc_table.c's
 * symbol ranges, which alloc_table.c's own handler keeps while it drops the rest: in either order
 * the table ends empty); none talks to the daemon or waits for another module's state, and the
 * child runs nothing else until the last one has returned. */
static void fork_child(void)
{
    pthread_mutex_init(&g_session_lock, NULL);
    pthread_mutex_init(&g_fault_lock, NULL);
    g_main_path[0] = 0;
    if (g_fault_conn.fd >= 0)
        close(g_fault_conn.fd);
    g_fault_conn.fd = -1;
    pilot_staging_unmap(&g_fault_stage);
    for (int d = 0; d < PILOT_MAX_DEVICES; d++) {
        zmtp_abandon(&g_parts[d].conn);
        g_info_known[d] = 0;
    }
    init_parts();
    g_state = CONN_NONE;
    g_session = 0;
    g_device_count = 1;
    g_ready_hooks_pending = 1; /* the child's session is a new one */
}

__attribute__((constructor)) static void transport_init(void)
{
    init_parts();
}

PILOT_HOOK(transport, .on_fork_child = fork_child);

static void lose_connection(struct part *p, const char *why)
{
    if (p->state == CONN_READY)
        LOG_ERROR("pilot: lost connection to pilotd (%s); CUDA calls now fail", why);
    zmtp_close(&p->conn);
    p->state = CONN_LOST;
}

/* The socket error of the calling thread's last failed exchange (-ECONNRESET: pilotd closed the
 * connection), for the session set-up to tell a restarting pilotd from one that does not answer. */
static __thread int t_exchange_rc;

/* A session set-up step that failed because pilotd closed the connection mid-way: it restarts
 * (after a GPU fault, router/recovery.py) and keeps its listening socket, so try again. */
#define SETUP_RETRY (-3)

static int closed_by_peer(int rc)
{
    return rc == -ECONNRESET || rc == -EPIPE;
}

/* One request and its reply. fd: NULL, or where a descriptor the reply carries goes (-1: none;
 * closed again when the exchange fails). */
static cudaError_t exchange_fd(struct zmtp_conn *c, uint64_t *seq, uint32_t flags,
                               uint64_t session, uint16_t op, const void *req, size_t req_len,
                               const void *payload, size_t payload_len, struct zmtp_frame *reply,
                               int *nreply, int *fd)
{
    pilot_envelope env = {.version = PILOT_PROTO_VERSION, .opcode = op, .flags = flags,
                          .seq = __atomic_add_fetch(seq, 1, __ATOMIC_RELAXED), .session = session};
    struct zmtp_frame frames[3] = {{&env, sizeof env}, {req, req_len}, {payload, payload_len}};
    int rc = zmtp_send(c, frames, payload_len ? 3 : 2);
    t_exchange_rc = rc;
    if (rc)
        return ERR_LOST;
    int n = fd ? zmtp_recv_fd(c, reply, ZMTP_MAX_FRAMES, fd) : zmtp_recv(c, reply, ZMTP_MAX_FRAMES);
    t_exchange_rc = n < 0 ? n : 0;
    if (n < 2 || reply[0].len < sizeof(pilot_envelope) ||
        ((const pilot_envelope *)reply[0].data)->seq != env.seq ||
        reply[1].len < sizeof(pilot_reply_hdr)) {
        if (fd && *fd >= 0) {
            close(*fd);
            *fd = -1;
        }
        return ERR_LOST;
    }
    *nreply = n;
    return cudaSuccess;
}

static cudaError_t exchange_on(struct zmtp_conn *c, uint64_t *seq, uint32_t flags,
                               uint64_t session, uint16_t op, const void *req, size_t req_len,
                               const void *payload, size_t payload_len, struct zmtp_frame *reply,
                               int *nreply)
{
    return exchange_fd(c, seq, flags, session, op, req, req_len, payload, payload_len, reply,
                       nreply, NULL);
}

static cudaError_t exchange(struct zmtp_conn *c, uint64_t session, uint16_t op, const void *req,
                            size_t req_len, const void *payload, size_t payload_len,
                            struct zmtp_frame *reply, int *nreply)
{
    return exchange_on(c, &g_seq, 0, session, op, req, req_len, payload, payload_len, reply,
                       nreply);
}

/* $PILOT_SPIN_US: how long a waiting call polls before sleeping (default 50, 0 disables). */
static int spin_us(void)
{
    const char *env = getenv("PILOT_SPIN_US");
    if (!env || !*env)
        return 50;
    int v = atoi(env);
    return v < 0 ? 0 : v > 100000 ? 100000 : v;
}

/* $PILOT_CONNECT_TIMEOUT: seconds the set-up of a session (connect, HELLO, ATTACH) may take
 * before the program is told pilotd does not answer (default 10; a stopped pilotd, or a
 * PILOT_SOCKET naming another socket, must not hang the program). Calls of a live session
 * have no timeout: a synchronize may wait for an hour-long kernel. */
static int setup_timeout_ms(void)
{
    const char *env = getenv("PILOT_CONNECT_TIMEOUT");
    int s = env && *env ? atoi(env) : 10;
    return (s <= 0 ? 10 : s > 3600 ? 3600 : s) * 1000;
}

/* $PILOT_LIVENESS: seconds a call may wait for its reply before the shim asks pilotd's main
 * socket whether pilotd is alive (default 5; then again every as many seconds). Its router
 * answers whatever the vGPU threads are doing, so a synchronize on an hour-long kernel goes on;
 * a pilotd that is stopped or hung does not answer within PILOT_CONNECT_TIMEOUT, and the call
 * fails (cudaErrorDevicesUnavailable) instead of waiting for ever. */
static int liveness_ms(void)
{
    const char *env = getenv("PILOT_LIVENESS");
    int s = env && *env ? atoi(env) : 5;
    return (s <= 0 ? 5 : s > 3600 ? 3600 : s) * 1000;
}

/* The main socket's path: the redirected one, else the usual one. 0 or -1 (too long). */
static int main_socket_path(char *path, size_t len)
{
    if (!g_main_path[0])
        return pilot_socket_path(0, path, len);
    if (strlen(g_main_path) >= len)
        return -1;
    strcpy(path, g_main_path);
    return 0;
}

/* The trust check of socket_path.c, logged; 0 if `path` may be pilotd's. */
static int check_trusted(const char *path)
{
    char why[400];
    if (pilot_socket_trusted(path, why, sizeof why) == 0)
        return 0;
    LOG_ERROR("pilot: refusing to connect to %s: %s. CUDA calls fail.", path, why);
    return -1;
}

static int daemon_alive(void)
{
    char path[512];
    struct zmtp_conn c = {.fd = -1};
    struct zmtp_frame rep[ZMTP_MAX_FRAMES];
    uint64_t seq = 0;
    int n;
    if (main_socket_path(path, sizeof path) != 0)
        return 1; /* cannot tell: keep waiting */
    int ok = check_trusted(path) == 0 && zmtp_connect_timeout(&c, path, setup_timeout_ms()) == 0;
    if (ok)
        ok = exchange_on(&c, &seq, 0, g_session, PILOT_OP_PING, NULL, 0, NULL, 0, rep, &n) ==
                 cudaSuccess && n >= 2;
    zmtp_close(&c);
    if (!ok)
        LOG_ERROR("pilot: pilotd did not answer a liveness check within %d s (stopped? hung?)",
                  setup_timeout_ms() / 1000);
    return ok;
}

/* $PILOT_RING=0 keeps a session's calls on the socket instead of shared-memory rings. */
static int rings_wanted(void)
{
    const char *env = getenv("PILOT_RING");
    return !env || strcmp(env, "0") != 0;
}

/* Asks the vGPU endpoint to move the attached connection into shared-memory rings
 * (pilot_ring.h). 0: in rings, or left on the socket because pilotd declined (an older one,
 * say); -1: the connection failed. */
static int open_rings(struct part *p, uint64_t session)
{
    struct zmtp_frame rep[ZMTP_MAX_FRAMES];
    int n, fd = -1;
    if (exchange_fd(&p->conn, &g_seq, 0, session, PILOT_OP_RING_OPEN, NULL, 0, NULL, 0, rep, &n,
                    &fd) != cudaSuccess)
        return -1;
    pilot_reply_hdr hdr;
    memcpy(&hdr, rep[1].data, sizeof hdr);
    if (hdr.err || fd < 0) {
        if (fd >= 0)
            close(fd);
        LOG_INFO("pilotd keeps this connection on its socket (no shared-memory rings)");
        return 0;
    }
    int rc = zmtp_use_ring(&p->conn, fd);
    if (rc) {
        LOG_ERROR("pilot: cannot map pilotd's shared-memory rings: %s", strerror(-rc));
        return -1;
    }
    return 0;
}

/* Connects to a part's vGPU socket and attaches the session there. 0 or -1. */
static int attach(struct part *p, const pilot_rep_hello *hrep)
{
    struct zmtp_frame rep[ZMTP_MAX_FRAMES];
    int n;
    if (check_trusted(hrep->endpoint) != 0)
        return -1;
    int rc = zmtp_connect_timeout(&p->conn, hrep->endpoint, setup_timeout_ms());
    p->conn.spin_us = spin_us();
    if (rc) {
        if (closed_by_peer(rc) || rc == -ECONNREFUSED || rc == -ENOENT)
            return SETUP_RETRY; /* the vGPU of a pilotd that is restarting */
        LOG_ERROR("pilot: cannot attach to vGPU socket %s: %s", hrep->endpoint, strerror(-rc));
        return -1;
    }
    pilot_req_hello hello = {.proto_version = PILOT_PROTO_VERSION, .cuda_abi = CUDART_VERSION};
    pilot_rep_status st = {0};
    if (exchange(&p->conn, hrep->session, PILOT_OP_ATTACH, &hello, sizeof hello, NULL, 0, rep, &n) ||
        (memcpy(&st, rep[1].data, sizeof st), st.hdr.err)) {
        int retry = st.hdr.err ? pilot_error_is_sticky((cudaError_t)st.hdr.err)
                               : closed_by_peer(t_exchange_rc);
        zmtp_close(&p->conn);
        if (retry) /* its GPU faulted, or it closed the connection: it is restarting */
            return SETUP_RETRY;
        LOG_ERROR("pilot: pilotd refused to attach the session (or did not answer within %d s)",
                  setup_timeout_ms() / 1000);
        return -1;
    }
    if (rings_wanted() && open_rings(p, hrep->session) != 0) {
        int retry = closed_by_peer(t_exchange_rc);
        zmtp_close(&p->conn);
        return retry ? SETUP_RETRY : -1;
    }
    zmtp_set_timeout(&p->conn, 0); /* the session's calls may wait as long as their work, */
    p->conn.alive_ms = liveness_ms(); /* as long as pilotd is alive */
    p->conn.alive = daemon_alive;
    return 0;
}

/* One request on the main socket (HELLO, DEVICE_JOIN). 0 with *out filled; -2: nothing listens
 * there (or the socket cannot be opened); -1: no answer in time, or not an answer of pilotd's. */
static int main_socket_call(uint16_t op, uint64_t session, const void *req, size_t req_len,
                            pilot_rep_hello *out)
{
    char path[512];
    struct zmtp_conn main_conn = {.fd = -1};
    struct zmtp_frame rep[ZMTP_MAX_FRAMES];
    int n, rc;
    if (main_socket_path(path, sizeof path) != 0) {
        LOG_ERROR("pilot: socket path too long");
        return -1;
    }
    if (check_trusted(path) != 0)
        return -1;
    rc = zmtp_connect_timeout(&main_conn, path, setup_timeout_ms());
    if (closed_by_peer(rc))
        return SETUP_RETRY; /* accepted, then closed: pilotd restarted meanwhile */
    if (rc == -EAGAIN || rc == -ETIMEDOUT) { /* connected, but no greeting came back */
        LOG_ERROR("pilot: pilotd at %s did not answer within %d s (is it stopped? is that pilotd's "
                  "main socket?)", path, setup_timeout_ms() / 1000);
        return -1;
    }
    if (rc) {
        if (!g_warned_absent++)
            fprintf(stderr,
                    "pilot: cannot reach pilotd at %s (%s); is the daemon running? Start it with "
                    "`pilotd` or set PILOT_SOCKET. CUDA calls return cudaErrorNoDevice.\n",
                    path, strerror(-rc));
        return -2;
    }
    if (exchange(&main_conn, session, op, req, req_len, NULL, 0, rep, &n) ||
        rep[1].len < sizeof *out - sizeof out->callbacks) {
        if (closed_by_peer(t_exchange_rc)) {
            zmtp_close(&main_conn);
            return SETUP_RETRY;
        }
        LOG_ERROR("pilot: pilotd at %s did not answer within %d s (is it stopped? is that pilotd's "
                  "main socket?)", path, setup_timeout_ms() / 1000);
        zmtp_close(&main_conn);
        return -1;
    }
    memset(out, 0, sizeof *out);
    memcpy(out, rep[1].data, rep[1].len < sizeof *out ? rep[1].len : sizeof *out);
    zmtp_close(&main_conn);
    out->endpoint[sizeof out->endpoint - 1] = 0;
    out->callbacks[sizeof out->callbacks - 1] = 0;
    return 0;
}

static cudaError_t send_on(struct part *p, uint16_t op, uint32_t flags, const void *req,
                           size_t req_len, const void *payload, size_t payload_len);
static cudaError_t recv_on(struct part *p, void *rep, size_t rep_len, void *out, size_t out_cap,
                           size_t *out_len, uint32_t *reply_flags);

/* DEVICE_INFO for `device` on part 0 (locked by the caller) into g_infos. 0 or -1. */
static int info_on(struct part *p, int device)
{
    pilot_req_device req = {.device = device};
    pilot_rep_device_info rep;
    if (send_on(p, PILOT_OP_DEVICE_INFO, 0, &req, sizeof req, NULL, 0) != cudaSuccess ||
        recv_on(p, &rep, sizeof rep, NULL, 0, NULL, NULL) != cudaSuccess)
        return -1;
    g_infos[device] = rep;
    __atomic_store_n(&g_info_known[device], 1, __ATOMIC_RELEASE);
    return 0;
}

/* The program's device selection, as HELLO carries it: CUDA_VISIBLE_DEVICES (set or not, cut
 * after the last whole entry that fits) and CUDA_DEVICE_ORDER. pilotd parses and resolves it
 * against the GPUs it serves (daemon/sessions/visible.py), so the selection can only narrow. */
static void device_selection(pilot_req_hello *hello)
{
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    const char *order = getenv("CUDA_DEVICE_ORDER");
    if (order && strcmp(order, "PCI_BUS_ID") == 0)
        hello->flags |= PILOT_HELLO_PCI_BUS_ORDER;
    if (!visible)
        return;
    hello->flags |= PILOT_HELLO_VISIBLE_SET;
    size_t n = strlen(visible);
    if (n >= sizeof hello->visible_devices) {
        /* CUDA would read on; pilot keeps the entries that fit whole (16 devices at most) */
        n = sizeof hello->visible_devices - 1;
        while (n > 0 && visible[n] != ',')
            n--;
        LOG_WARN("pilot: CUDA_VISIBLE_DEVICES is longer than %zu bytes; its first %zu are used",
                 sizeof hello->visible_devices - 1, n);
    }
    memcpy(hello->visible_devices, visible, n);
    hello->visible_devices[n] = 0;
}

/* This process's start time in clock ticks after boot (/proc/self/stat field 22), 0 if it
 * cannot be read. pilotd compares it with what /proc says of the peer pid of the HELLO: a pid
 * reused after the sender exited is then not taken for the program. */
static uint64_t own_start_time(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p)
        return 0;
    unsigned long long start = 0;
    /* after ") ": state is field 3; start time is field 22 */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                      "%*d %llu", &start) != 1)
        return 0;
    return start;
}

/* One try of open_session: 0, -1, -2 as it, or SETUP_RETRY. */
static int open_session_once(void)
{
    pilot_req_hello hello = {.proto_version = PILOT_PROTO_VERSION, .cuda_abi = CUDART_VERSION};
    pilot_rep_hello hrep;
    device_selection(&hello);
    hello.start_time = own_start_time();
    int rc0 = main_socket_call(PILOT_OP_HELLO, 0, &hello, sizeof hello, &hrep);
    if (rc0 == 0 && hrep.hdr.err == PILOT_HELLO_REDIRECT) {
        /* the tenant is isolated: its own pilotd serves the session (once: it never redirects) */
        if (g_main_path[0]) {
            LOG_ERROR("pilot: pilotd redirected the session twice; giving up");
            return -1;
        }
        memcpy(g_main_path, hrep.endpoint, sizeof g_main_path);
        g_main_path[sizeof g_main_path - 1] = 0;
        LOG_INFO("isolated tenant: session served by the pilotd at %s", g_main_path);
        rc0 = main_socket_call(PILOT_OP_HELLO, 0, &hello, sizeof hello, &hrep);
        if (rc0 == 0 && hrep.hdr.err == PILOT_HELLO_REDIRECT)
            hrep.hdr.err = cudaErrorInitializationError;
    }
    if (rc0 != 0)
        return rc0;
    if (hrep.hdr.err == cudaErrorNoDevice) {
        /* the selection named no GPU pilotd serves: CUDA then has no device either */
        LOG_INFO("CUDA_VISIBLE_DEVICES selects no GPU of pilotd's: no CUDA device");
        return -1;
    }
    if (hrep.hdr.err) {
        fprintf(stderr, "pilot: pilotd refused the session (%s)%s\n",
                pilot_error_name(hrep.hdr.err) ? pilot_error_name(hrep.hdr.err) : "error",
                hrep.hdr.err == cudaErrorNotSupported
                    ? ": is PILOT_SOCKET pilotd's main socket, not its control socket?" : "");
        return -1;
    }
    struct part *p = &g_parts[0];
    pthread_mutex_lock(&p->lock);
    int rc = attach(p, &hrep);
    if (rc == 0) {
        g_session = hrep.session;
        memcpy(g_callbacks, hrep.callbacks, sizeof g_callbacks);
        memcpy(g_endpoint, hrep.endpoint, sizeof g_endpoint);
        p->state = CONN_READY;
        if (info_on(p, 0) != 0) {
            rc = p->state == CONN_LOST ? SETUP_RETRY : -1; /* lost: pilotd restarted meanwhile */
            if (rc == -1)
                LOG_ERROR("pilot: pilotd sent no device information");
            zmtp_close(&p->conn);
            p->state = CONN_NONE;
        }
    }
    pthread_mutex_unlock(&p->lock);
    if (rc != 0)
        return rc == SETUP_RETRY ? SETUP_RETRY : -1;
    int count = g_infos[0].device_count;
    g_device_count = count < 1 ? 1 : count > PILOT_MAX_DEVICES ? PILOT_MAX_DEVICES : count;
    LOG_INFO("session %llu on vGPU %u (%s), %d device(s)", (unsigned long long)g_session, hrep.vgpu,
             hrep.endpoint, g_device_count);
    return 0;
}

static long long monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* 0; -2: pilotd cannot be reached (try again later); -1: the set-up failed for good. A pilotd
 * that closes the connection mid-way (it restarts after a GPU fault, keeping its listening
 * socket) is tried again until the set-up timeout. */
static int open_session(void)
{
    long long deadline = monotonic_ms() + setup_timeout_ms();
    for (int attempt = 0;; attempt++) {
        int rc = open_session_once();
        if (rc != SETUP_RETRY)
            return rc;
        if (monotonic_ms() >= deadline) {
            LOG_ERROR("pilot: pilotd kept closing the connection for %d s while the session was "
                      "set up", setup_timeout_ms() / 1000);
            return -1;
        }
        if (attempt == 0)
            LOG_WARN("pilot: pilotd closed the connection during the session set-up (restarting "
                     "after a GPU fault?); trying again");
        usleep(20 * 1000);
    }
}

cudaError_t pilot_ensure_session(void)
{
    cudaError_t err = cudaSuccess;
    if (t_refused)
        return cudaErrorNotPermitted; /* the callback thread: a host callback may not call CUDA */
    if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == CONN_READY)
        return cudaSuccess;
    pthread_mutex_lock(&g_session_lock);
    if (g_state == CONN_LOST)
        err = ERR_LOST;
    else if (g_state == CONN_FAILED)
        err = ERR_NO_DAEMON;
    else if (g_state == CONN_NONE) {
        int rc = open_session();
        if (rc == 0)
            __atomic_store_n(&g_state, CONN_READY, __ATOMIC_RELEASE);
        else {
            if (rc == -1)
                g_state = CONN_FAILED;
            err = ERR_NO_DAEMON;
        }
    }
    pthread_mutex_unlock(&g_session_lock);
    return err;
}

/* Work the layers above want done once the session is up (registry.c preloads a small program's
 * kernels), run by the first entry point called after that, where it holds none of the shim's
 * locks: a set-up started inside a call (a kernel's first launch resolving it) must not re-enter
 * that call's locks. */
#define READY_HOOKS 4
static void (*g_ready_hooks[READY_HOOKS])(void);

void pilot_on_session_ready(void (*hook)(void))
{
    for (int i = 0; i < READY_HOOKS; i++)
        if (!g_ready_hooks[i]) {
            g_ready_hooks[i] = hook;
            return;
        }
    LOG_ERROR("pilot: more than %d session-ready hooks", READY_HOOKS);
}

cudaError_t pilot_enter_session(void)
{
    cudaError_t err = pilot_ensure_session();
    if (err == cudaSuccess && __atomic_load_n(&g_ready_hooks_pending, __ATOMIC_ACQUIRE) &&
        __atomic_exchange_n(&g_ready_hooks_pending, 0, __ATOMIC_ACQ_REL)) {
        cudaError_t saved = pilot_last_error_swap(cudaSuccess); /* hooks leave no error behind */
        for (int i = 0; i < READY_HOOKS && g_ready_hooks[i]; i++)
            g_ready_hooks[i]();
        pilot_last_error_swap(saved);
    }
    return err;
}

void pilot_refuse_thread_calls(void)
{
    t_refused = 1;
}

int pilot_device_count(void)
{
    return g_device_count;
}

uint64_t pilot_session_id(void)
{
    return g_session;
}

const char *pilot_callbacks_endpoint(void)
{
    return g_callbacks;
}

/* ---- routing ---- */

int pilot_current_device(void)
{
    return t_device;
}

void pilot_set_current_device(int device)
{
    t_device = device;
}

int pilot_route_device(void)
{
    return t_route >= 0 ? t_route : t_device;
}

int pilot_route_begin(int device)
{
    int previous = t_route;
    t_route = device;
    return previous;
}

void pilot_route_end(int previous)
{
    t_route = previous;
}

/* The part of `device`, joined on first use, locked. */
static cudaError_t lock_part(int device, struct part **out)
{
    /* After a context-fatal error every CUDA call fails with it, as natively: the session's
     * work on the GPU is gone (and pilotd may have restarted since). */
    cudaError_t err = pilot_sticky_error();
    if (err)
        return err;
    err = pilot_ensure_session();
    if (err)
        return err;
    if (device < 0 || device >= g_device_count)
        return cudaErrorInvalidDevice;
    struct part *p = &g_parts[device];
    pthread_mutex_lock(&p->lock);
    if (p->state == CONN_NONE && device > 0) {
        pilot_req_device req = {.device = device};
        pilot_rep_hello hrep;
        if (main_socket_call(PILOT_OP_DEVICE_JOIN, g_session, &req, sizeof req, &hrep) != 0)
            err = ERR_LOST; /* the daemon served HELLO but cannot be reached now */
        else if (hrep.hdr.err)
            err = (cudaError_t)hrep.hdr.err;
        else if (attach(p, &hrep) != 0)
            err = ERR_LOST;
        if (err == cudaSuccess) {
            p->state = CONN_READY;
            LOG_INFO("device %d: vGPU %u (%s)", device, hrep.vgpu, hrep.endpoint);
        } else if (err == ERR_LOST) {
            p->state = CONN_LOST;
        }
    } else if (p->state != CONN_READY) {
        err = ERR_LOST;
    }
    if (err) {
        pthread_mutex_unlock(&p->lock);
        return err;
    }
    *out = p;
    return cudaSuccess;
}

cudaError_t pilot_ensure_device(int device)
{
    struct part *p;
    cudaError_t err = lock_part(device, &p);
    if (err == cudaSuccess)
        pthread_mutex_unlock(&p->lock);
    return err;
}

/* ---- calls ---- */

static __thread struct pilot_recording *t_recording;

void pilot_record_begin(struct pilot_recording *r)
{
    t_recording = r;
}

void pilot_record_end(void)
{
    t_recording = NULL;
}

static cudaError_t record(struct pilot_recording *r, const struct part *p, uint16_t op,
                          uint32_t flags, const void *req, size_t req_len, const void *payload,
                          size_t payload_len)
{
    size_t need = sizeof(pilot_graph_record) + ((req_len + payload_len + 7) & ~(size_t)7);
    if (r->failed || !(flags & PILOT_F_NO_REPLY) || p != &g_parts[r->device] ||
        req_len > UINT32_MAX || payload_len > UINT32_MAX) {
        r->failed = 1;
        return cudaErrorStreamCaptureUnsupported;
    }
    if (r->len + need > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + need)
            cap *= 2;
        unsigned char *buf = realloc(r->buf, cap);
        if (!buf) {
            r->failed = 1;
            return cudaErrorMemoryAllocation;
        }
        r->buf = buf;
        r->cap = cap;
    }
    pilot_graph_record head = {.opcode = op, .req_len = (uint32_t)req_len,
                               .payload_len = (uint32_t)payload_len};
    unsigned char *at = r->buf + r->len;
    memcpy(at, &head, sizeof head);
    memcpy(at + sizeof head, req, req_len);
    if (payload_len)
        memcpy(at + sizeof head + req_len, payload, payload_len);
    memset(at + sizeof head + req_len + payload_len, 0, need - sizeof head - req_len - payload_len);
    r->len += need;
    r->count++;
    return cudaSuccess;
}

static cudaError_t send_on(struct part *p, uint16_t op, uint32_t flags, const void *req,
                           size_t req_len, const void *payload, size_t payload_len)
{
    if (t_recording)
        return record(t_recording, p, op, flags, req, req_len, payload, payload_len);
    pilot_envelope env = {.version = PILOT_PROTO_VERSION, .opcode = op, .flags = flags,
                          .seq = __atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED),
                          .session = g_session};
    struct zmtp_frame frames[3] = {{&env, sizeof env}, {req, req_len}, {payload, payload_len}};
    if (p->state != CONN_READY)
        return ERR_LOST;
    int rc = zmtp_send(&p->conn, frames, payload_len ? 3 : 2);
    if (rc) {
        lose_connection(p, strerror(-rc));
        return ERR_LOST;
    }
    return cudaSuccess;
}

/* Receives one reply, copies its body out, and turns its header into the call's result;
 * *reply_flags (when not NULL) gets its envelope's flags. */
static cudaError_t recv_on(struct part *p, void *rep, size_t rep_len, void *out, size_t out_cap,
                           size_t *out_len, uint32_t *reply_flags)
{
    struct zmtp_frame fr[ZMTP_MAX_FRAMES];
    if (p->state != CONN_READY)
        return ERR_LOST;
    int n = zmtp_recv(&p->conn, fr, ZMTP_MAX_FRAMES);
    if (n < 0) {
        lose_connection(p, n == -ETIMEDOUT ? "it stopped answering" : strerror(-n));
        return ERR_LOST;
    }
    if (n < 2 || fr[0].len < sizeof(pilot_envelope) || fr[1].len < sizeof(pilot_reply_hdr)) {
        lose_connection(p, "malformed reply");
        return ERR_LOST;
    }
    pilot_envelope env;
    memcpy(&env, fr[0].data, sizeof env);
    if (reply_flags)
        *reply_flags = env.flags;
    if ((env.flags & PILOT_F_DEVICE_OUTPUT) && n >= 3) {
        /* the kernels' printf output the call flushed, as the driver writes it natively: into
         * the program's stdout, in order with its own output */
        fwrite(fr[n - 1].data, 1, fr[n - 1].len, stdout);
        n--;
    }
    size_t body = fr[1].len < rep_len ? fr[1].len : rep_len;
    memset(rep, 0, rep_len);
    memcpy(rep, fr[1].data, body);
    if (out_len)
        *out_len = 0;
    if (n >= 3 && out) {
        size_t len = fr[2].len < out_cap ? fr[2].len : out_cap;
        memcpy(out, fr[2].data, len);
        if (out_len)
            *out_len = len;
    }
    const pilot_reply_hdr *hdr = rep;
    if (hdr->deferred)
        pilot_note_async_error((cudaError_t)hdr->deferred);
    if (hdr->err)
        return (cudaError_t)hdr->err;
    return (cudaError_t)hdr->deferred;
}

cudaError_t pilot_lock_session(void)
{
    struct part *p;
    cudaError_t err = lock_part(pilot_route_device(), &p);
    if (err == cudaSuccess)
        t_locked = p;
    return err;
}

void pilot_unlock_session(void)
{
    struct part *p = t_locked;
    t_locked = NULL;
    if (p)
        pthread_mutex_unlock(&p->lock);
}

cudaError_t pilot_send_locked(uint16_t op, uint32_t flags, const void *req, size_t req_len,
                              const void *payload, size_t payload_len)
{
    return t_locked ? send_on(t_locked, op, flags, req, req_len, payload, payload_len) : ERR_LOST;
}

cudaError_t pilot_recv_locked(void *rep, size_t rep_len)
{
    return t_locked ? recv_on(t_locked, rep, rep_len, NULL, 0, NULL, NULL) : ERR_LOST;
}

/* $PILOT_WORD_US: how long a call answered by the completion word (pilot_ring.h) polls it
 * before asking pilotd to wait instead (default 100000). A fault's work never writes the word,
 * so the error comes that much later; 0 turns the words off. */
static long word_budget_us(void)
{
    static long cached = -1;
    long v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *env = getenv("PILOT_WORD_US");
        v = env && *env ? atol(env) : 100000;
        v = v < 0 ? 0 : v > 10000000 ? 10000000 : v;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* Whether pilotd may answer the call by the completion word: a synchronization, or a copy to
 * the host whose bytes fit the GPU page, on a connection in rings. */
static int word_call(const struct part *p, uint16_t op, size_t out_cap)
{
    if (!zmtp_has_word(&p->conn) || word_budget_us() == 0)
        return 0;
    return op == PILOT_OP_DEVICE_SYNCHRONIZE || op == PILOT_OP_STREAM_SYNCHRONIZE ||
           (op == PILOT_OP_MEMCPY_D2H && out_cap <= PILOT_RING_GPU_DATA);
}

/* The reply to a call sent with PILOT_F_GPU_WORD: the usual one, or "pending", and then the
 * wait for the word (and a copy's bytes from the GPU page). A word not written within the
 * budget (long work, or a fault) makes the call again without the flag: pilotd waits, and
 * reports what the GPU says. */
static cudaError_t word_reply(struct part *p, uint16_t op, const void *req, size_t req_len,
                              void *rep, size_t rep_len, void *out, size_t out_cap,
                              size_t *out_len)
{
    pilot_rep_u64 w;
    uint32_t flags = 0;
    cudaError_t err = recv_on(p, &w, sizeof w, out, out_cap, out_len, &flags);
    if (!(flags & PILOT_F_WORD_PENDING) || err) {
        memcpy(rep, &w, rep_len < sizeof w ? rep_len : sizeof w);
        return err;
    }
    if (w.value2 > out_cap) {
        lose_connection(p, "malformed reply");
        return ERR_LOST;
    }
    if (zmtp_wait_word(&p->conn, (uint32_t)w.value, word_budget_us(), out, w.value2) == 0) {
        memset(rep, 0, rep_len);
        if (out_len)
            *out_len = w.value2;
        return cudaSuccess;
    }
    err = send_on(p, op, 0, req, req_len, NULL, 0);
    return err ? err : recv_on(p, rep, rep_len, out, out_cap, out_len, NULL);
}

cudaError_t pilot_call_on(int device, uint16_t op, const void *req, size_t req_len,
                          const void *payload, size_t payload_len, void *rep, size_t rep_len,
                          void *out, size_t out_cap, size_t *out_len)
{
    pilot_rep_status status;
    if (!rep) {
        rep = &status;
        rep_len = sizeof status;
    }
    struct part *p;
    cudaError_t err = lock_part(device, &p);
    if (err)
        return err;
    uint32_t flags = !t_recording && !payload_len && word_call(p, op, out_cap) ? PILOT_F_GPU_WORD : 0;
    err = send_on(p, op, flags, req, req_len, payload, payload_len);
    if (err == cudaSuccess)
        err = flags ? word_reply(p, op, req, req_len, rep, rep_len, out, out_cap, out_len)
                    : recv_on(p, rep, rep_len, out, out_cap, out_len, NULL);
    pthread_mutex_unlock(&p->lock);
    return err;
}

cudaError_t pilot_post_on(int device, uint16_t op, const void *req, size_t req_len,
                          const void *payload, size_t payload_len)
{
    struct part *p;
    cudaError_t err = lock_part(device, &p);
    if (err)
        return err;
    err = send_on(p, op, PILOT_F_NO_REPLY, req, req_len, payload, payload_len);
    pthread_mutex_unlock(&p->lock);
    return err;
}

cudaError_t pilot_call(uint16_t op, const void *req, size_t req_len, const void *payload,
                       size_t payload_len, void *rep, size_t rep_len, void *out, size_t out_cap,
                       size_t *out_len)
{
    return pilot_call_on(pilot_route_device(), op, req, req_len, payload, payload_len, rep, rep_len,
                         out, out_cap, out_len);
}

cudaError_t pilot_post(uint16_t op, const void *req, size_t req_len, const void *payload,
                       size_t payload_len)
{
    return pilot_post_on(pilot_route_device(), op, req, req_len, payload, payload_len);
}

/* ---- device information (fetched through part 0, once per device) ---- */

static int fetch_info(int device)
{
    struct part *p;
    if (lock_part(0, &p) != cudaSuccess)
        return -1;
    int rc = info_on(p, device);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

const pilot_rep_device_info *pilot_device_info_of(int device)
{
    if (g_state != CONN_READY || device < 0 || device >= g_device_count)
        return NULL;
    if (!__atomic_load_n(&g_info_known[device], __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&g_session_lock);
        int ok = g_info_known[device] || fetch_info(device) == 0;
        pthread_mutex_unlock(&g_session_lock);
        if (!ok)
            return NULL;
    }
    return &g_infos[device];
}

const pilot_rep_device_info *pilot_device_info(void)
{
    return pilot_device_info_of(pilot_route_device());
}

/* ---- staging areas: shared memory the daemon pinned, described by a STAGING_OPEN reply ---- */

cudaError_t pilot_staging_map(const pilot_rep_staging *rep, struct pilot_staging *out)
{
    char path[sizeof rep->path];
    memcpy(path, rep->path, sizeof path);
    path[sizeof path - 1] = 0;
    size_t size = rep->slot_bytes * rep->slots;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    void *p = fd >= 0 && size ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                              : MAP_FAILED;
    if (fd >= 0) {
        close(fd);
        unlink(path); /* both sides have it mapped; nothing left behind on a crash */
    }
    if (p == MAP_FAILED) {
        LOG_ERROR("cannot map the staging area %s", path);
        return cudaErrorMemoryAllocation;
    }
    out->base = p;
    out->slot_bytes = rep->slot_bytes;
    out->slots = rep->slots;
    return cudaSuccess;
}

void pilot_staging_unmap(struct pilot_staging *stage)
{
    if (stage->base)
        munmap(stage->base, stage->slot_bytes * stage->slots);
    stage->base = NULL;
}

/* ---- the unified-memory fault channel (coherence.c) ---- */

cudaError_t pilot_fault_channel_open(void)
{
    cudaError_t err = pilot_ensure_session();
    if (err)
        return err;
    pthread_mutex_lock(&g_fault_lock);
    if (g_fault_conn.fd < 0) {
        struct zmtp_frame rep[ZMTP_MAX_FRAMES];
        pilot_req_hello hello = {.proto_version = PILOT_PROTO_VERSION, .cuda_abi = CUDART_VERSION};
        pilot_rep_status st;
        int n;
        err = ERR_LOST;
        if (zmtp_connect(&g_fault_conn, g_endpoint) == 0) {
            g_fault_conn.spin_us = spin_us();
            if (exchange_on(&g_fault_conn, &g_fault_seq, PILOT_F_FAULT_CHANNEL, g_session,
                            PILOT_OP_ATTACH, &hello, sizeof hello, NULL, 0, rep, &n) == 0) {
                memcpy(&st, rep[1].data, sizeof st);
                err = st.hdr.err ? (cudaError_t)st.hdr.err : cudaSuccess;
            }
            pilot_req_staging_open open_req = {.fault = 1};
            if (!err && !g_fault_stage.base) {
                err = ERR_LOST;
                if (exchange_on(&g_fault_conn, &g_fault_seq, 0, g_session, PILOT_OP_STAGING_OPEN,
                                &open_req, sizeof open_req, NULL, 0, rep, &n) == 0) {
                    pilot_rep_staging staging;
                    memset(&staging, 0, sizeof staging);
                    memcpy(&staging, rep[1].data,
                           rep[1].len < sizeof staging ? rep[1].len : sizeof staging);
                    err = staging.hdr.err ? (cudaError_t)staging.hdr.err
                                          : pilot_staging_map(&staging, &g_fault_stage);
                }
            }
            if (err)
                zmtp_close(&g_fault_conn);
        }
        if (err)
            LOG_ERROR("pilot: cannot open the unified-memory fault channel to %s", g_endpoint);
    }
    pthread_mutex_unlock(&g_fault_lock);
    return err;
}

const struct pilot_staging *pilot_fault_staging(void)
{
    return &g_fault_stage;
}

cudaError_t pilot_fault_call(uint16_t op, const void *req, size_t req_len)
{
    cudaError_t err = ERR_LOST;
    struct zmtp_frame rep[ZMTP_MAX_FRAMES];
    int n;
    pthread_mutex_lock(&g_fault_lock);
    if (g_fault_conn.fd >= 0) {
        err = exchange_on(&g_fault_conn, &g_fault_seq, 0, g_session, op, req, req_len, NULL, 0,
                          rep, &n);
        if (err == cudaSuccess)
            err = (cudaError_t)((const pilot_reply_hdr *)rep[1].data)->err;
        else
            zmtp_close(&g_fault_conn);
    }
    pthread_mutex_unlock(&g_fault_lock);
    return err;
}
