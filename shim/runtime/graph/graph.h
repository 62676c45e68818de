/* CUDA graphs in the shim: the graph model (graph_model.c: graphs, nodes, their lock and
 * registry, graph allocations' references), what stream capture (graph_capture.c) and the graph
 * API (api_graph.c: executable graphs) share. Nothing here reaches the daemon: a graph
 * is the program's list of operations, and launching an executable graph issues them, in a
 * topological order, on the launch stream through the shim's ordinary entry points. */
#ifndef PILOT_GRAPH_H
#define PILOT_GRAPH_H

#include <pthread.h>

#include "shim.h"

struct pilot_kernel;

struct gnode;

struct ggraph {
    uint32_t magic;        /* GRAPH_MAGIC while alive */
    struct gnode **nodes;  /* creation order */
    size_t count, cap;
    struct gnode *owner;   /* the child-graph node that embeds it, or NULL */
};

/* A CUDA library call (cuBLAS GEMM, cuBLASLt matmul, ...) captured from a stream: the request
 * the stand-in posted, re-posted on the launch stream each time the graph runs (natively the
 * library's kernels are kernel nodes: such a node reports cudaGraphNodeTypeKernel). */
/* A kernel node's launch attributes (cudaGraphKernelNodeSetAttribute), made when one is first
 * set: the priority is applied when the node is issued; the hints (an L2 access policy window,
 * the memory sync domain and its map, the shared-memory carveout: dropped as launch attributes
 * are, api_launch_ex.c) are kept only to be answered back. */
#define PILOT_KERNEL_NODE_ATTRS 16 /* attribute ids below this */
struct gkattrs {
    uint32_t set; /* bit id: attribute id was set */
    cudaLaunchAttributeValue value[PILOT_KERNEL_NODE_ATTRS];
};

struct glib {
    uint16_t op;          /* the library opcode (PILOT_OP_BLAS_GEMM, ...) */
    int device;           /* the device of the library handle */
    size_t stream_offset; /* where the request holds its stream handle */
    unsigned char *req, *payload;
    size_t req_len, payload_len;
};

/* A graph allocation (graph_mem.c): the memory of an allocation node, made when the node is
 * made. Nodes that name it (the allocation node, its copies in executable graphs, free nodes)
 * hold references; it is freed once none does and the program does not hold it. */
struct gmem {
    void *ptr;
    size_t size;
    int device;
    unsigned refs;       /* nodes naming it */
    unsigned exec_allocs; /* copies of its allocation node in executable graphs */
    int live;            /* allocated as the program sees it: its allocation node ran, no free since */
    struct gmem *next;
};

struct gnode {
    uint32_t magic; /* NODE_MAGIC while alive */
    enum cudaGraphNodeType type;
    struct ggraph *graph;
    const struct gnode *orig; /* the node this one was copied from (clone, instantiate); never read */
    uint64_t seq;             /* creation number: a stable name in dot files */
    struct gnode **deps, **outs;
    size_t ndeps, cap_deps, nouts, cap_outs;
    int enabled;   /* in an executable graph: cudaGraphNodeSetEnabled */
    uint64_t mark; /* graph walks (graph_capture.c) */
    size_t index;  /* position in its graph's nodes, while a walk needs it (api_graph.c) */
    struct glib *lib; /* a kernel node that is a library call (u.k unused), else NULL */
    struct gkattrs *kattrs; /* a kernel node's attributes, once one was set, else NULL */
    union {
        struct {
            struct pilot_kernel *kernel;
            void *func;
            dim3 grid, block;
            unsigned shared;
            uint32_t nparams, arg_bytes;
            uint32_t *offsets, *sizes;
            unsigned char *buf; /* the arguments, packed at their offsets */
            void **args;        /* args[i] = buf + offsets[i] */
        } k;
        struct {
            struct cudaMemcpy3DParms p;
        } copy;
        struct {
            struct cudaMemsetParams p;
            unsigned char *pattern; /* one row, for values whose bytes differ (elementSize > 1) */
        } set;
        struct cudaHostNodeParams host;
        struct ggraph *child;
        cudaEvent_t event;
        struct {
            struct gmem *mem;
            size_t bytesize; /* asked for (the memory may be a bigger one this graph freed) */
            struct cudaMemPoolProps props;
            struct cudaMemAccessDesc *descs; /* the node's own copy */
            size_t ndescs;
        } alloc;
        struct gmem *freed; /* a free node's allocation */
    } u;
};

