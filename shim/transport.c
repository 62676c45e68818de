/* The session with pilotd: connection set-up, request/reply, asynchronous posts.
 *
 * One connection per process, to the vGPU socket the daemon assigned in HELLO, guarded by one
 * mutex: a synchronous call holds it from send to reply, so replies never interleave. Everything
 * is blocking I/O on the calling thread; a daemon that exits closes the socket and every waiting
 * call returns at once with an error. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "shim.h"
#include "socket_path.h"
#include "zmtp.h"

enum conn_state { CONN_NONE, CONN_READY, CONN_LOST };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct zmtp_conn g_conn = {.fd = -1};
static enum conn_state g_state = CONN_NONE;
static uint64_t g_session;
static uint64_t g_seq;
static int g_device;
static pilot_rep_device_info g_info;
static int g_warned_absent;
static char g_endpoint[PILOT_ENDPOINT_MAX];

/* The fault channel: a second connection to the session's vGPU, used only by the unified-memory
 * fault handler (coherence.c) to fetch shadow chunks. Its own lock and sequence numbers mean a
 * fault taken while this thread or another holds g_lock never waits for g_lock. */
static pthread_mutex_t g_fault_lock = PTHREAD_MUTEX_INITIALIZER;
static struct zmtp_conn g_fault_conn = {.fd = -1};
static uint64_t g_fault_seq;

/* Error every call returns while pilotd cannot be reached: to the program, no usable GPU. */
#define ERR_NO_DAEMON cudaErrorNoDevice
/* Error after the daemon went away mid-session: the session's state is gone for good. */
#define ERR_LOST cudaErrorDevicesUnavailable

static void fork_child(void)
{
    /* The child must not use the parent's connection or session: start afresh on first use. */
    pthread_mutex_init(&g_lock, NULL);
    pthread_mutex_init(&g_fault_lock, NULL);
    if (g_conn.fd >= 0)
        close(g_conn.fd);
    g_conn.fd = -1;
    if (g_fault_conn.fd >= 0)
        close(g_fault_conn.fd);
    g_fault_conn.fd = -1;
    pilot_um_forget_session();
    g_state = CONN_NONE;
    g_session = 0;
    pilot_alloc_clear();
    pilot_registry_forget_session();
    pilot_staging_forget();
    pilot_copy_forget();
}

__attribute__((constructor)) static void transport_init(void)
{
    pthread_atfork(NULL, NULL, fork_child);
}

static void lose_connection(const char *why)
{
    if (g_state == CONN_READY)
        LOG_ERROR("pilot: lost connection to pilotd (%s); CUDA calls now fail", why);
    zmtp_close(&g_conn);
    g_state = CONN_LOST;
}

static cudaError_t exchange_on(struct zmtp_conn *c, uint64_t *seq, uint32_t flags,
                               uint64_t session, uint16_t op, const void *req, size_t req_len,
                               const void *payload, size_t payload_len, struct zmtp_frame *reply,
                               int *nreply)
{
    pilot_envelope env = {.version = PILOT_PROTO_VERSION, .opcode = op, .flags = flags,
                          .seq = ++*seq, .session = session};
    struct zmtp_frame frames[3] = {{&env, sizeof env}, {req, req_len}, {payload, payload_len}};
    int rc = zmtp_send(c, frames, payload_len ? 3 : 2);
    if (rc)
        return ERR_LOST;
    int n = zmtp_recv(c, reply, ZMTP_MAX_FRAMES);
    if (n < 2 || reply[0].len < sizeof(pilot_envelope) ||
        ((const pilot_envelope *)reply[0].data)->seq != env.seq ||
        reply[1].len < sizeof(pilot_reply_hdr))
        return ERR_LOST;
    *nreply = n;
    return cudaSuccess;
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

static int open_session(void)
{
    char path[512];
    struct zmtp_conn main_conn = {.fd = -1};
    struct zmtp_frame rep[ZMTP_MAX_FRAMES];
    int n, rc;
    if (pilot_socket_path(0, path, sizeof path) != 0) {
        LOG_ERROR("pilot: socket path too long");
        return -1;
    }
    rc = zmtp_connect(&main_conn, path);
    if (rc) {
        if (!g_warned_absent++)
            fprintf(stderr,
                    "pilot: cannot reach pilotd at %s (%s); is the daemon running? Start it with "
                    "`pilotd` or set PILOT_SOCKET. CUDA calls return cudaErrorNoDevice.\n",
                    path, strerror(-rc));
        return -1;
    }
    pilot_req_hello hello = {.proto_version = PILOT_PROTO_VERSION, .cuda_abi = CUDART_VERSION};
    pilot_rep_hello hrep;
    if (exchange(&main_conn, 0, PILOT_OP_HELLO, &hello, sizeof hello, NULL, 0, rep, &n) ||
        rep[1].len < sizeof hrep) {
        LOG_ERROR("pilot: pilotd at %s did not answer HELLO", path);
        zmtp_close(&main_conn);
        return -1;
    }
    memcpy(&hrep, rep[1].data, sizeof hrep);
    zmtp_close(&main_conn);
    if (hrep.hdr.err) {
        fprintf(stderr, "pilot: pilotd refused the session (%s)\n",
                pilot_error_name(hrep.hdr.err) ? pilot_error_name(hrep.hdr.err) : "error");
        return -1;
    }
    hrep.endpoint[sizeof hrep.endpoint - 1] = 0;
    memcpy(g_endpoint, hrep.endpoint, sizeof g_endpoint);

    rc = zmtp_connect(&g_conn, hrep.endpoint);
    g_conn.spin_us = spin_us();
    if (rc) {
        LOG_ERROR("pilot: cannot attach to vGPU socket %s: %s", hrep.endpoint, strerror(-rc));
        return -1;
    }
    pilot_rep_status st;
    if (exchange(&g_conn, hrep.session, PILOT_OP_ATTACH, &hello, sizeof hello, NULL, 0, rep, &n) ||
        (memcpy(&st, rep[1].data, sizeof st), st.hdr.err)) {
        LOG_ERROR("pilot: pilotd refused to attach the session");
        zmtp_close(&g_conn);
        return -1;
    }
    g_session = hrep.session;
    g_device = hrep.device;
    pilot_req_device dreq = {.device = hrep.device};
    if (exchange(&g_conn, g_session, PILOT_OP_DEVICE_INFO, &dreq, sizeof dreq, NULL, 0, rep, &n) ||
        rep[1].len < sizeof g_info) {
        LOG_ERROR("pilot: pilotd sent no device information");
        zmtp_close(&g_conn);
        return -1;
    }
    memcpy(&g_info, rep[1].data, sizeof g_info);
    LOG_INFO("session %llu on vGPU %u (%s), device %d", (unsigned long long)g_session, hrep.vgpu,
             hrep.endpoint, g_device);
    return 0;
}

cudaError_t pilot_ensure_session(void)
{
    cudaError_t err = cudaSuccess;
    if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == CONN_READY)
        return cudaSuccess;
    pthread_mutex_lock(&g_lock);
    if (g_state == CONN_LOST)
        err = ERR_LOST;
    else if (g_state == CONN_NONE) {
        if (open_session() == 0)
            __atomic_store_n(&g_state, CONN_READY, __ATOMIC_RELEASE);
        else
            err = ERR_NO_DAEMON;
    }
    pthread_mutex_unlock(&g_lock);
    return err;
}

