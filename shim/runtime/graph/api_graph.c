/* CUDA graphs, kept in the shim (graph.h): a cudaGraph_t is a list of nodes with dependency
 * edges; cudaGraphInstantiate copies it into a cudaGraphExec_t whose nodes are in a topological
 * order (child graphs flattened in place); cudaGraphLaunch issues them in that order, one after
 * the other, on the launch stream, through the shim's ordinary entry points (a kernel node is a
 * cudaLaunchKernel, a memcpy node a cudaMemcpyAsync or cudaMemcpy2DAsync, a host node a
 * cudaLaunchHostFunc, ...). One stream runs everything in an order the graph allows, so a
 * launch is correct but never runs two branches of the graph at once, and costs what issuing its
 * nodes one by one costs.
 *
 * Handles are pointers to the shim's objects (graph_model.c keeps them), but every call looks a
 * handle up in a registry of live objects before it touches it: a destroyed or made-up handle is cudaErrorInvalidValue, never
 * a crash. Kernel arguments are copied when a node is created or set (kernelParams point into the
 * caller's stack), with the parameter sizes the daemon reported for the kernel. A kernel node's
 * attributes are kept with it (struct gkattrs): its priority is applied when it is issued, the
 * hints only answered back. Graph memory (allocation and free) nodes keep their allocations in
 * graph_model.c's table, their memory made and freed by graph_mem.c; a graph that has them cannot be cloned, be a child graph, lose nodes or edges,
 * or have two executable graphs at once, and an update must keep its allocations, as in CUDA. Not
 * carried (cudaErrorNotSupported, logged once): memcpy nodes with CUDA arrays, kernel nodes given
 * their arguments through `extra`, conditional nodes, external semaphores, device launch,
 * cooperative and cluster kernel node attributes. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "graph_remote.h"
#include "log.h"

#define EXEC_MAGIC 0x45584543u

struct gexec {
    uint32_t magic;
    struct ggraph *graph;  /* the instantiated copy; nodes' orig = the program's nodes */
    struct gnode **order;  /* what a launch issues: topological, child graphs flattened */
    size_t count;
    unsigned long long flags;
    int has_mem;           /* allocation or free nodes: a launch checks their allocations first */
    struct gremote remote; /* its CUDA graph in pilotd, if any (graph_remote.c) */
};

/* The program changed exec e: pilotd's graph (if any) is instantiated again before its next
 * launch, and a graph that could not be recorded is tried again. */
static void exec_changed(struct gexec *e)
{
    if (e->remote.state == GREMOTE_READY)
        e->remote.state = GREMOTE_STALE;
    else if (e->remote.state == GREMOTE_REPLAY && e->remote.reason == PILOT_GRAPH_REPLAY_NODE)
        e->remote.state = GREMOTE_UNTRIED;
}

static struct gexec *exec_get(cudaGraphExec_t h)
{
    struct gexec *e = (struct gexec *)h;
    return pilot_graph_live_has(e) && e->magic == EXEC_MAGIC ? e : NULL;
}

/* ---- node parameters ---- */

static int g_logged_extra;

/* The kernel a cudaKernelNodeParams.func names (a host stub or a cudaKernel_t of ours), resolved
 * on the current device: its parameter layout. Without the lock (may ask the daemon). */
static cudaError_t kernel_of(const void *func, struct pilot_kernel **kernel,
                             struct pilot_kernel_launch_info *info)
{
    struct pilot_kernel *k = pilot_kernel_from_host(func);
    if (!k)
        k = pilot_kernel_from_handle(func);
    if (!k)
        return cudaErrorInvalidDeviceFunction;
    const int dev = pilot_current_device();
    cudaError_t err = pilot_kernel_resolve(k, dev);
    if (err)
        return err;
    pilot_kernel_info(k, dev, info);
    *kernel = k;
    return cudaSuccess;
}

/* Packs kernelParams (the caller's pointers, read now) into a buffer laid out as the kernel's
 * parameters are. */
static cudaError_t pack_kernel(const struct cudaKernelNodeParams *p,
                               const struct pilot_kernel_launch_info *info, unsigned char **out)
{
    if (p->extra) {
        if (!__atomic_exchange_n(&g_logged_extra, 1, __ATOMIC_RELAXED))
            LOG_WARN("kernel graph nodes with `extra` arguments are not supported by pilot");
        return cudaErrorNotSupported;
    }
    if (info->nparams && !p->kernelParams)
        return cudaErrorInvalidValue;
    unsigned char *buf = calloc(1, info->arg_bytes ? info->arg_bytes : 1);
    if (!buf)
        return cudaErrorMemoryAllocation;
    for (uint32_t i = 0; i < info->nparams; i++)
        memcpy(buf + info->params[i].offset, p->kernelParams[i], info->params[i].size);
    *out = buf;
    return cudaSuccess;
}

/* ---- copies ---- */

static cudaError_t node_copy_params(struct gnode *dst, const struct gnode *src);
static void index_nodes(const struct ggraph *g);

struct gnode *pilot_node_copy(struct ggraph *g, const struct gnode *src)
{
    struct gnode *n = pilot_node_add(g, src->type, NULL, 0);
    if (!n)
        return NULL;
    n->orig = src;
    n->enabled = src->enabled;
    if (node_copy_params(n, src)) {
        pilot_node_destroy(n);
        return NULL;
    }
    return n;
}

/* A library node on the launch stream: its request again, with that stream's handle. */
static cudaError_t issue_library(const struct glib *lib, cudaStream_t stream)
{
    uint64_t handle = pilot_stream_handle(stream);
    if (handle && pilot_handle_device(handle) != lib->device)
        return cudaErrorInvalidValue; /* a stream of another device than the library handle's */
    unsigned char *req = malloc(lib->req_len);
    if (!req)
        return cudaErrorMemoryAllocation;
    memcpy(req, lib->req, lib->req_len);
    memcpy(req + lib->stream_offset, &handle, sizeof handle);
    cudaError_t err = pilot_um_before_launch();
    if (!err)
        err = pilot_post_on(lib->device, lib->op, req, lib->req_len, lib->payload,
                            lib->payload_len);
    free(req);
    return err;
}

/* dst's attributes become a copy of src's (none: none). */
static cudaError_t copy_kattrs(struct gnode *dst, const struct gnode *src)
{
    if (!src->kattrs) {
        free(dst->kattrs);
        dst->kattrs = NULL;
        return cudaSuccess;
    }
    if (!dst->kattrs && !(dst->kattrs = malloc(sizeof *dst->kattrs)))
        return cudaErrorMemoryAllocation;
    *dst->kattrs = *src->kattrs;
    return cudaSuccess;
}

static cudaError_t node_copy_params(struct gnode *dst, const struct gnode *src)
{
    switch (src->type) {
    case cudaGraphNodeTypeKernel: {
        if (src->lib)
            return pilot_node_set_library(dst, src->lib);
        cudaError_t err = copy_kattrs(dst, src);
        if (err)
            return err;
        pilot_param_info params[src->u.k.nparams ? src->u.k.nparams : 1];
        for (uint32_t i = 0; i < src->u.k.nparams; i++)
            params[i] = (pilot_param_info){.offset = src->u.k.offsets[i], .size = src->u.k.sizes[i]};
        struct pilot_kernel_launch_info info = {.nparams = src->u.k.nparams,
                                                .arg_bytes = src->u.k.arg_bytes, .params = params};
        return pilot_node_set_kernel_packed(dst, src->u.k.kernel, src->u.k.func, src->u.k.grid,
                                            src->u.k.block, src->u.k.shared, &info, src->u.k.buf);
    }
    case cudaGraphNodeTypeMemset:
        return pilot_node_set_memset(dst, &src->u.set.p);
    case cudaGraphNodeTypeGraph:
        if (dst->u.child) {
            pilot_graph_free(dst->u.child);
            dst->u.child = NULL;
        }
        if (!(dst->u.child = pilot_graph_clone(src->u.child)))
            return cudaErrorMemoryAllocation;
        dst->u.child->owner = dst;
        return cudaSuccess;
    case cudaGraphNodeTypeMemAlloc: { /* only instantiation copies these (no clone, no child) */
        struct cudaMemAllocNodeParams p = {.poolProps = src->u.alloc.props,
                                           .accessDescs = src->u.alloc.descs,
                                           .accessDescCount = src->u.alloc.ndescs,
                                           .bytesize = src->u.alloc.bytesize};
        return pilot_gmem_fill_alloc(dst, &p, src->u.alloc.mem, 1);
    }
    case cudaGraphNodeTypeMemFree:
        dst->u.freed = src->u.freed;
        pilot_gmem_ref(dst->u.freed, 0);
        return cudaSuccess;
    default:
        dst->u = src->u;
        return cudaSuccess;
    }
}

struct ggraph *pilot_graph_clone(const struct ggraph *src)
{
    struct ggraph *g = pilot_graph_new();
    if (!g)
        return NULL;
    for (size_t i = 0; i < src->count; i++)
        if (!pilot_node_copy(g, src->nodes[i])) {
            pilot_graph_free(g);
            return NULL;
        }
    index_nodes(src);
    for (size_t i = 0; i < src->count; i++) {
        const struct gnode *from = src->nodes[i];
        for (size_t j = 0; j < from->nouts; j++) {
            if (pilot_graph_edge_add(g->nodes[i], g->nodes[from->outs[j]->index])) {
                pilot_graph_free(g);
                return NULL;
            }
        }
    }
    return g;
}

/* ---- launching ---- */

