/* Host callbacks: cudaLaunchHostFunc and cudaStreamAddCallback (and their _ptsz forms).
 *
 * A callback runs in this process, on the shim's callback thread (`pilot-callbacks`), in
 * stream order. The program's call registers it here under a number and asks the daemon
 * (STREAM_CALLBACK, a call: errors such as a bad stream come back at once) to put a gate on the
 * stream (daemon/callbacks.py). When the stream reaches the gate the daemon sends CALLBACK_RUN
 * on the session's callback connection; the callback thread runs the function and answers
 * CALLBACK_DONE, and only then does the daemon let the stream go on. The callback connection is
 * the thread's own (opened with the first callback), so a callback completes even while other
 * threads of the program wait in synchronous calls for the very work it holds back.
 *
 * As in CUDA: a host function is not called after an error in the stream's context (the
 * daemon says so with PILOT_CALLBACK_SKIP); a stream callback is called with that error as its
 * status; a callback may not call CUDA (the shim answers cudaErrorNotPermitted).
 *
 * While callbacks are outstanding, calls that wait for device work poll for it first (the
 * fences below): a wait may depend on a callback that depends on another thread of the
 * program, so no waiting call may hold its device's connection, or block the vGPU thread in
 * the daemon, for the duration. Copies from pageable memory fence too, so a copy queued after a
 * callback sees what the callback wrote. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "socket_path.h"
#include "shim.h"
#include "zmtp.h"
#include "hooks.h"

struct entry {
    uint64_t id;
    uint32_t kind;
    cudaHostFn_t fn;
    cudaStreamCallback_t stream_fn;
    void *data;
    cudaStream_t stream; /* as the program passed it: what a stream callback receives */
    struct entry *next;
};

enum channel { CHANNEL_NONE, CHANNEL_READY, CHANNEL_DEAD };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* entries and channel set-up */
static struct entry *g_entries;
static uint64_t g_next_id;
static int g_outstanding; /* registered, not yet run (atomic reads) */
static enum channel g_channel = CHANNEL_NONE;
static struct zmtp_conn g_conn = {.fd = -1}; /* the callback thread's once set up */
static void fork_child(void)
{
    /* After fork: the parent's callbacks, connection and thread are not the child's. */
    pthread_mutex_init(&g_lock, NULL);
    while (g_entries) {
        struct entry *e = g_entries;
        g_entries = e->next;
        free(e);
    }
    g_outstanding = 0;
    if (g_conn.fd >= 0)
        close(g_conn.fd);
    g_conn.fd = -1;
    g_channel = CHANNEL_NONE;
}

PILOT_HOOK(callbacks, .on_fork_child = fork_child);

static struct entry *take(uint64_t id)
{
    pthread_mutex_lock(&g_lock);
    struct entry **pp = &g_entries, *e = NULL;
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->next;
    if (*pp) {
        e = *pp;
        *pp = e->next;
    }
    pthread_mutex_unlock(&g_lock);
    return e;
}

static void *callback_thread(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* the program's signals are not for this thread */
    pilot_refuse_thread_calls(); /* everything this thread runs is a callback */
    for (;;) {
        struct zmtp_frame fr[ZMTP_MAX_FRAMES];
        int n = zmtp_recv(&g_conn, fr, ZMTP_MAX_FRAMES);
        if (n < 0)
            break; /* the daemon went away or ended the session */
        if (n < 2 || fr[0].len < sizeof(pilot_envelope) || fr[1].len < sizeof(pilot_msg_callback) ||
            ((const pilot_envelope *)fr[0].data)->opcode != PILOT_OP_CALLBACK_RUN)
            continue;
        pilot_msg_callback run;
        memcpy(&run, fr[1].data, sizeof run);
        struct entry *e = take(run.id);
        if (!e) {
            LOG_WARN("callback %llu: not registered", (unsigned long long)run.id);
            continue;
        }
        if (!(run.flags & PILOT_CALLBACK_SKIP)) {
            if (e->kind == PILOT_CALLBACK_STREAM)
                e->stream_fn(e->stream, (cudaError_t)run.status, e->data);
            else
                e->fn(e->data);
            pilot_msg_callback done = {.id = run.id};
            pilot_envelope env = {.version = PILOT_PROTO_VERSION, .opcode = PILOT_OP_CALLBACK_DONE,
                                  .flags = PILOT_F_NO_REPLY, .session = pilot_session_id()};
            struct zmtp_frame out[2] = {{&env, sizeof env}, {&done, sizeof done}};
            if (zmtp_send(&g_conn, out, 2) != 0) {
                free(e);
                __atomic_sub_fetch(&g_outstanding, 1, __ATOMIC_RELEASE);
                break;
            }
        }
        free(e);
        __atomic_sub_fetch(&g_outstanding, 1, __ATOMIC_RELEASE);
    }
    LOG_INFO("callback connection closed; host callbacks stop");
    __atomic_store_n(&g_channel, CHANNEL_DEAD, __ATOMIC_RELEASE);
    return NULL;
}