const pilot_rep_device_info *pilot_device_info(void)
{
    return g_state == CONN_READY ? &g_info : NULL;
}

int pilot_session_device(void)
{
    return g_device;
}

cudaError_t pilot_lock_session(void)
{
    cudaError_t err = pilot_ensure_session();
    if (err)
        return err;
    pthread_mutex_lock(&g_lock);
    if (g_state != CONN_READY) {
        pthread_mutex_unlock(&g_lock);
        return ERR_LOST;
    }
    return cudaSuccess;
}

void pilot_unlock_session(void)
{
    pthread_mutex_unlock(&g_lock);
}

cudaError_t pilot_send_locked(uint16_t op, uint32_t flags, const void *req, size_t req_len,
                              const void *payload, size_t payload_len)
{
    pilot_envelope env = {.version = PILOT_PROTO_VERSION, .opcode = op, .flags = flags,
                          .seq = ++g_seq, .session = g_session};
    struct zmtp_frame frames[3] = {{&env, sizeof env}, {req, req_len}, {payload, payload_len}};
    if (g_state != CONN_READY)
        return ERR_LOST;
    int rc = zmtp_send(&g_conn, frames, payload_len ? 3 : 2);
    if (rc) {
        lose_connection(strerror(-rc));
        return ERR_LOST;
    }
    return cudaSuccess;
}

/* Receives one reply, copies its body out, and turns its header into the call's result. */
static cudaError_t recv_reply(void *rep, size_t rep_len, void *out, size_t out_cap, size_t *out_len)
{
    struct zmtp_frame fr[ZMTP_MAX_FRAMES];
    if (g_state != CONN_READY)
        return ERR_LOST;
    int n = zmtp_recv(&g_conn, fr, ZMTP_MAX_FRAMES);
    if (n < 0) {
        lose_connection(strerror(-n));
        return ERR_LOST;
    }
    if (n < 2 || fr[0].len < sizeof(pilot_envelope) || fr[1].len < sizeof(pilot_reply_hdr)) {
        lose_connection("malformed reply");
        return ERR_LOST;
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

cudaError_t pilot_recv_locked(void *rep, size_t rep_len)
{
    return recv_reply(rep, rep_len, NULL, 0, NULL);
}

cudaError_t pilot_call(uint16_t op, const void *req, size_t req_len, const void *payload,
                       size_t payload_len, void *rep, size_t rep_len, void *out, size_t out_cap,
                       size_t *out_len)
{
    pilot_rep_status status;
    if (!rep) {
        rep = &status;
        rep_len = sizeof status;
    }
    cudaError_t err = pilot_lock_session();
    if (err)
        return err;
    err = pilot_send_locked(op, 0, req, req_len, payload, payload_len);
    if (err == cudaSuccess)
        err = recv_reply(rep, rep_len, out, out_cap, out_len);
    pilot_unlock_session();
    return err;
}

cudaError_t pilot_post(uint16_t op, const void *req, size_t req_len, const void *payload,
                       size_t payload_len)
{
    cudaError_t err = pilot_lock_session();
    if (err)
        return err;
    err = pilot_send_locked(op, PILOT_F_NO_REPLY, req, req_len, payload, payload_len);
    pilot_unlock_session();
    return err;
}

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
            if (err)
                zmtp_close(&g_fault_conn);
        }
        if (err)
            LOG_ERROR("pilot: cannot open the unified-memory fault channel to %s", g_endpoint);
    }
    pthread_mutex_unlock(&g_fault_lock);
    return err;
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