static cudaError_t issue_copy(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
    const struct cudaPitchedPtr *s = &p->srcPtr, *d = &p->dstPtr;
    size_t soff = p->srcPos.z * s->pitch * s->ysize + p->srcPos.y * s->pitch + p->srcPos.x;
    size_t doff = p->dstPos.z * d->pitch * d->ysize + p->dstPos.y * d->pitch + p->dstPos.x;
    const char *src = (const char *)s->ptr + soff;
    char *dst = (char *)d->ptr + doff;
    const struct cudaExtent *e = &p->extent;
    if (e->height == 1 && e->depth == 1)
        return cudaMemcpyAsync(dst, src, e->width, p->kind, stream);
    for (size_t z = 0; z < e->depth; z++) {
        cudaError_t err = cudaMemcpy2DAsync(dst + z * d->pitch * d->ysize, d->pitch,
                                            src + z * s->pitch * s->ysize, s->pitch, e->width,
                                            e->height, p->kind, stream);
        if (err)
            return err;
    }
    return cudaSuccess;
}

static cudaError_t issue_memset(const struct gnode *n, cudaStream_t stream)
{
    const struct cudaMemsetParams *p = &n->u.set.p;
    size_t row = p->width * p->elementSize;
    if (!n->u.set.pattern) {
        if (p->height == 1)
            return cudaMemsetAsync(p->dst, (int)(p->value & 0xff), row, stream);
        return cudaMemset2DAsync(p->dst, p->pitch, (int)(p->value & 0xff), row, p->height, stream);
    }
    if ((p->elementSize == 2 || p->elementSize == 4) && (p->height == 1 || p->pitch == row))
        return pilot_memset_elems(p->dst, p->value, p->elementSize, p->width * p->height,
                                  pilot_stream_handle(stream), 0); /* cuMemsetD16/D32Async */
    for (size_t r = 0; r < p->height; r++) {
        cudaError_t err = cudaMemcpyAsync((char *)p->dst + r * p->pitch, n->u.set.pattern, row,
                                          cudaMemcpyHostToDevice, stream);
        if (err)
            return err;
    }
    return cudaSuccess;
}

cudaError_t pilot_node_issue(const struct gnode *n, cudaStream_t stream)
{
    switch (n->type) {
    case cudaGraphNodeTypeKernel:
        if (n->lib)
            return issue_library(n->lib, stream);
        if (n->kattrs && (n->kattrs->set & (1u << cudaLaunchAttributePriority))) {
            struct pilot_launch_ex ex = {.priority = n->kattrs->value[cudaLaunchAttributePriority].priority,
                                         .has_priority = 1};
            return pilot_launch(n->u.k.kernel, n->u.k.grid, n->u.k.block, n->u.k.args,
                                n->u.k.shared, stream, &ex);
        }
        return pilot_launch(n->u.k.kernel, n->u.k.grid, n->u.k.block, n->u.k.args, n->u.k.shared,
                            stream, NULL);
    case cudaGraphNodeTypeMemcpy:
        return issue_copy(&n->u.copy.p, stream);
    case cudaGraphNodeTypeMemset:
        return issue_memset(n, stream);
    case cudaGraphNodeTypeHost:
        return cudaLaunchHostFunc(stream, n->u.host.fn, n->u.host.userData);
    case cudaGraphNodeTypeEventRecord:
        return cudaEventRecord(n->u.event, stream);
    case cudaGraphNodeTypeWaitEvent:
        return cudaStreamWaitEvent(stream, n->u.event, 0);
    case cudaGraphNodeTypeMemAlloc: /* the memory exists: the allocation becomes live */
    case cudaGraphNodeTypeMemFree:
        pilot_gmem_issued(n);
        return cudaSuccess;
    default: /* empty nodes; child graphs are flattened at instantiation */
        return cudaSuccess;
    }
}

/* 1 if an allocation node of g (or of a child graph moved into it) has a copy in an executable
 * graph: CUDA allows one executable graph at a time for a graph with memory nodes. */
static int has_exec(const struct ggraph *g)
{
    for (size_t i = 0; i < g->count; i++) {
        const struct gnode *n = g->nodes[i];
        if ((n->type == cudaGraphNodeTypeMemAlloc && n->u.alloc.mem->exec_allocs) ||
            (n->type == cudaGraphNodeTypeGraph && has_exec(n->u.child)))
            return 1;
    }
    return 0;
}

/* Numbers g's nodes (n->index = position in g->nodes) for the walks below. */
static void index_nodes(const struct ggraph *g)
{
    for (size_t i = 0; i < g->count; i++)
        g->nodes[i]->index = i;
}

/* Appends g's nodes to e->order in a topological order (Kahn's, a FIFO of ready nodes seeded in
 * creation order), child graphs in place. -1: a cycle; -2: out of memory. */
static int order_graph(struct gexec *e, const struct ggraph *g, size_t *cap)
{
    size_t n = g->count, head = 0, tail = 0;
    size_t *indeg = malloc((n ? n : 1) * sizeof *indeg);
    struct gnode **ready = malloc((n ? n : 1) * sizeof *ready);
    int rc = indeg && ready ? 0 : -2;
    if (rc == 0)
        index_nodes(g);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!(indeg[i] = g->nodes[i]->ndeps))
            ready[tail++] = g->nodes[i];
    while (rc == 0 && head < tail) {
        struct gnode *node = ready[head++];
        for (size_t j = 0; j < node->nouts; j++)
            if (--indeg[node->outs[j]->index] == 0)
                ready[tail++] = node->outs[j];
        if (node->type == cudaGraphNodeTypeGraph) {
            rc = order_graph(e, node->u.child, cap); /* renumbers the child's nodes only */
        } else if (pilot_graph_grow(&e->order, cap, e->count + 1, sizeof *e->order)) {
            rc = -2;
        } else {
            e->order[e->count++] = node;
        }
    }
    if (rc == 0 && head < n)
        rc = -1; /* the nodes left all wait for one another: a cycle */
    free(indeg);
    free(ready);
    return rc;
}

/* An exec's copy is its own: no program handle may reach its graph, nodes or child graphs. */
static void unregister(const struct ggraph *g)
{
    pilot_graph_live_del(g);
    for (size_t i = 0; i < g->count; i++) {
        pilot_graph_live_del(g->nodes[i]);
        if (g->nodes[i]->type == cudaGraphNodeTypeGraph)
            unregister(g->nodes[i]->u.child);
    }
}

static void exec_free(struct gexec *e)
{
    pilot_graph_live_del(e);
    e->magic = 0;
    pilot_graph_free(e->graph);
    free(e->order);
    free(e);
}

/* The node of e's graph (top level) copied from the program's node `node`. */
static struct gnode *exec_node(const struct gexec *e, const struct gnode *node)
{
    for (size_t i = 0; i < e->graph->count; i++)
        if (e->graph->nodes[i]->orig == node)
            return e->graph->nodes[i];
    return NULL;
}

/* ---- the API: graphs ---- */

#define LOCKED(expr)                                 \
    do {                                             \
        pthread_mutex_lock(&pilot_graph_lock);       \
        cudaError_t e__ = (expr);                    \
        pthread_mutex_unlock(&pilot_graph_lock);     \
        PILOT_RETURN(e__);                           \
    } while (0)

/* The same, for a helper that returns the value instead. */
#define LOCKED_VALUE(expr)                           \
    do {                                             \
        pthread_mutex_lock(&pilot_graph_lock);       \
        cudaError_t e__ = (expr);                    \
        pthread_mutex_unlock(&pilot_graph_lock);     \
        return e__;                                  \
    } while (0)

PILOT_EXPORT cudaError_t cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags)
{
    if (!pGraph || flags)
        PILOT_RETURN(cudaErrorInvalidValue);
    pthread_mutex_lock(&pilot_graph_lock);
    struct ggraph *g = pilot_graph_new();
    pthread_mutex_unlock(&pilot_graph_lock);
    if (!g)
        PILOT_RETURN(cudaErrorMemoryAllocation);
    *pGraph = (cudaGraph_t)g;
    return cudaSuccess;
}

static cudaError_t graph_destroy(cudaGraph_t graph)
{
    struct ggraph *g = pilot_graph_get(graph);
    if (!g || g->owner) /* a child graph belongs to its node */
        return cudaErrorInvalidValue;
    if (pilot_capture_owns(g))
        return cudaErrorIllegalState;
    pilot_graph_free(g);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = graph_destroy(graph);
    pthread_mutex_unlock(&pilot_graph_lock);
    pilot_gmem_drain(); /* allocations no node names any more */
    PILOT_RETURN(err);
}

struct kernel_fill {
    struct pilot_kernel *kernel;
    const struct cudaKernelNodeParams *p;
    const struct pilot_kernel_launch_info *info;
    const unsigned char *buf;
};

static cudaError_t fill_kernel(struct gnode *n, const void *arg)
{
    const struct kernel_fill *f = arg;
    return pilot_node_set_kernel_packed(n, f->kernel, f->p->func, f->p->gridDim, f->p->blockDim,
                                        f->p->sharedMemBytes, f->info, f->buf);
}

/* Resolves and packs a cudaKernelNodeParams (without the lock): f->buf is the caller's to free. */
static cudaError_t prepare_kernel(const struct cudaKernelNodeParams *p, struct kernel_fill *f,
                                  struct pilot_kernel_launch_info *info)
{
    if (!p)
        return cudaErrorInvalidValue;
    cudaError_t err = pilot_sticky_error();
    if (err == cudaSuccess)
        err = pilot_ensure_session();
    if (err == cudaSuccess)
        err = kernel_of(p->func, &f->kernel, info);
    unsigned char *buf = NULL;
    if (err == cudaSuccess)
        err = pack_kernel(p, info, &buf);
    f->p = p;
    f->info = info;
    f->buf = buf;
    return err;
}