/* Connects the session's callback connection and starts the thread, once. g_lock held. */
static cudaError_t open_channel_locked(void)
{
    if (g_channel == CHANNEL_READY)
        return cudaSuccess;
    if (g_channel == CHANNEL_DEAD)
        return cudaErrorDevicesUnavailable;
    const char *path = pilot_callbacks_endpoint();
    char why[400];
    if (path && *path && pilot_socket_trusted(path, why, sizeof why) != 0) {
        LOG_ERROR("pilot: refusing to connect to %s: %s", path, why);
        return cudaErrorNotSupported;
    }
    if (!path || !*path || zmtp_connect(&g_conn, path) != 0) {
        LOG_ERROR("pilot: cannot connect to pilotd's callback socket %s", path ? path : "");
        return cudaErrorNotSupported;
    }
    pilot_envelope env = {.version = PILOT_PROTO_VERSION, .opcode = PILOT_OP_CALLBACK_ATTACH,
                          .seq = 1, .session = pilot_session_id()};
    struct zmtp_frame out[2] = {{&env, sizeof env}, {NULL, 0}};
    struct zmtp_frame fr[ZMTP_MAX_FRAMES];
    int n = zmtp_send(&g_conn, out, 2) == 0 ? zmtp_recv(&g_conn, fr, ZMTP_MAX_FRAMES) : -1;
    if (n < 2 || fr[1].len < sizeof(pilot_reply_hdr) ||
        ((const pilot_reply_hdr *)fr[1].data)->err != 0) {
        LOG_ERROR("pilot: pilotd refused the callback connection");
        zmtp_close(&g_conn);
        return cudaErrorNotSupported;
    }
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&thread, &attr, callback_thread, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        zmtp_close(&g_conn);
        return cudaErrorMemoryAllocation;
    }
    pthread_setname_np(thread, "pilot-callbacks");
    g_channel = CHANNEL_READY;
    return cudaSuccess;
}

