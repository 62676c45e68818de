/* Stream and event handles, below every module that names a stream: the device a handle names
 * (bits PILOT_HANDLE_DEVICE_SHIFT..+7), the daemon handle of a cudaStream_t (0 and
 * cudaStreamLegacy: the legacy stream; cudaStreamPerThread: the thread's own), and the objects a
 * thread keeps per device, created on first use and destroyed when the thread exits (see the
 * comment at the top of api_stream.c). */
#include <pthread.h>
#include <string.h>

#include "shim.h"
#include "hooks.h"

/* ---- objects a thread keeps per device: its default stream, its marker event ---- */

struct thread_object {
    uint64_t handle;
    unsigned generation; /* g_generation[device] when created */
};

static __thread struct thread_object t_objects[PILOT_THREAD_OBJECT_KINDS][PILOT_MAX_DEVICES];
static __thread int t_registered;
static unsigned g_generation[PILOT_MAX_DEVICES]; /* bumped when the device's handles vanish */
static pthread_key_t g_exit_key;
static pthread_once_t g_exit_once = PTHREAD_ONCE_INIT;

static const uint16_t g_destroy_op[PILOT_THREAD_OBJECT_KINDS] = {
    [PILOT_PER_THREAD_STREAM] = PILOT_OP_STREAM_DESTROY,
    [PILOT_MARKER_EVENT] = PILOT_OP_EVENT_DESTROY,
};

static void thread_exit(void *unused)
{
    (void)unused;
    for (int kind = 0; kind < PILOT_THREAD_OBJECT_KINDS; kind++)
        for (int d = 0; d < PILOT_MAX_DEVICES; d++) {
            struct thread_object *o = &t_objects[kind][d];
            if (o->handle && o->generation == __atomic_load_n(&g_generation[d], __ATOMIC_RELAXED)) {
                pilot_req_handle req = {.handle = o->handle};
                if (kind == PILOT_PER_THREAD_STREAM)
                    pilot_stream_forget(o->handle); /* out of the known streams (below) too */
                pilot_post_on(d, g_destroy_op[kind], &req, sizeof req, NULL, 0);
            }
            o->handle = 0;
        }
}

static void make_exit_key(void)
{
    pthread_key_create(&g_exit_key, thread_exit);
}

uint64_t pilot_thread_object(int kind, int device)
{
    struct thread_object *o = &t_objects[kind][device];
    unsigned gen = __atomic_load_n(&g_generation[device], __ATOMIC_RELAXED);
    if (o->handle && o->generation == gen)
        return o->handle;
    pilot_req_stream_create stream = {.flags = cudaStreamDefault, .priority = 0}; /* blocking */
    pilot_req_event_create event = {.flags = cudaEventDisableTiming};
    pilot_rep_u64 rep;
    cudaError_t err = kind == PILOT_PER_THREAD_STREAM
                          ? pilot_call_on(device, PILOT_OP_STREAM_CREATE, &stream, sizeof stream,
                                          NULL, 0, &rep, sizeof rep, NULL, 0, NULL)
                          : pilot_call_on(device, PILOT_OP_EVENT_CREATE, &event, sizeof event,
                                          NULL, 0, &rep, sizeof rep, NULL, 0, NULL);
    if (err != cudaSuccess)
        return UINT64_MAX; /* names nothing: the call at hand fails with an invalid handle */
    o->handle = rep.value;
    o->generation = gen;
    if (!t_registered) {
        pthread_once(&g_exit_once, make_exit_key);
        pthread_setspecific(g_exit_key, (void *)1); /* runs thread_exit when the thread ends */
        t_registered = 1;
    }
    return o->handle;
}

/* Streams pilotd has accepted a cudaMallocAsync on, which still exist (forgotten when destroyed,
 * at a device reset and in a forked child): a cudaFreeAsync of an allocation on one of them (or
 * on the legacy stream) is posted (api_memory.c), since pilotd would accept its stream too.
 * Natively a free on a stream that does not exist fails at once
 * (cudaErrorInvalidResourceHandle), so a free on any other stream waits for pilotd's answer. A
 * full table only means more answers waited for. */
#define KNOWN_STREAMS 64
static pthread_mutex_t g_known_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_known[KNOWN_STREAMS];
static int g_nknown;

int pilot_stream_known(uint64_t stream)
{
    int found = stream == 0;
    pthread_mutex_lock(&g_known_lock);
    for (int i = 0; i < g_nknown && !found; i++)
        found = g_known[i] == stream;
    pthread_mutex_unlock(&g_known_lock);
    return found;
}

void pilot_stream_accepted(uint64_t stream)
{
    if (stream == 0 || pilot_stream_known(stream))
        return;
    pthread_mutex_lock(&g_known_lock);
    if (g_nknown < KNOWN_STREAMS)
        g_known[g_nknown++] = stream;
    pthread_mutex_unlock(&g_known_lock);
}

void pilot_stream_forget(uint64_t stream)
{
    pthread_mutex_lock(&g_known_lock);
    for (int i = 0; i < g_nknown; i++) {
        if (g_known[i] == stream) {
            g_known[i] = g_known[--g_nknown];
            break;
        }
    }
    pthread_mutex_unlock(&g_known_lock);
}

static void forget_streams_of(int device)
{
    pthread_mutex_lock(&g_known_lock);
    for (int i = 0; i < g_nknown;) {
        if (pilot_handle_device(g_known[i]) == device)
            g_known[i] = g_known[--g_nknown];
        else
            i++;
    }
    pthread_mutex_unlock(&g_known_lock);
}

static void fork_child(void)
{
    /* After fork: the parent's objects are not the child's (the forking thread's TLS is). */
    for (int d = 0; d < PILOT_MAX_DEVICES; d++)
        __atomic_add_fetch(&g_generation[d], 1, __ATOMIC_RELAXED);
    memset(t_objects, 0, sizeof t_objects);
    pthread_mutex_init(&g_known_lock, NULL);
    g_nknown = 0; /* nor are its streams */
}

static void reset_device(int device)
{
    __atomic_add_fetch(&g_generation[device], 1, __ATOMIC_RELAXED);
    forget_streams_of(device);
}

uint64_t pilot_stream_handle(cudaStream_t stream)
{
    uintptr_t v = (uintptr_t)stream;
    if (v == 0 || v == PILOT_STREAM_LEGACY)
        return 0;
    if (v == PILOT_STREAM_PER_THREAD)
        return pilot_thread_object(PILOT_PER_THREAD_STREAM, pilot_current_device());
    return v;
}

int pilot_handle_device(uint64_t handle)
{
    if (!handle)
        return pilot_current_device();
    return (int)((handle >> PILOT_HANDLE_DEVICE_SHIFT) & 0xFF);
}

PILOT_HOOK(stream_handles, .on_fork_child = fork_child,
           .on_device_reset = reset_device, .reset_rank = PILOT_RESET_STREAMS);