PILOT_EXPORT cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                const cudaGraphNode_t *pDependencies,
                                                size_t numDependencies,
                                                const struct cudaKernelNodeParams *pNodeParams)
{
    if (!pGraphNode)
        PILOT_RETURN(cudaErrorInvalidValue);
    pthread_mutex_lock(&pilot_graph_lock);
    int valid = pilot_graph_get(graph) != NULL;
    pthread_mutex_unlock(&pilot_graph_lock);
    if (!valid)
        PILOT_RETURN(cudaErrorInvalidValue);
    struct kernel_fill f;
    struct pilot_kernel_launch_info info;
    cudaError_t err = prepare_kernel(pNodeParams, &f, &info);
    if (err == cudaSuccess)
        err = pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeKernel,
                       fill_kernel, &f);
    free((void *)f.buf);
    PILOT_RETURN(err);
}

static cudaError_t fill_copy(struct gnode *n, const void *arg)
{
    return pilot_node_set_copy(n, arg);
}

PILOT_EXPORT cudaError_t cudaGraphAddMemcpyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                const cudaGraphNode_t *pDependencies,
                                                size_t numDependencies,
                                                const struct cudaMemcpy3DParms *pCopyParams)
{
    if (!pCopyParams)
        PILOT_RETURN(cudaErrorInvalidValue);
    return pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeMemcpy,
                    fill_copy, pCopyParams);
}

struct copy_1d {
    void *dst;
    const void *src;
    size_t count;
    enum cudaMemcpyKind kind;
};

static cudaError_t fill_copy_1d(struct gnode *n, const void *arg)
{
    const struct copy_1d *c = arg;
    return pilot_node_set_copy_1d(n, c->dst, c->src, c->count, c->kind);
}

PILOT_EXPORT cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                  const cudaGraphNode_t *pDependencies,
                                                  size_t numDependencies, void *dst,
                                                  const void *src, size_t count,
                                                  enum cudaMemcpyKind kind)
{
    struct copy_1d c = {dst, src, count, kind};
    return pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeMemcpy,
                    fill_copy_1d, &c);
}

/* A symbol copy's device address (address of the variable + offset, checked against its size). */
static cudaError_t symbol_address(const void *symbol, size_t count, size_t offset, char **addr)
{
    void *base = NULL;
    size_t size = 0;
    cudaError_t err = cudaGetSymbolAddress(&base, symbol);
    if (err == cudaSuccess)
        err = cudaGetSymbolSize(&size, symbol);
    if (err)
        return err;
    if (offset > size || count > size - offset)
        return cudaErrorInvalidValue;
    *addr = (char *)base + offset;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphAddMemcpyNodeToSymbol(cudaGraphNode_t *pGraphNode,
                                                        cudaGraph_t graph,
                                                        const cudaGraphNode_t *pDependencies,
                                                        size_t numDependencies, const void *symbol,
                                                        const void *src, size_t count,
                                                        size_t offset, enum cudaMemcpyKind kind)
{
    char *addr = NULL;
    cudaError_t err = symbol_address(symbol, count, offset, &addr);
    if (err)
        PILOT_RETURN(err);
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        PILOT_RETURN(cudaErrorInvalidMemcpyDirection);
    return cudaGraphAddMemcpyNode1D(pGraphNode, graph, pDependencies, numDependencies, addr, src,
                                    count, kind);
}

PILOT_EXPORT cudaError_t cudaGraphAddMemcpyNodeFromSymbol(cudaGraphNode_t *pGraphNode,
                                                          cudaGraph_t graph,
                                                          const cudaGraphNode_t *pDependencies,
                                                          size_t numDependencies, void *dst,
                                                          const void *symbol, size_t count,
                                                          size_t offset, enum cudaMemcpyKind kind)
{
    char *addr = NULL;
    cudaError_t err = symbol_address(symbol, count, offset, &addr);
    if (err)
        PILOT_RETURN(err);
    if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        PILOT_RETURN(cudaErrorInvalidMemcpyDirection);
    return cudaGraphAddMemcpyNode1D(pGraphNode, graph, pDependencies, numDependencies, dst, addr,
                                    count, kind);
}

static cudaError_t fill_memset(struct gnode *n, const void *arg)
{
    return pilot_node_set_memset(n, arg);
}

PILOT_EXPORT cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                const cudaGraphNode_t *pDependencies,
                                                size_t numDependencies,
                                                const struct cudaMemsetParams *pMemsetParams)
{
    if (!pMemsetParams)
        PILOT_RETURN(cudaErrorInvalidValue);
    return pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeMemset,
                    fill_memset, pMemsetParams);
}

static cudaError_t fill_host(struct gnode *n, const void *arg)
{
    const struct cudaHostNodeParams *p = arg;
    if (!p->fn)
        return cudaErrorInvalidValue;
    n->u.host = *p;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphAddHostNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                              const cudaGraphNode_t *pDependencies,
                                              size_t numDependencies,
                                              const struct cudaHostNodeParams *pNodeParams)
{
    if (!pNodeParams)
        PILOT_RETURN(cudaErrorInvalidValue);
    return pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeHost,
                    fill_host, pNodeParams);
}

static cudaError_t fill_child(struct gnode *n, const void *arg)
{
    struct ggraph *child = pilot_graph_get((cudaGraph_t)arg);
    if (!child || child == n->graph)
        return cudaErrorInvalidValue;
    if (pilot_graph_has_mem_nodes(child))
        return cudaErrorNotSupported; /* memory nodes cannot be in a child graph */
    if (!(n->u.child = pilot_graph_clone(child)))
        return cudaErrorMemoryAllocation;
    n->u.child->owner = n;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                    const cudaGraphNode_t *pDependencies,
                                                    size_t numDependencies, cudaGraph_t childGraph)
{
    return pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeGraph,
                    fill_child, childGraph);
}

PILOT_EXPORT cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                               const cudaGraphNode_t *pDependencies,
                                               size_t numDependencies)
{
    return pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeEmpty,
                    NULL, NULL);
}

static cudaError_t fill_event(struct gnode *n, const void *arg)
{
    if (!arg)
        return cudaErrorInvalidResourceHandle;
    n->u.event = (cudaEvent_t)arg;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphAddEventRecordNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                     const cudaGraphNode_t *pDependencies,
                                                     size_t numDependencies, cudaEvent_t event)
{
    return pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies,
                    cudaGraphNodeTypeEventRecord, fill_event, event);
}

PILOT_EXPORT cudaError_t cudaGraphAddEventWaitNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                   const cudaGraphNode_t *pDependencies,
                                                   size_t numDependencies, cudaEvent_t event)
{
    return pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeWaitEvent,
                    fill_event, event);
}

/* ---- structure ---- */

static int edge_data_default(const cudaGraphEdgeData *d)
{
    static const cudaGraphEdgeData zero;
    return !d || !memcmp(d, &zero, sizeof zero);
}

static cudaError_t edges_check(struct ggraph *g, const cudaGraphNode_t *from,
                               const cudaGraphNode_t *to, const cudaGraphEdgeData *data, size_t n)
{
    if (!g || (n && (!from || !to)))
        return cudaErrorInvalidValue;
    for (size_t i = 0; i < n; i++) {
        struct gnode *a = pilot_node_get(from[i]), *b = pilot_node_get(to[i]);
        if (!a || !b || a->graph != g || b->graph != g || a == b)
            return cudaErrorInvalidValue;
        if (data && !edge_data_default(&data[i]))
            return cudaErrorNotSupported; /* programmatic edges */
    }
    return cudaSuccess;
}