/* The lock over every graph object and the capture state. Graph calls hold it while they touch
 * objects; nothing that reaches the daemon is called with it held. */
extern pthread_mutex_t pilot_graph_lock;

/* The registry of live handles (graph_model.c; under the lock): every graph, node and
 * executable graph is registered while it lives, so a made-up handle is never touched. */
int pilot_graph_live_has(const void *p);
int pilot_graph_live_add(void *p); /* -1: out of memory */
void pilot_graph_live_del(const void *p);
/* Grows *array (of elements of `size` bytes, capacity *cap) to hold need; -1: out of memory. */
int pilot_graph_grow(void *array, size_t *cap, size_t need, size_t size);
/* Edges between two nodes of one graph: added (-1: out of memory), a pointer removed from an
 * edge list, and whether from -> to exists. */
int pilot_graph_edge_add(struct gnode *from, struct gnode *to);
void pilot_graph_remove_ptr(struct gnode **array, size_t *count, const struct gnode *p);
int pilot_graph_has_edge(const struct gnode *from, const struct gnode *to);

/* Handle checks (under the lock): the object if h is a live one of that kind, else NULL. */
struct ggraph *pilot_graph_get(cudaGraph_t h);
struct gnode *pilot_node_get(cudaGraphNode_t h);

struct ggraph *pilot_graph_new(void);        /* registered, empty */
void pilot_graph_free(struct ggraph *g);      /* with its nodes (and their child graphs) */
/* A node of type `type` added to g after deps (all already checked to be g's); NULL if out of
 * memory. Its parameters are the caller's to fill. */
struct gnode *pilot_node_add(struct ggraph *g, enum cudaGraphNodeType type, struct gnode *const *deps,
                             size_t ndeps);
void pilot_node_destroy(struct gnode *n);

/* Node parameters, checked and copied (kernel arguments deep-copied with the sizes the daemon
 * reported for the kernel). Called without the lock (they may resolve the kernel). */
cudaError_t pilot_node_set_kernel(struct gnode *n, const struct cudaKernelNodeParams *p);
cudaError_t pilot_node_set_kernel_packed(struct gnode *n, struct pilot_kernel *kernel, void *func,
                                         dim3 grid, dim3 block, unsigned shared,
                                         const struct pilot_kernel_launch_info *info,
                                         const unsigned char *buf);
cudaError_t pilot_node_set_copy(struct gnode *n, const struct cudaMemcpy3DParms *p);
cudaError_t pilot_node_set_copy_1d(struct gnode *n, void *dst, const void *src, size_t count,
                                   enum cudaMemcpyKind kind);
cudaError_t pilot_node_set_memset(struct gnode *n, const struct cudaMemsetParams *p);
/* Makes n (a kernel node) the library call `call` (copied). */
cudaError_t pilot_node_set_library(struct gnode *n, const struct glib *call);
/* A deep copy of src (its child graph too) as a node of g, without edges. */
struct gnode *pilot_node_copy(struct ggraph *g, const struct gnode *src);
struct ggraph *pilot_graph_clone(const struct ggraph *src); /* nodes' orig = src's nodes */

/* Issues one node's work on a stream (a program's cudaStream_t). */
cudaError_t pilot_node_issue(const struct gnode *n, cudaStream_t stream);

/* The common part of every cudaGraphAdd*Node (graph_model.c): checks graph and dependencies, adds
 * the node, lets fill() set its parameters under the lock, and undoes the node if that fails. */
cudaError_t pilot_graph_add(cudaGraphNode_t *pNode, cudaGraph_t graph, const cudaGraphNode_t *deps,
                            size_t ndeps, enum cudaGraphNodeType type,
                            cudaError_t (*fill)(struct gnode *, const void *), const void *arg);
/* 1 if g holds an allocation or free node, itself or in a child graph moved into it (a copied
 * child graph cannot have them). Under the lock. */
