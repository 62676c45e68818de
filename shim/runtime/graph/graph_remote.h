/* Executable graphs instantiated in pilotd as CUDA graphs (graph_remote.c). */
#ifndef PILOT_GRAPH_REMOTE_H
#define PILOT_GRAPH_REMOTE_H

#include <stdint.h>

#include "graph.h"
#include "shim.h"

enum gremote_state {
    GREMOTE_UNTRIED = 0, /* not instantiated in pilotd yet */
    GREMOTE_READY,       /* pilotd holds its graph: a launch is one GRAPH_LAUNCH */
    GREMOTE_STALE,       /* the program changed the exec since: instantiated again at launch */
    GREMOTE_REPLAY,      /* pilotd holds none: the shim issues its nodes (reason says why) */
};

/* An executable graph's twin in pilotd. */
struct gremote {
    int state;       /* enum gremote_state */
    int device;      /* the device it was recorded on */
    uint32_t reason; /* enum pilot_graph_replay, while GREMOTE_REPLAY */
    uint32_t nodes;  /* nodes of pilotd's graph, while GREMOTE_READY */
};

/* Before a recording: the stream to issue the exec's nodes (`order`, in launch order) on, or
 * NULL when pilotd cannot hold them (r->state is then GREMOTE_REPLAY). Kernels are resolved
 * first: a resolution waits for pilotd, which a recording cannot. */
cudaStream_t pilot_graph_remote_prepare(struct gremote *r, struct gnode *const *order,
                                        size_t count);
/* After it (issued: the first error issuing the nodes): pilotd instantiates the records as exec
 * `id`, replacing what it held for `id`. cudaSuccess with r->state READY or REPLAY, or the
 * error of a node pilotd refused (or of the connection). Frees rec->buf. */
cudaError_t pilot_graph_remote_send(struct gremote *r, uint64_t id, cudaStream_t stream,
                                    struct pilot_recording *rec, cudaError_t issued);
/* 1 when the launch went to pilotd as one call (*err its result), 0 when the caller must issue
 * the nodes itself. */
int pilot_graph_remote_launch(const struct gremote *r, uint64_t id, cudaStream_t stream,
                              cudaError_t *err);
/* Tells pilotd the exec is gone (if it held a graph for it). */
void pilot_graph_remote_destroy(const struct gremote *r, uint64_t id);

#endif