static cudaError_t add_dependencies(cudaGraph_t graph, const cudaGraphNode_t *from,
                                    const cudaGraphNode_t *to, const cudaGraphEdgeData *data,
                                    size_t n)
{
    struct ggraph *g = pilot_graph_get(graph);
    cudaError_t err = edges_check(g, from, to, data, n);
    if (err)
        return err;
    for (size_t i = 0; i < n; i++)
        if (pilot_graph_has_edge((struct gnode *)from[i], (struct gnode *)to[i]))
            return cudaErrorInvalidValue;
    for (size_t i = 0; i < n; i++)
        if (pilot_graph_edge_add((struct gnode *)from[i], (struct gnode *)to[i]))
            return cudaErrorMemoryAllocation;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphAddDependencies(cudaGraph_t graph, const cudaGraphNode_t *from,
                                                  const cudaGraphNode_t *to,
                                                  const cudaGraphEdgeData *edgeData,
                                                  size_t numDependencies)
{
    LOCKED(add_dependencies(graph, from, to, edgeData, numDependencies));
}

static cudaError_t remove_dependencies(cudaGraph_t graph, const cudaGraphNode_t *from,
                                       const cudaGraphNode_t *to, const cudaGraphEdgeData *data,
                                       size_t n)
{
    struct ggraph *g = pilot_graph_get(graph);
    cudaError_t err = edges_check(g, from, to, data, n);
    if (err)
        return err;
    if (pilot_graph_has_mem_nodes(g))
        return cudaErrorNotSupported; /* and so do its edges */
    for (size_t i = 0; i < n; i++)
        if (!pilot_graph_has_edge((struct gnode *)from[i], (struct gnode *)to[i]))
            return cudaErrorInvalidValue;
    for (size_t i = 0; i < n; i++) {
        struct gnode *a = (struct gnode *)from[i], *b = (struct gnode *)to[i];
        pilot_graph_remove_ptr(a->outs, &a->nouts, b);
        pilot_graph_remove_ptr(b->deps, &b->ndeps, a);
    }
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphRemoveDependencies(cudaGraph_t graph, const cudaGraphNode_t *from,
                                                     const cudaGraphNode_t *to,
                                                     const cudaGraphEdgeData *edgeData,
                                                     size_t numDependencies)
{
    LOCKED(remove_dependencies(graph, from, to, edgeData, numDependencies));
}

/* The list-returning queries: with out == NULL *count gets the size, else up to *count entries
 * are written and *count gets how many were (CUDA's convention). */
static void list_out(struct gnode *const *items, size_t n, cudaGraphNode_t *out,
                     cudaGraphEdgeData *edge_data, size_t *count)
{
    if (!out) {
        *count = n;
        return;
    }
    size_t k = n < *count ? n : *count;
    for (size_t i = 0; i < k; i++) {
        out[i] = (cudaGraphNode_t)items[i];
        if (edge_data)
            memset(&edge_data[i], 0, sizeof edge_data[i]);
    }
    for (size_t i = k; i < *count; i++) {
        out[i] = NULL;
        if (edge_data)
            memset(&edge_data[i], 0, sizeof edge_data[i]);
    }
    *count = k;
}

static cudaError_t get_nodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *num, int roots)
{
    struct ggraph *g = pilot_graph_get(graph);
    if (!g || !num)
        return cudaErrorInvalidValue;
    struct gnode **items = malloc((g->count ? g->count : 1) * sizeof *items);
    if (!items)
        return cudaErrorMemoryAllocation;
    size_t n = 0;
    for (size_t i = 0; i < g->count; i++)
        if (!roots || !g->nodes[i]->ndeps)
            items[n++] = g->nodes[i];
    list_out(items, n, nodes, NULL, num);
    free(items);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes)
{
    LOCKED(get_nodes(graph, nodes, numNodes, 0));
}

PILOT_EXPORT cudaError_t cudaGraphGetRootNodes(cudaGraph_t graph, cudaGraphNode_t *pRootNodes,
                                               size_t *pNumRootNodes)
{
    LOCKED(get_nodes(graph, pRootNodes, pNumRootNodes, 1));
}

static cudaError_t get_edges(cudaGraph_t graph, cudaGraphNode_t *from, cudaGraphNode_t *to,
                             cudaGraphEdgeData *data, size_t *num)
{
    struct ggraph *g = pilot_graph_get(graph);
    if (!g || !num || (!from != !to) || (data && !from))
        return cudaErrorInvalidValue;
    size_t total = 0;
    for (size_t i = 0; i < g->count; i++)
        total += g->nodes[i]->nouts;
    if (!from) {
        *num = total;
        return cudaSuccess;
    }
    size_t k = 0;
    for (size_t i = 0; i < g->count; i++)
        for (size_t j = 0; j < g->nodes[i]->nouts; j++, k++)
            if (k < *num) {
                from[k] = (cudaGraphNode_t)g->nodes[i];
                to[k] = (cudaGraphNode_t)g->nodes[i]->outs[j];
                if (data)
                    memset(&data[k], 0, sizeof data[k]);
            }
    for (size_t i = total; i < *num; i++) {
        from[i] = to[i] = NULL;
        if (data)
            memset(&data[i], 0, sizeof data[i]);
    }
    if (total < *num)
        *num = total;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphGetEdges(cudaGraph_t graph, cudaGraphNode_t *from,
                                           cudaGraphNode_t *to, cudaGraphEdgeData *edgeData,
                                           size_t *numEdges)
{
    LOCKED(get_edges(graph, from, to, edgeData, numEdges));
}

static cudaError_t node_links(cudaGraphNode_t node, cudaGraphNode_t *out, cudaGraphEdgeData *data,
                              size_t *num, int outs)
{
    struct gnode *n = pilot_node_get(node);
    if (!n || !num || (data && !out))
        return cudaErrorInvalidValue;
    if (outs)
        list_out(n->outs, n->nouts, out, data, num);
    else
        list_out(n->deps, n->ndeps, out, data, num);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node,
                                                      cudaGraphNode_t *pDependencies,
                                                      cudaGraphEdgeData *edgeData,
                                                      size_t *pNumDependencies)
{
    LOCKED(node_links(node, pDependencies, edgeData, pNumDependencies, 0));
}

PILOT_EXPORT cudaError_t cudaGraphNodeGetDependentNodes(cudaGraphNode_t node,
                                                        cudaGraphNode_t *pDependentNodes,
                                                        cudaGraphEdgeData *edgeData,
                                                        size_t *pNumDependentNodes)
{
    LOCKED(node_links(node, pDependentNodes, edgeData, pNumDependentNodes, 1));
}

static cudaError_t node_type(cudaGraphNode_t node, enum cudaGraphNodeType *type)
{
    struct gnode *n = pilot_node_get(node);
    if (!n || !type)
        return cudaErrorInvalidValue;
    *type = n->type;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *pType)
{
    LOCKED(node_type(node, pType));
}

static cudaError_t destroy_node(cudaGraphNode_t node)
{
    struct gnode *n = pilot_node_get(node);
    if (!n)
        return cudaErrorInvalidValue;
    if (pilot_graph_has_mem_nodes(n->graph))
        return cudaErrorNotSupported; /* nodes of a graph with memory nodes stay */
    pilot_node_destroy(n);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphDestroyNode(cudaGraphNode_t node)
{
    LOCKED(destroy_node(node));
}

static cudaError_t clone_graph(cudaGraph_t *out, cudaGraph_t original)
{
    struct ggraph *g = pilot_graph_get(original);
    if (!out || !g)
        return cudaErrorInvalidValue;
    if (pilot_graph_has_mem_nodes(g))
        return cudaErrorNotSupported; /* a graph with memory nodes cannot be cloned */
    struct ggraph *c = pilot_graph_clone(g);
    if (!c)
        return cudaErrorMemoryAllocation;
    *out = (cudaGraph_t)c;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphClone(cudaGraph_t *pGraphClone, cudaGraph_t originalGraph)
{
    LOCKED(clone_graph(pGraphClone, originalGraph));
}

static cudaError_t find_in_clone(cudaGraphNode_t *out, cudaGraphNode_t original, cudaGraph_t clone)
{
    struct ggraph *g = pilot_graph_get(clone);
    if (!out || !g || !original)
        return cudaErrorInvalidValue;
    for (size_t i = 0; i < g->count; i++)
        if (g->nodes[i]->orig == (const struct gnode *)original) {
            *out = (cudaGraphNode_t)g->nodes[i];
            return cudaSuccess;
        }
    return cudaErrorInvalidValue;
}

PILOT_EXPORT cudaError_t cudaGraphNodeFindInClone(cudaGraphNode_t *pNode, cudaGraphNode_t originalNode,
                                                  cudaGraph_t clonedGraph)
{
    LOCKED(find_in_clone(pNode, originalNode, clonedGraph));
}

static cudaError_t child_graph(cudaGraphNode_t node, cudaGraph_t *out)
{
    struct gnode *n = pilot_node_get(node);
    if (!n || !out || n->type != cudaGraphNodeTypeGraph)
        return cudaErrorInvalidValue;
    *out = (cudaGraph_t)n->u.child;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphChildGraphNodeGetGraph(cudaGraphNode_t node, cudaGraph_t *pGraph)
{
    LOCKED(child_graph(node, pGraph));
}

/* ---- node parameters: get and set ---- */

/* The node `node` if it is a live one of `type` (under the lock). */
static struct gnode *typed(cudaGraphNode_t node, enum cudaGraphNodeType type)
{
    struct gnode *n = pilot_node_get(node);
    return n && n->type == type ? n : NULL;
}

/* A live kernel node of the program's own kernels (a captured library call has none pilot sees). */
static cudaError_t kernel_node(cudaGraphNode_t node, struct gnode **out)
{
    struct gnode *n = typed(node, cudaGraphNodeTypeKernel);
    if (!n)
        return cudaErrorInvalidValue;
    if (n->lib)
        return cudaErrorNotSupported;
    *out = n;
    return cudaSuccess;
}

static cudaError_t kernel_get(cudaGraphNode_t node, struct cudaKernelNodeParams *p)
{
    struct gnode *n;
    if (!p)
        return cudaErrorInvalidValue;
    cudaError_t err = kernel_node(node, &n);
    if (err)
        return err;
    *p = (struct cudaKernelNodeParams){.func = n->u.k.func, .gridDim = n->u.k.grid,
                                       .blockDim = n->u.k.block, .sharedMemBytes = n->u.k.shared,
                                       .kernelParams = n->u.k.args, .extra = NULL};
    return cudaSuccess;
}

/* ---- kernel node attributes (struct gkattrs) ---- */

/* What a kernel node answers for an attribute never set. */
static cudaLaunchAttributeValue kattr_default(cudaLaunchAttributeID id)
{
    cudaLaunchAttributeValue v;
    memset(&v, 0, sizeof v);
    if (id == cudaLaunchAttributeMemSyncDomainMap)
        v.memSyncDomainMap = (cudaLaunchMemSyncDomainMap){.default_ = 0, .remote = 1};
    else if (id == cudaLaunchAttributePreferredSharedMemoryCarveout)
        v.sharedMemCarveout = (unsigned)-1; /* cudaSharedmemCarveoutDefault */
    return v;
}

/* Checks a value as a launch would (api_launch_ex.c); cudaErrorNotSupported for an attribute
 * whose effect pilot does not carry into a graph (cooperative, clusters, device updates). */
static cudaError_t kattr_check(cudaLaunchAttributeID id, const cudaLaunchAttributeValue *v)
{
    switch ((int)id) {
    case cudaLaunchAttributePriority:
    case cudaLaunchAttributeMemSyncDomainMap:
    case cudaLaunchAttributePreferredSharedMemoryCarveout:
        return cudaSuccess;
    case cudaLaunchAttributeAccessPolicyWindow:
        return pilot_check_access_window(&v->accessPolicyWindow);
    case cudaLaunchAttributeMemSyncDomain:
        return (unsigned)v->memSyncDomain > cudaLaunchMemSyncDomainRemote ? cudaErrorInvalidValue
                                                                          : cudaSuccess;
    case cudaLaunchAttributeCooperative:
    case cudaLaunchAttributeClusterDimension:
    case cudaLaunchAttributeClusterSchedulingPolicyPreference:
    case cudaLaunchAttributeDeviceUpdatableKernelNode:
    case cudaLaunchAttributePreferredClusterDimension:
        LOG_WARN("cudaGraphKernelNodeSetAttribute: attribute %d is not supported by pilot", (int)id);
        return cudaErrorNotSupported;
    default:
        return cudaErrorInvalidValue;
    }
}

static cudaError_t kattr_set(cudaGraphNode_t node, cudaLaunchAttributeID id,
                             const cudaLaunchAttributeValue *v)
{
    struct gnode *n;
    cudaError_t err = kernel_node(node, &n);
    if (err)
        return err;
    if (!v || (unsigned)id >= PILOT_KERNEL_NODE_ATTRS)
        return cudaErrorInvalidValue;
    if ((err = kattr_check(id, v)))
        return err;
    if (!n->kattrs && !(n->kattrs = calloc(1, sizeof *n->kattrs)))
        return cudaErrorMemoryAllocation;
    n->kattrs->value[id] = *v;
    n->kattrs->set |= 1u << id;
    return cudaSuccess;
}

static cudaError_t kattr_get(cudaGraphNode_t node, cudaLaunchAttributeID id,
                             cudaLaunchAttributeValue *v)
{
    struct gnode *n;
    cudaError_t err = kernel_node(node, &n);
    if (err)
        return err;
    if (!v || (unsigned)id >= PILOT_KERNEL_NODE_ATTRS || id == cudaLaunchAttributeIgnore)
        return cudaErrorInvalidValue;
    *v = n->kattrs && (n->kattrs->set & (1u << id)) ? n->kattrs->value[id] : kattr_default(id);
    return cudaSuccess;
}

static cudaError_t kattr_copy(cudaGraphNode_t dst, cudaGraphNode_t src)
{
    struct gnode *d, *s;
    cudaError_t err = kernel_node(dst, &d);
    if (!err)
        err = kernel_node(src, &s);
    return err ? err : copy_kattrs(d, s);
}

PILOT_EXPORT cudaError_t cudaGraphKernelNodeSetAttribute(cudaGraphNode_t hNode,
                                                         cudaLaunchAttributeID attr,
                                                         const cudaLaunchAttributeValue *value)
{
    LOCKED(kattr_set(hNode, attr, value));
}

PILOT_EXPORT cudaError_t cudaGraphKernelNodeGetAttribute(cudaGraphNode_t hNode,
                                                         cudaLaunchAttributeID attr,
                                                         cudaLaunchAttributeValue *value_out)
{
    LOCKED(kattr_get(hNode, attr, value_out));
}

PILOT_EXPORT cudaError_t cudaGraphKernelNodeCopyAttributes(cudaGraphNode_t hDst, cudaGraphNode_t hSrc)
{
    LOCKED(kattr_copy(hDst, hSrc));
}

PILOT_EXPORT cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t node,
                                                      struct cudaKernelNodeParams *pNodeParams)
{
    LOCKED(kernel_get(node, pNodeParams));
}

/* The live node `node` of `type`, or (in_exec) its copy in the live exec `exec`; NULL if not. */
static struct gnode *target(int in_exec, cudaGraphExec_t exec, cudaGraphNode_t node,
                            enum cudaGraphNodeType type)
{
    struct gnode *n = typed(node, type);
    if (n && in_exec) {
        struct gexec *e = exec_get(exec);
        n = e ? exec_node(e, n) : NULL;
        if (n)
            exec_changed(e);
    }
    return n;
}

/* Sets a kernel node's parameters: the program's node, or (exec != NULL) its copy in exec. */
static cudaError_t kernel_set(cudaGraphExec_t exec, cudaGraphNode_t node,
                              const struct cudaKernelNodeParams *p)
{
    struct kernel_fill f;
    struct pilot_kernel_launch_info info;
    cudaError_t err = prepare_kernel(p, &f, &info);
    if (err) {
        free((void *)f.buf);
        return err;
    }
    pthread_mutex_lock(&pilot_graph_lock);
    struct gnode *n = target(exec != NULL, exec, node, cudaGraphNodeTypeKernel);
    err = n ? fill_kernel(n, &f) : cudaErrorInvalidValue;
    pthread_mutex_unlock(&pilot_graph_lock);
    free((void *)f.buf);
    return err;
}

PILOT_EXPORT cudaError_t cudaGraphKernelNodeSetParams(cudaGraphNode_t node,
                                                      const struct cudaKernelNodeParams *pNodeParams)
{
    PILOT_RETURN(kernel_set(NULL, node, pNodeParams));
}

PILOT_EXPORT cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t hGraphExec,
                                                          cudaGraphNode_t node,
                                                          const struct cudaKernelNodeParams *pNodeParams)
{
    if (!hGraphExec)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_RETURN(kernel_set(hGraphExec, node, pNodeParams));
}

/* The node kinds whose parameters are read and set whole (kernel nodes have kernel_get and
 * kernel_set): where the parameters lie in a node, and the filler of their Add function, which
 * checks and stores a new value (an event node's is the event itself). */
static const struct node_kind {
    size_t offset, size;
    cudaError_t (*fill)(struct gnode *n, const void *arg);
} g_node_kinds[] = {
    [cudaGraphNodeTypeMemcpy] = {offsetof(struct gnode, u.copy.p), sizeof(struct cudaMemcpy3DParms),
                                 fill_copy},
    [cudaGraphNodeTypeMemset] = {offsetof(struct gnode, u.set.p), sizeof(struct cudaMemsetParams),
                                 fill_memset},
    [cudaGraphNodeTypeHost] = {offsetof(struct gnode, u.host), sizeof(struct cudaHostNodeParams),
                               fill_host},
    [cudaGraphNodeTypeEventRecord] = {offsetof(struct gnode, u.event), sizeof(cudaEvent_t), fill_event},
    [cudaGraphNodeTypeWaitEvent] = {offsetof(struct gnode, u.event), sizeof(cudaEvent_t), fill_event},
};

/* Reads (get) or sets (set) the parameters of a node of one of g_node_kinds: the program's node,
 * or (in_exec) its copy in exec. Under the lock. */
static cudaError_t node_params(int in_exec, cudaGraphExec_t exec, cudaGraphNode_t node,
                               enum cudaGraphNodeType type, void *get, const void *set)
{
    struct gnode *n = target(in_exec, exec, node, type);
    if (!n || (!get && !set))
        return cudaErrorInvalidValue;
    const struct node_kind *kind = &g_node_kinds[type];
    if (!get)
        return kind->fill(n, set);
    memcpy(get, (const char *)n + kind->offset, kind->size);
    return cudaSuccess;
}

#define GET(node, type, out) LOCKED(node_params(0, NULL, node, type, out, NULL))
#define SET(node, type, in) LOCKED(node_params(0, NULL, node, type, NULL, in))
#define EXEC_SET(exec, node, type, in) LOCKED(node_params(1, exec, node, type, NULL, in))

PILOT_EXPORT cudaError_t cudaGraphMemcpyNodeGetParams(cudaGraphNode_t node,
                                                      struct cudaMemcpy3DParms *pNodeParams)
{
    GET(node, cudaGraphNodeTypeMemcpy, pNodeParams);
}

PILOT_EXPORT cudaError_t cudaGraphMemcpyNodeSetParams(cudaGraphNode_t node,
                                                      const struct cudaMemcpy3DParms *pNodeParams)
{
    SET(node, cudaGraphNodeTypeMemcpy, pNodeParams);
}

PILOT_EXPORT cudaError_t cudaGraphExecMemcpyNodeSetParams(cudaGraphExec_t hGraphExec,
                                                          cudaGraphNode_t node,
                                                          const struct cudaMemcpy3DParms *pNodeParams)
{
    EXEC_SET(hGraphExec, node, cudaGraphNodeTypeMemcpy, pNodeParams);
}

/* The 1D forms: the parameters as cudaGraphAddMemcpyNode1D makes them. */
static cudaError_t copy_set_1d(int in_exec, cudaGraphExec_t exec, cudaGraphNode_t node, void *dst,
                               const void *src, size_t count, enum cudaMemcpyKind kind)
{
    struct gnode scratch = {.type = cudaGraphNodeTypeMemcpy};
    cudaError_t err = pilot_node_set_copy_1d(&scratch, dst, src, count, kind);
    return err ? err : node_params(in_exec, exec, node, cudaGraphNodeTypeMemcpy, NULL, &scratch.u.copy.p);
}

PILOT_EXPORT cudaError_t cudaGraphMemcpyNodeSetParams1D(cudaGraphNode_t node, void *dst,
                                                        const void *src, size_t count,
                                                        enum cudaMemcpyKind kind)
{
    LOCKED(copy_set_1d(0, NULL, node, dst, src, count, kind));
}

PILOT_EXPORT cudaError_t cudaGraphExecMemcpyNodeSetParams1D(cudaGraphExec_t hGraphExec,
                                                            cudaGraphNode_t node, void *dst,
                                                            const void *src, size_t count,
                                                            enum cudaMemcpyKind kind)
{
    LOCKED(copy_set_1d(1, hGraphExec, node, dst, src, count, kind));
}

PILOT_EXPORT cudaError_t cudaGraphMemsetNodeGetParams(cudaGraphNode_t node,
                                                      struct cudaMemsetParams *pNodeParams)
{
    GET(node, cudaGraphNodeTypeMemset, pNodeParams);
}

PILOT_EXPORT cudaError_t cudaGraphMemsetNodeSetParams(cudaGraphNode_t node,
                                                      const struct cudaMemsetParams *pNodeParams)
{
    SET(node, cudaGraphNodeTypeMemset, pNodeParams);
}

PILOT_EXPORT cudaError_t cudaGraphExecMemsetNodeSetParams(cudaGraphExec_t hGraphExec,
                                                          cudaGraphNode_t node,
                                                          const struct cudaMemsetParams *pNodeParams)
{
    EXEC_SET(hGraphExec, node, cudaGraphNodeTypeMemset, pNodeParams);
}

PILOT_EXPORT cudaError_t cudaGraphHostNodeGetParams(cudaGraphNode_t node,
                                                    struct cudaHostNodeParams *pNodeParams)
{
    GET(node, cudaGraphNodeTypeHost, pNodeParams);
}

PILOT_EXPORT cudaError_t cudaGraphHostNodeSetParams(cudaGraphNode_t node,
                                                    const struct cudaHostNodeParams *pNodeParams)
{
    SET(node, cudaGraphNodeTypeHost, pNodeParams);
}

PILOT_EXPORT cudaError_t cudaGraphExecHostNodeSetParams(cudaGraphExec_t hGraphExec,
                                                        cudaGraphNode_t node,
                                                        const struct cudaHostNodeParams *pNodeParams)
{
    EXEC_SET(hGraphExec, node, cudaGraphNodeTypeHost, pNodeParams);
}

/* Event nodes: a NULL event is refused where it is set. */
static cudaError_t set_event(int in_exec, cudaGraphExec_t exec, cudaGraphNode_t node,
                             enum cudaGraphNodeType type, cudaEvent_t event)
{
    if (!event)
        return cudaErrorInvalidResourceHandle;
    return node_params(in_exec, exec, node, type, NULL, event);
}

PILOT_EXPORT cudaError_t cudaGraphEventRecordNodeGetEvent(cudaGraphNode_t node, cudaEvent_t *event_out)
{
    GET(node, cudaGraphNodeTypeEventRecord, event_out);
}

PILOT_EXPORT cudaError_t cudaGraphEventRecordNodeSetEvent(cudaGraphNode_t node, cudaEvent_t event)
{
    LOCKED(set_event(0, NULL, node, cudaGraphNodeTypeEventRecord, event));
}

PILOT_EXPORT cudaError_t cudaGraphEventWaitNodeGetEvent(cudaGraphNode_t node, cudaEvent_t *event_out)
{
    GET(node, cudaGraphNodeTypeWaitEvent, event_out);
}

PILOT_EXPORT cudaError_t cudaGraphEventWaitNodeSetEvent(cudaGraphNode_t node, cudaEvent_t event)
{
    LOCKED(set_event(0, NULL, node, cudaGraphNodeTypeWaitEvent, event));
}

PILOT_EXPORT cudaError_t cudaGraphExecEventRecordNodeSetEvent(cudaGraphExec_t hGraphExec,
                                                              cudaGraphNode_t hNode,
                                                              cudaEvent_t event)
{
    LOCKED(set_event(1, hGraphExec, hNode, cudaGraphNodeTypeEventRecord, event));
}

PILOT_EXPORT cudaError_t cudaGraphExecEventWaitNodeSetEvent(cudaGraphExec_t hGraphExec,
                                                            cudaGraphNode_t hNode,
                                                            cudaEvent_t event)
{
    LOCKED(set_event(1, hGraphExec, hNode, cudaGraphNodeTypeWaitEvent, event));
}

/* ---- executable graphs ---- */

static cudaError_t instantiate(cudaGraphExec_t *out, cudaGraph_t graph, unsigned long long flags,
                               cudaGraphInstantiateResult *result)
{
    if (result)
        *result = cudaGraphInstantiateError;
    struct ggraph *g = pilot_graph_get(graph);
    if (!out || !g)
        return cudaErrorInvalidValue;
    if (flags & ~(unsigned long long)(cudaGraphInstantiateFlagAutoFreeOnLaunch |
                                      cudaGraphInstantiateFlagUpload |
                                      cudaGraphInstantiateFlagDeviceLaunch |
                                      cudaGraphInstantiateFlagUseNodePriority))
        return cudaErrorInvalidValue;
    if (flags & cudaGraphInstantiateFlagDeviceLaunch) {
        LOG_WARN("cudaGraphInstantiateFlagDeviceLaunch: device graph launch is not supported by pilot");
        return cudaErrorNotSupported;
    }
    int has_mem = pilot_graph_has_mem_nodes(g);
    if (has_mem && has_exec(g))
        return cudaErrorNotSupported; /* one executable graph at a time */
    struct gexec *e = calloc(1, sizeof *e);
    if (!e)
        return cudaErrorMemoryAllocation;
    e->magic = EXEC_MAGIC;
    e->flags = flags;
    e->has_mem = has_mem;
    size_t cap = 0;
    int rc = -2;
    if ((e->graph = pilot_graph_clone(g)))
        rc = order_graph(e, e->graph, &cap);
    if (rc == 0 && pilot_graph_live_add(e))
        rc = -2;
    if (rc) {
        if (result && rc == -1)
            *result = cudaGraphInstantiateInvalidStructure;
        pilot_graph_free(e->graph);
        free(e->order);
        free(e);
        return rc == -1 ? cudaErrorInvalidValue : cudaErrorMemoryAllocation;
    }
    unregister(e->graph);
    if (result)
        *result = cudaGraphInstantiateSuccess;
    *out = (cudaGraphExec_t)e;
    return cudaSuccess;
}

static cudaError_t exec_destroy(cudaGraphExec_t exec, struct gremote *gone);

/* The exec's CUDA graph in pilotd (graph_remote.c), made or made again; without the lock, as a
 * launch issues nodes. Execs with memory nodes are replayed (their allocations live in the shim). */
static cudaError_t remote_instantiate(struct gexec *e)
{
    if (e->has_mem) {
        e->remote.state = GREMOTE_REPLAY;
        e->remote.reason = PILOT_GRAPH_REPLAY_NODE;
        return cudaSuccess;
    }
    const struct gremote before = e->remote;
    const uint64_t id = (uint64_t)(uintptr_t)e;
    cudaError_t err = cudaSuccess;
    cudaStream_t stream = pilot_graph_remote_prepare(&e->remote, e->order, e->count);
    if (stream) {
        struct pilot_recording rec = {.device = e->remote.device};
        cudaError_t last = pilot_last_error_swap(cudaSuccess);
        pilot_record_begin(&rec);
        for (size_t i = 0; i < e->count && !err && !rec.failed; i++)
            if (e->order[i]->enabled)
                err = pilot_node_issue(e->order[i], stream);
        pilot_record_end();
        pilot_last_error_swap(last); /* what recording met is not the program's error */
        err = pilot_graph_remote_send(&e->remote, id, stream, &rec, err);
    }
    if (before.state == GREMOTE_STALE && e->remote.state == GREMOTE_REPLAY)
        pilot_graph_remote_destroy(&before, id); /* pilotd must not keep the graph it replaced */
    return err;
}

/* Instantiation, then pilotd's graph: a node pilotd refuses (memory that is not the session's)
 * fails the instantiation, as CUDA refuses such a node when it is added. */
static cudaError_t instantiate_all(cudaGraphExec_t *out, cudaGraph_t graph,
                                   unsigned long long flags, cudaGraphInstantiateResult *result)
{
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = instantiate(out, graph, flags, result);
    struct gexec *e = err ? NULL : exec_get(*out);
    pthread_mutex_unlock(&pilot_graph_lock);
    if (!e)
        return err;
    err = remote_instantiate(e);
    if (err) {
        pthread_mutex_lock(&pilot_graph_lock);
        exec_destroy(*out, NULL);
        pthread_mutex_unlock(&pilot_graph_lock);
        *out = NULL;
        if (result)
            *result = cudaGraphInstantiateError;
    }
    return err;
}

PILOT_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                              unsigned long long flags)
{
    PILOT_RETURN(instantiate_all(pGraphExec, graph, flags, NULL));
}

PILOT_EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec,
                                                       cudaGraph_t graph, unsigned long long flags)
{
    PILOT_RETURN(instantiate_all(pGraphExec, graph, flags, NULL));
}

PILOT_EXPORT cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec,
                                                        cudaGraph_t graph,
                                                        cudaGraphInstantiateParams *params)
{
    if (!params)
        PILOT_RETURN(cudaErrorInvalidValue);
    params->errNode_out = NULL;
    PILOT_RETURN(instantiate_all(pGraphExec, graph, params->flags, &params->result_out));
}

