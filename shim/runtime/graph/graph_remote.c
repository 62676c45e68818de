/* Executable graphs as real CUDA graphs in pilotd (graph_remote.h).
 *
 * At instantiation api_graph.c issues the exec's nodes, in its launch order, onto a stream of
 * the shim's own (one per device, pilot_graph_remote_prepare) with the thread recording
 * (transport.c): nothing is sent, every posted call is kept. The records go to pilotd in one GRAPH_INSTANTIATE; pilotd runs them through its
 * ordinary handlers (the same checks as calls that are not in a graph) while it captures that
 * stream, and instantiates what it captured. A launch is then one posted GRAPH_LAUNCH, which
 * pilotd's C fast path turns into one cuGraphLaunch.
 *
 * The shim replays the exec node by node as before (api_graph.c) when pilotd holds no graph for
 * it: a node it cannot record (host, event and memory nodes, a call that waits for an answer,
 * such as a copy from pageable memory), a process with managed memory (coherence acts per
 * launch), a session whose launches a policy decides, or a daemon without graph support. A node
 * pilotd refuses (memory that is not the session's) fails the instantiation itself. */
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "graph_remote.h"
#include "log.h"
#include "shim.h"

static pthread_mutex_t g_streams_lock = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t g_record_stream[PILOT_MAX_DEVICES]; /* made on first use, never destroyed */
/* Past enum pilot_graph_replay's reasons: the daemon does not know the opcodes. */
#define REPLAY_NO_DAEMON_SUPPORT 5
static int g_logged_reason[8];

static const char *reason_text(uint32_t reason)
{
    switch (reason) {
    case PILOT_GRAPH_REPLAY_NODE:
        return "a node pilotd cannot put in a CUDA graph (a host, event or memory node, or a copy "
               "that involves host memory)";
    case PILOT_GRAPH_REPLAY_POLICY:
        return "the session's launches go one by one through a policy, the capacity enforcer, "
               "kernel timing or managed memory";
    case PILOT_GRAPH_REPLAY_CAPTURE:
        return "the driver did not capture one of its nodes";
    case PILOT_GRAPH_REPLAY_LIMIT:
        return "the session holds as many graphs as pilotd keeps for one";
    default:
        return "pilotd does not instantiate graphs";
    }
}

static void set_replay(struct gremote *r, uint32_t reason)
{
    r->state = GREMOTE_REPLAY;
    r->reason = reason;
    if (reason < sizeof g_logged_reason / sizeof g_logged_reason[0] &&
        !__atomic_exchange_n(&g_logged_reason[reason], 1, __ATOMIC_RELAXED))
        LOG_INFO("a CUDA graph is replayed node by node (each node one call to pilotd): %s",
                 reason_text(reason));
}

static cudaStream_t record_stream(int dev)
{
    pthread_mutex_lock(&g_streams_lock);
    cudaStream_t s = g_record_stream[dev];
    if (!s && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess)
        g_record_stream[dev] = s;
    pthread_mutex_unlock(&g_streams_lock);
    return s;
}

/* Whether every node is one pilotd may be able to capture; kernels resolved on `dev` first (a
 * resolution is a call that waits for pilotd, which a recording cannot make). */
static int recordable(struct gnode *const *order, size_t count, int dev)
{
    for (size_t i = 0; i < count; i++) {
        const struct gnode *n = order[i];
        switch (n->type) {
        case cudaGraphNodeTypeKernel:
            if (n->lib ? n->lib->device != dev : pilot_kernel_resolve(n->u.k.kernel, dev) != 0)
                return 0;
            break;
        case cudaGraphNodeTypeMemcpy:
        case cudaGraphNodeTypeMemset:
        case cudaGraphNodeTypeEmpty:
            break;
        default:
            return 0;
        }
    }
    return 1;
}

cudaStream_t pilot_graph_remote_prepare(struct gremote *r, struct gnode *const *order,
                                        size_t count)
{
    int dev = pilot_current_device();
    r->device = dev;
    if (pilot_um_active()) {
        set_replay(r, PILOT_GRAPH_REPLAY_POLICY);
        return NULL;
    }
    cudaError_t last = pilot_last_error_swap(cudaSuccess); /* resolving is not the program's */
    cudaStream_t stream = recordable(order, count, dev) ? record_stream(dev) : NULL;
    pilot_last_error_swap(last);
    if (!stream)
        set_replay(r, PILOT_GRAPH_REPLAY_NODE);
    return stream;
}

cudaError_t pilot_graph_remote_send(struct gremote *r, uint64_t id, cudaStream_t stream,
                                    struct pilot_recording *rec, cudaError_t issued)
{
    if (issued || rec->failed) {
        free(rec->buf);
        set_replay(r, PILOT_GRAPH_REPLAY_NODE);
        return cudaSuccess;
    }
    pilot_req_graph req = {.exec = id, .stream = pilot_stream_handle(stream), .count = rec->count};
    pilot_rep_graph rep;
    cudaError_t err = pilot_call_on(r->device, PILOT_OP_GRAPH_INSTANTIATE, &req, sizeof req,
                                    rec->buf, rec->len, &rep, sizeof rep, NULL, 0, NULL);
    free(rec->buf);
    if (err == cudaErrorNotSupported) { /* a pilotd without graphs */
        set_replay(r, REPLAY_NO_DAEMON_SUPPORT);
        return cudaSuccess;
    }
    if (err)
        return err; /* a node pilotd refused, or the connection */
    if (rep.replay) {
        set_replay(r, rep.replay);
        return cudaSuccess;
    }
    r->state = GREMOTE_READY;
    r->nodes = rep.nodes;
    return cudaSuccess;
}

int pilot_graph_remote_launch(const struct gremote *r, uint64_t id, cudaStream_t stream,
                              cudaError_t *err)
{
    if (r->state != GREMOTE_READY || pilot_um_active())
        return 0;
    uint64_t handle = pilot_stream_handle(stream);
    int dev = handle ? pilot_handle_device(handle) : pilot_current_device();
    if (dev != r->device)
        return 0; /* another device's stream: the nodes are issued there */
    pilot_req_graph req = {.exec = id, .stream = handle};
    *err = pilot_post_on(dev, PILOT_OP_GRAPH_LAUNCH, &req, sizeof req, NULL, 0);
    return 1;
}

void pilot_graph_remote_destroy(const struct gremote *r, uint64_t id)
{
    if (r->state != GREMOTE_READY && r->state != GREMOTE_STALE)
        return;
    pilot_req_graph req = {.exec = id};
    (void)pilot_post_on(r->device, PILOT_OP_GRAPH_DESTROY, &req, sizeof req, NULL, 0);
}