int pilot_graph_has_mem_nodes(const struct ggraph *g);
/* Marks `from` and every node they depend on, directly or not, with a new mark (*mark); 0 if
 * out of memory. Under the lock. */
int pilot_graph_mark_ancestors(struct gnode *const *from, size_t n, uint64_t *mark);

/* ---- graph allocations: graph_mem.c makes and frees their memory (pilot_gmem_create,
 * pilot_gmem_drain: stream capture reaches them through shim/core/hooks.h) and runs them
 * (before_launch, issued); graph_model.c keeps the table and the nodes' references. ---- */
/* An allocation node's parameters checked and its memory made (without the lock); *out comes
 * with the creator's reference, for pilot_gmem_unref once a node took its own. */
cudaError_t pilot_gmem_create(const struct cudaMemAllocNodeParams *p, struct gmem **out);
/* Under the lock: memory of g that an allocation node after deps may have again, as CUDA
 * reuses freed graph memory: every allocation of it in g freed in g, each free ordered before
 * deps, and big enough on the same device. NULL if none. */
struct gmem *pilot_gmem_reusable(const struct ggraph *g, struct gnode *const *deps, size_t ndeps,
                                 const struct cudaMemAllocNodeParams *p);
/* Under the lock: 1 if a free node of m may be added to g (not all of its allocations in g, or
 * the one it came with from elsewhere, are freed in g already). */
int pilot_gmem_can_free(const struct ggraph *g, const struct gmem *m);
/* Under the lock: the allocation at exactly ptr, or NULL. */
struct gmem *pilot_gmem_find(const void *ptr);
/* Under the lock: a node's reference, taken and dropped (the last one, with the program not
 * holding the memory, queues it to be freed by pilot_gmem_drain). */
void pilot_gmem_ref(struct gmem *m, int exec_alloc);
void pilot_gmem_unref(struct gmem *m, int exec_alloc);
/* Without the lock: frees what pilot_gmem_unref queued (after cudaGraphDestroy and the like). */
void pilot_gmem_drain(void);
/* In a forked child: the parent's graph allocations are not this process's to free or track. */
void pilot_gmem_forget(void);
/* The table of graph allocations (graph_model.c, beside the nodes that hold them; graph_mem.c
 * makes and frees their memory): m entered (takes the lock); the released ones taken to be
 * freed (NULL if none; takes the lock); 1 if some wait to be freed. */
void pilot_gmem_track(struct gmem *m);
struct gmem *pilot_gmem_take_released(void);
int pilot_gmem_released_pending(void);
/* cudaFree or cudaFreeAsync of ptr (takes the lock): 0 if no graph allocated it, else 1 with
 * *err set (cudaErrorInvalidValue if it is not allocated now) and the allocation released. */
int pilot_gmem_user_release(void *ptr, cudaError_t *err);
/* The bytes of graph allocations on device now and at most since the last reset (takes the
 * lock); the high watermark reset to the current value. */
void pilot_gmem_usage(int device, unsigned long long *current, unsigned long long *high);
void pilot_gmem_reset_high(int device);
/* Fills an allocation node (under the lock): n->u.alloc from p and m, a reference taken
 * (exec_alloc: n is a copy in an executable graph). */
cudaError_t pilot_gmem_fill_alloc(struct gnode *n, const struct cudaMemAllocNodeParams *p,
                                  struct gmem *m, int exec_alloc);
/* Under the lock: before an executable graph's nodes are issued, its allocations must not be
 * live (with auto_free they are freed first). */
cudaError_t pilot_gmem_before_launch(struct gnode *const *order, size_t count, int auto_free);
/* An allocation or free node issued: its allocation becomes live or not (takes the lock). */
void pilot_gmem_issued(const struct gnode *n);

/* ---- graph_capture.c ---- */
/* 1 if a capture under way builds g (cudaGraphDestroy refuses it). Under the lock. */
int pilot_capture_owns(const struct ggraph *g);
/* cudaGraphLaunch into a capturing stream: 1 if the stream captures (then a child graph node,
 * a copy of g, was added, or *err says why not), 0 if the launch is to be issued. */
int pilot_capture_graph(cudaStream_t stream, const struct ggraph *g, cudaError_t *err);

#endif