PILOT_EXPORT cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *pGraphExec,
                                                             cudaGraph_t graph,
                                                             cudaGraphInstantiateParams *params)
{
    return cudaGraphInstantiateWithParams(pGraphExec, graph, params);
}

static cudaError_t exec_flags(cudaGraphExec_t exec, unsigned long long *flags)
{
    struct gexec *e = exec_get(exec);
    if (!e || !flags)
        return cudaErrorInvalidValue;
    *flags = e->flags;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphExecGetFlags(cudaGraphExec_t graphExec, unsigned long long *flags)
{
    LOCKED(exec_flags(graphExec, flags));
}

/* gone (if not NULL) gets the exec's twin in pilotd, for the caller to release outside the lock. */
static cudaError_t exec_destroy(cudaGraphExec_t exec, struct gremote *gone)
{
    struct gexec *e = exec_get(exec);
    if (!e)
        return cudaErrorInvalidValue;
    if (gone)
        *gone = e->remote;
    exec_free(e); /* a launch in flight issued its nodes already: nothing waits for e */
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    struct gremote gone = {0};
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = exec_destroy(graphExec, &gone);
    pthread_mutex_unlock(&pilot_graph_lock);
    pilot_graph_remote_destroy(&gone, (uint64_t)(uintptr_t)graphExec);
    pilot_gmem_drain();
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    PILOT_REQUIRE_SESSION();
    pthread_mutex_lock(&pilot_graph_lock);
    struct gexec *e = exec_get(graphExec);
    pthread_mutex_unlock(&pilot_graph_lock);
    if (!e)
        PILOT_RETURN(cudaErrorInvalidValue);
    /* Launched into a capturing stream: refused, and the capture invalidated (graph_capture.c). */
    cudaError_t err = cudaSuccess;
    if (pilot_capture_graph(stream, e->graph, &err))
        PILOT_RETURN(err);
    if (e->has_mem) { /* an allocation of the last launch the program did not free */
        pthread_mutex_lock(&pilot_graph_lock);
        err = exec_get(graphExec) == e ? pilot_gmem_before_launch(
                  e->order, e->count, (e->flags & cudaGraphInstantiateFlagAutoFreeOnLaunch) != 0)
                                       : cudaErrorInvalidValue;
        pthread_mutex_unlock(&pilot_graph_lock);
        if (err)
            PILOT_RETURN(err);
    }
    if (e->remote.state == GREMOTE_UNTRIED || e->remote.state == GREMOTE_STALE) {
        if ((err = remote_instantiate(e)))
            PILOT_RETURN(err); /* a changed node pilotd refuses */
    }
    if (pilot_graph_remote_launch(&e->remote, (uint64_t)(uintptr_t)e, stream, &err))
        PILOT_RETURN(err);
    for (size_t i = 0; i < e->count; i++) {
        const struct gnode *n = e->order[i];
        if (!n->enabled)
            continue;
        if ((err = pilot_node_issue(n, stream)))
            PILOT_RETURN(err);
    }
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    return cudaGraphLaunch(graphExec, stream ? stream : cudaStreamPerThread);
}

PILOT_EXPORT cudaError_t cudaGraphUpload(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    (void)stream; /* nothing to upload: a launch issues its nodes */
    pthread_mutex_lock(&pilot_graph_lock);
    struct gexec *e = exec_get(graphExec);
    pthread_mutex_unlock(&pilot_graph_lock);
    PILOT_RETURN(e ? cudaSuccess : cudaErrorInvalidValue);
}

PILOT_EXPORT cudaError_t cudaGraphUpload_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    return cudaGraphUpload(graphExec, stream);
}