static cudaError_t add_callback(cudaStream_t stream, uint32_t kind, cudaHostFn_t fn,
                                cudaStreamCallback_t stream_fn, void *data)
{
    uint64_t h = pilot_stream_handle(stream);
    int dev = pilot_handle_device(h);
    if (dev >= pilot_device_count())
        return cudaErrorInvalidResourceHandle;
    struct entry *e = calloc(1, sizeof *e);
    if (!e)
        return cudaErrorMemoryAllocation;
    *e = (struct entry){.kind = kind, .fn = fn, .stream_fn = stream_fn, .data = data,
                        .stream = stream};
    pthread_mutex_lock(&g_lock);
    cudaError_t err = open_channel_locked();
    if (err == cudaSuccess) {
        e->id = ++g_next_id;
        e->next = g_entries;
        g_entries = e;
        __atomic_add_fetch(&g_outstanding, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&g_lock);
    if (err) {
        free(e);
        return err;
    }
    uint64_t id = e->id; /* e may be run and freed by the callback thread from here on */
    pilot_req_stream_callback req = {.stream = h, .id = id, .kind = kind};
    err = pilot_call_on(dev, PILOT_OP_STREAM_CALLBACK, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0,
                        NULL);
    if (err) { /* no gate was set: nothing will run it */
        struct entry *gone = take(id);
        if (gone) {
            free(gone);
            __atomic_sub_fetch(&g_outstanding, 1, __ATOMIC_RELEASE);
        }
    }
    return err;
}

/* ---- waiting without holding anything (shim.h, pilot_callbacks_fence) ---- */

int pilot_callbacks_outstanding(void)
{
    return __atomic_load_n(&g_outstanding, __ATOMIC_ACQUIRE) > 0;
}

/* Repeats a query (EVENT_QUERY, DEVICE_QUERY) until it stops answering cudaErrorNotReady,
 * sleeping in between with nothing held: 10 us doubling up to 1 ms. */
static cudaError_t poll(int device, uint16_t op, const pilot_req_handle *req)
{
    useconds_t delay = 10;
    for (;;) {
        cudaError_t err = pilot_call_on(device, op, req, req ? sizeof *req : 0, NULL, 0, NULL, 0,
                                        NULL, 0, NULL);
        if (err != cudaErrorNotReady)
            return err;
        usleep(delay);
        if (delay < 1000)
            delay *= 2;
    }
}

cudaError_t pilot_callbacks_fence(uint64_t stream)
{
    if (!pilot_callbacks_outstanding())
        return cudaSuccess;
    const int dev = pilot_route_device();
    uint64_t marker = pilot_thread_object(PILOT_MARKER_EVENT, dev);
    /* The marker completes once everything issued on the stream so far is done (for the legacy
     * stream, after the blocking streams it joins): exactly what the caller waits for. */
    pilot_req_event_record record = {.event = marker, .stream = stream};
    cudaError_t err = pilot_post_on(dev, PILOT_OP_EVENT_RECORD, &record, sizeof record, NULL, 0);
    if (err)
        return err;
    pilot_req_handle query = {.handle = marker};
    return poll(dev, PILOT_OP_EVENT_QUERY, &query);
}

cudaError_t pilot_callbacks_fence_event(int device, uint64_t event)
{
    if (!pilot_callbacks_outstanding())
        return cudaSuccess;
    pilot_req_handle query = {.handle = event};
    return poll(device, PILOT_OP_EVENT_QUERY, &query);
}

cudaError_t pilot_callbacks_fence_device(int device)
{
    return pilot_callbacks_outstanding() ? poll(device, PILOT_OP_DEVICE_QUERY, NULL) : cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    PILOT_REQUIRE_SESSION();
    if (!fn)
        PILOT_RETURN(cudaErrorInvalidValue);
    cudaError_t err = cudaSuccess; /* a host node of a capture (graph_capture.c) */
    if (pilot_capture_host(pilot_stream_handle(stream), fn, userData, &err))
        PILOT_RETURN(err);
    PILOT_RETURN(add_callback(stream, PILOT_CALLBACK_HOST_FUNC, fn, NULL, userData));
}

PILOT_EXPORT cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn,
                                                 void *userData)
{
    return cudaLaunchHostFunc(stream ? stream : cudaStreamPerThread, fn, userData);
}

PILOT_EXPORT cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                               void *userData, unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    if (!callback || flags != 0) /* flags are reserved and must be 0 */
        PILOT_RETURN(cudaErrorInvalidValue);
    cudaError_t err = cudaSuccess;
    if (pilot_capture_refuse(pilot_stream_handle(stream), "cudaStreamAddCallback", &err))
        PILOT_RETURN(err);
    PILOT_RETURN(add_callback(stream, PILOT_CALLBACK_STREAM, NULL, callback, userData));
}

PILOT_EXPORT cudaError_t cudaStreamAddCallback_ptsz(cudaStream_t stream,
                                                    cudaStreamCallback_t callback, void *userData,
                                                    unsigned int flags)
{
    return cudaStreamAddCallback(stream ? stream : cudaStreamPerThread, callback, userData, flags);
}