static cudaError_t node_enabled(cudaGraphExec_t exec, cudaGraphNode_t node, unsigned *get,
                                unsigned set)
{
    struct gexec *e = exec_get(exec);
    struct gnode *n = pilot_node_get(node);
    if (!e || !n)
        return cudaErrorInvalidValue;
    if (n->type != cudaGraphNodeTypeKernel && n->type != cudaGraphNodeTypeMemcpy &&
        n->type != cudaGraphNodeTypeMemset)
        return cudaErrorInvalidValue; /* only these can be disabled */
    struct gnode *copy = exec_node(e, n);
    if (!copy)
        return cudaErrorInvalidValue;
    if (get) {
        *get = (unsigned)copy->enabled;
    } else if (copy->enabled != (set != 0)) {
        copy->enabled = set != 0;
        exec_changed(e);
    }
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphNodeSetEnabled(cudaGraphExec_t hGraphExec, cudaGraphNode_t hNode,
                                                 unsigned int isEnabled)
{
    LOCKED(node_enabled(hGraphExec, hNode, NULL, isEnabled));
}

PILOT_EXPORT cudaError_t cudaGraphNodeGetEnabled(cudaGraphExec_t hGraphExec, cudaGraphNode_t hNode,
                                                 unsigned int *isEnabled)
{
    if (!isEnabled)
        PILOT_RETURN(cudaErrorInvalidValue);
    LOCKED(node_enabled(hGraphExec, hNode, isEnabled, 0));
}

/* cudaGraphExecUpdate: the new graph must have the exec's topology (same node count, types in
 * creation order, same edges); then every node's parameters are copied into the exec. */
static cudaError_t exec_update(cudaGraphExec_t exec, cudaGraph_t graph,
                               cudaGraphExecUpdateResultInfo *info)
{
    struct gexec *e = exec_get(exec);
    struct ggraph *g = pilot_graph_get(graph);
    if (info)
        *info = (cudaGraphExecUpdateResultInfo){cudaGraphExecUpdateError, NULL, NULL};
    if (!e || !g)
        return cudaErrorInvalidValue;
    struct ggraph *old = e->graph;
    enum cudaGraphExecUpdateResult why = cudaGraphExecUpdateSuccess;
    cudaGraphNode_t bad = NULL, bad_from = NULL;
    if (old->count != g->count)
        why = cudaGraphExecUpdateErrorTopologyChanged;
    index_nodes(g);
    for (size_t i = 0; !why && i < g->count; i++) {
        struct gnode *a = old->nodes[i], *b = g->nodes[i];
        bad = (cudaGraphNode_t)b;
        if (a->type != b->type)
            why = cudaGraphExecUpdateErrorNodeTypeChanged;
        else if (a->ndeps != b->ndeps || a->nouts != b->nouts)
            why = cudaGraphExecUpdateErrorTopologyChanged;
        else if (b->type == cudaGraphNodeTypeGraph &&
                 b->u.child->count != a->u.child->count)
            why = cudaGraphExecUpdateErrorTopologyChanged;
        else if ((b->type == cudaGraphNodeTypeMemAlloc && b->u.alloc.mem != a->u.alloc.mem) ||
                 (b->type == cudaGraphNodeTypeMemFree && b->u.freed != a->u.freed))
            why = cudaGraphExecUpdateErrorNotSupported; /* the same allocations only (H100: the
                                                           graph it was made from updates it) */
        for (size_t j = 0; !why && j < b->ndeps; j++) {
            /* the same edges: each dependency of b is the same-numbered node's copy in a's */
            const struct gnode *want = old->nodes[b->deps[j]->index];
            int found = 0;
            for (size_t m = 0; m < a->ndeps; m++)
                found |= a->deps[m] == want;
            if (!found) {
                why = cudaGraphExecUpdateErrorTopologyChanged;
                bad_from = (cudaGraphNode_t)b->deps[j];
            }
        }
    }
    if (why) {
        if (info)
            *info = (cudaGraphExecUpdateResultInfo){why, bad, bad_from};
        return cudaErrorGraphExecUpdateFailure;
    }
    for (size_t i = 0; i < g->count; i++) {
        if (g->nodes[i]->type == cudaGraphNodeTypeMemAlloc || g->nodes[i]->type == cudaGraphNodeTypeMemFree)
            continue; /* the same allocation: nothing to change */
        cudaError_t err = node_copy_params(old->nodes[i], g->nodes[i]);
        if (err)
            return err;
    }
    /* Child graphs were copied anew: order the exec again. */
    unregister(old);
    e->count = 0;
    size_t cap = 0;
    free(e->order);
    e->order = NULL;
    if (order_graph(e, old, &cap))
        return cudaErrorMemoryAllocation;
    exec_changed(e);
    if (info)
        info->result = cudaGraphExecUpdateSuccess;
    return cudaSuccess;
}

/* An updated exec is instantiated in pilotd again at once, so a node pilotd refuses fails the
 * update (cudaGraphExecUpdateError), not a later launch. */
PILOT_EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
                                             cudaGraphExecUpdateResultInfo *resultInfo)
{
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = exec_update(hGraphExec, hGraph, resultInfo);
    struct gexec *e = err ? NULL : exec_get(hGraphExec);
    pthread_mutex_unlock(&pilot_graph_lock);
    if (e && e->remote.state != GREMOTE_REPLAY && (err = remote_instantiate(e)) && resultInfo)
        resultInfo->result = cudaGraphExecUpdateError;
    PILOT_RETURN(err);
}

/* ---- cudaGraphDebugDotPrint ---- */

static const char *type_name(enum cudaGraphNodeType t)
{
    static const char *const names[] = {"KERNEL", "MEMCPY", "MEMSET", "HOST", "GRAPH", "EMPTY",
                                        "WAIT_EVENT", "EVENT_RECORD", "EXT_SEMAS_SIGNAL",
                                        "EXT_SEMAS_WAIT", "MEM_ALLOC", "MEM_FREE"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "OTHER";
}

static void dot_graph(FILE *f, const struct ggraph *g, const char *prefix, int depth)
{
    for (size_t i = 0; i < g->count; i++) {
        const struct gnode *n = g->nodes[i];
        fprintf(f, "%*s\"%snode_%llu\" [shape=%s, label=\"%s\\n%llu", depth * 4, "", prefix,
                (unsigned long long)n->seq, n->type == cudaGraphNodeTypeKernel ? "octagon" : "rectangle",
                type_name(n->type), (unsigned long long)n->seq);
        if (n->lib)
            fprintf(f, "\\nCUDA library call");
        else if (n->type == cudaGraphNodeTypeKernel)
            fprintf(f, "\\ngrid (%u,%u,%u) block (%u,%u,%u)", n->u.k.grid.x, n->u.k.grid.y,
                    n->u.k.grid.z, n->u.k.block.x, n->u.k.block.y, n->u.k.block.z);
        fprintf(f, "\"];\n");
        if (n->type == cudaGraphNodeTypeGraph) {
            char sub[64];
            snprintf(sub, sizeof sub, "%sg%llu_", prefix, (unsigned long long)n->seq);
            fprintf(f, "%*ssubgraph \"cluster_%s\" {\n%*slabel=\"child graph %llu\";\n", depth * 4,
                    "", sub, depth * 4 + 4, "", (unsigned long long)n->seq);
            dot_graph(f, n->u.child, sub, depth + 1);
            fprintf(f, "%*s}\n", depth * 4, "");
        }
    }
    for (size_t i = 0; i < g->count; i++)
        for (size_t j = 0; j < g->nodes[i]->nouts; j++)
            fprintf(f, "%*s\"%snode_%llu\" -> \"%snode_%llu\";\n", depth * 4, "", prefix,
                    (unsigned long long)g->nodes[i]->seq, prefix,
                    (unsigned long long)g->nodes[i]->outs[j]->seq);
}

static cudaError_t dot_print(cudaGraph_t graph, const char *path)
{
    struct ggraph *g = pilot_graph_get(graph);
    if (!g || !path)
        return cudaErrorInvalidValue;
    FILE *f = fopen(path, "w");
    if (!f)
        return cudaErrorOperatingSystem;
    fprintf(f, "digraph dot {\n    subgraph \"cluster_graph\" {\n        label=\"graph\";\n");
    dot_graph(f, g, "", 2);
    fprintf(f, "    }\n}\n");
    return fclose(f) ? cudaErrorOperatingSystem : cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphDebugDotPrint(cudaGraph_t graph, const char *path, unsigned int flags)
{
    (void)flags;
    LOCKED(dot_print(graph, path));
}

/* ---- the generic node API (cudaGraphNodeParams): the typed calls above ---- */

static int g_logged_generic;

static cudaError_t generic_unsupported(enum cudaGraphNodeType type)
{
    if (!__atomic_exchange_n(&g_logged_generic, 1, __ATOMIC_RELAXED))
        LOG_WARN("graph nodes of type %d (memory, conditional, external semaphore) are not "
                 "supported by pilot", (int)type);
    return cudaErrorNotSupported;
}

static struct cudaKernelNodeParams kernel_v1(const struct cudaGraphNodeParams *p)
{
    struct cudaKernelNodeParams k = {.func = p->kernel.func, .sharedMemBytes = p->kernel.sharedMemBytes,
                                     .kernelParams = p->kernel.kernelParams, .extra = p->kernel.extra};
    k.gridDim = (dim3){p->kernel.gridDim.x, p->kernel.gridDim.y, p->kernel.gridDim.z};
    k.blockDim = (dim3){p->kernel.blockDim.x, p->kernel.blockDim.y, p->kernel.blockDim.z};
    return k;
}

static struct cudaMemsetParams memset_v1(const struct cudaGraphNodeParams *p)
{
    return (struct cudaMemsetParams){.dst = p->memset.dst, .pitch = p->memset.pitch,
                                     .value = p->memset.value,
                                     .elementSize = p->memset.elementSize,
                                     .width = p->memset.width, .height = p->memset.height};
}

static cudaError_t fill_child_moved(struct gnode *n, const void *arg)
{
    struct ggraph *child = pilot_graph_get((cudaGraph_t)arg);
    if (!child || child == n->graph || child->owner || pilot_capture_owns(child))
        return cudaErrorInvalidValue;
    n->u.child = child; /* cudaGraphChildGraphOwnershipMove: the node owns the program's graph */
    child->owner = n;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                          const cudaGraphNode_t *pDependencies,
                                          const cudaGraphEdgeData *dependencyData,
                                          size_t numDependencies,
                                          struct cudaGraphNodeParams *nodeParams)
{
    if (!nodeParams)
        PILOT_RETURN(cudaErrorInvalidValue);
    for (size_t i = 0; dependencyData && i < numDependencies; i++)
        if (!edge_data_default(&dependencyData[i]))
            PILOT_RETURN(cudaErrorNotSupported); /* programmatic edges */
    const cudaGraphNode_t *d = pDependencies;
    size_t nd = numDependencies;
    struct cudaGraphNodeParams *p = nodeParams;
    switch (p->type) {
    case cudaGraphNodeTypeKernel: {
        struct cudaKernelNodeParams k = kernel_v1(p);
        return cudaGraphAddKernelNode(pGraphNode, graph, d, nd, &k);
    }
    case cudaGraphNodeTypeMemcpy:
        if (p->memcpy.flags)
            PILOT_RETURN(cudaErrorInvalidValue);
        return cudaGraphAddMemcpyNode(pGraphNode, graph, d, nd, &p->memcpy.copyParams);
    case cudaGraphNodeTypeMemset: {
        struct cudaMemsetParams m = memset_v1(p);
        return cudaGraphAddMemsetNode(pGraphNode, graph, d, nd, &m);
    }
    case cudaGraphNodeTypeHost: {
        struct cudaHostNodeParams h = {p->host.fn, p->host.userData};
        return cudaGraphAddHostNode(pGraphNode, graph, d, nd, &h);
    }
    case cudaGraphNodeTypeGraph:
        if (p->graph.ownership == cudaGraphChildGraphOwnershipMove)
            return pilot_graph_add(pGraphNode, graph, d, nd, cudaGraphNodeTypeGraph, fill_child_moved,
                            p->graph.graph);
        return cudaGraphAddChildGraphNode(pGraphNode, graph, d, nd, p->graph.graph);
    case cudaGraphNodeTypeEmpty:
        return cudaGraphAddEmptyNode(pGraphNode, graph, d, nd);
    case cudaGraphNodeTypeEventRecord:
        return cudaGraphAddEventRecordNode(pGraphNode, graph, d, nd, p->eventRecord.event);
    case cudaGraphNodeTypeWaitEvent:
        return cudaGraphAddEventWaitNode(pGraphNode, graph, d, nd, p->eventWait.event);
    case cudaGraphNodeTypeMemAlloc: { /* the V2 struct has the V1 layout, field for field */
        struct cudaMemAllocNodeParams a = {p->alloc.poolProps, p->alloc.accessDescs,
                                           p->alloc.accessDescCount, p->alloc.bytesize, NULL};
        cudaError_t err = cudaGraphAddMemAllocNode(pGraphNode, graph, d, nd, &a);
        if (err == cudaSuccess)
            p->alloc.dptr = a.dptr;
        return err;
    }
    case cudaGraphNodeTypeMemFree:
        return cudaGraphAddMemFreeNode(pGraphNode, graph, d, nd, p->free.dptr);
    default:
        PILOT_RETURN(generic_unsupported(p->type));
    }
}

/* cudaGraphNodeSetParams (exec NULL) and cudaGraphExecNodeSetParams: the node's own type only. */
static cudaError_t generic_set(cudaGraphExec_t exec, cudaGraphNode_t node,
                               const struct cudaGraphNodeParams *p)
{
    pthread_mutex_lock(&pilot_graph_lock);
    struct gnode *n = pilot_node_get(node);
    int type = n ? (int)n->type : -1;
    pthread_mutex_unlock(&pilot_graph_lock);
    if (!p || type < 0 || (int)p->type != type)
        return cudaErrorInvalidValue;
    int in_exec = exec != NULL;
    switch (p->type) {
    case cudaGraphNodeTypeKernel: {
        struct cudaKernelNodeParams k = kernel_v1(p);
        return kernel_set(exec, node, &k);
    }
    case cudaGraphNodeTypeMemcpy:
        if (p->memcpy.flags)
            return cudaErrorInvalidValue;
        LOCKED_VALUE(node_params(in_exec, exec, node, p->type, NULL, &p->memcpy.copyParams));
    case cudaGraphNodeTypeMemset: {
        struct cudaMemsetParams m = memset_v1(p);
        LOCKED_VALUE(node_params(in_exec, exec, node, p->type, NULL, &m));
    }
    case cudaGraphNodeTypeHost: {
        struct cudaHostNodeParams h = {p->host.fn, p->host.userData};
        LOCKED_VALUE(node_params(in_exec, exec, node, p->type, NULL, &h));
    }
    case cudaGraphNodeTypeEmpty:
        return cudaSuccess;
    case cudaGraphNodeTypeEventRecord:
        LOCKED_VALUE(set_event(in_exec, exec, node, p->type, p->eventRecord.event));
    case cudaGraphNodeTypeWaitEvent:
        LOCKED_VALUE(set_event(in_exec, exec, node, p->type, p->eventWait.event));
    default: /* child graphs: cudaGraphExecChildGraphNodeSetParams is not carried either */
        return generic_unsupported(p->type);
    }
}

PILOT_EXPORT cudaError_t cudaGraphNodeSetParams(cudaGraphNode_t node,
                                                struct cudaGraphNodeParams *nodeParams)
{
    PILOT_RETURN(generic_set(NULL, node, nodeParams));
}

PILOT_EXPORT cudaError_t cudaGraphExecNodeSetParams(cudaGraphExec_t graphExec, cudaGraphNode_t node,
                                                    struct cudaGraphNodeParams *nodeParams)
{
    if (!graphExec)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_RETURN(generic_set(graphExec, node, nodeParams));
}
