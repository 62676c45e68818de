/* Graph memory nodes: cudaGraphAddMemAllocNode / cudaGraphAddMemFreeNode, and cudaMallocAsync /
 * cudaFreeAsync captured from a stream (graph_capture.c), with the device's graph memory
 * attributes.
 * The table of allocations and the nodes' references on them are graph_model.c's (below stream
 * capture); this file makes and frees their memory, through the memory API.
 *
 * CUDA gives an allocation node its address when the node is made and keeps it across
 * instantiations and launches; memory is mapped when the node runs and may be reused by later
 * allocations once a free node ran. Pilot makes the memory when the node is made (an ordinary
 * cudaMalloc on the pool's device: quotas, isolation and the policies apply to it as to any) and
 * keeps it while a node names it or the program holds it. At launch an allocation node and a
 * free node issue no work: they move their allocation between *live* (allocated, as the program
 * sees it) and not. What CUDA's rules say is kept: the address; use by the nodes after the
 * allocation node and, for an allocation the graph does not free, by stream work after the
 * launch until the program frees it (cudaFree, cudaFreeAsync or a free node of another graph);
 * the errors for relaunching a graph whose allocation is still live (unless it was instantiated
 * with cudaGraphInstantiateFlagAutoFreeOnLaunch), freeing twice or what no graph allocated; the
 * restrictions on graphs with memory nodes (api_graph.c: no clone, no child graph, no node or
 * edge removal, one executable graph at a time, updates that keep the allocations); and reuse:
 * an allocation node ordered after the free of memory of its own graph (every allocation of
 * that memory in the graph freed, each free before it) gets that memory and address again, as
 * CUDA gives it (pilot_gmem_reusable). Not kept: reuse in the cases that rule leaves out (CUDA
 * may also share memory between allocations it can prove apart otherwise), so a graph may hold
 * more memory than natively; and cudaDeviceGraphMemTrim, which has nothing to release: memory
 * goes back when its nodes do. Peer access to graph memory is not carried. */
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "hooks.h"
#include "log.h"

static int valid_device(int device)
{
    return device >= 0 && device < pilot_device_count() && device < PILOT_MAX_DEVICES;
}

static cudaError_t check_params(const struct cudaMemAllocNodeParams *p)
{
    if (!p || !p->bytesize)
        return cudaErrorInvalidValue;
    const struct cudaMemPoolProps *pp = &p->poolProps;
    if (pp->location.type != cudaMemLocationTypeDevice)
        return cudaErrorNotSupported; /* as the H100's driver answers for host memory */
    if (pp->allocType != cudaMemAllocationTypePinned || !valid_device(pp->location.id) ||
        (p->accessDescCount && !p->accessDescs))
        return cudaErrorInvalidValue;
    if (pp->handleTypes != cudaMemHandleTypeNone) {
        LOG_WARN("cudaGraphAddMemAllocNode: exportable graph memory (handle types 0x%x) is not supported by pilot",
                 (unsigned)pp->handleTypes);
        return cudaErrorNotSupported;
    }
    for (size_t i = 0; i < p->accessDescCount; i++) {
        const struct cudaMemAccessDesc *d = &p->accessDescs[i];
        if (d->location.type != cudaMemLocationTypeDevice || !valid_device(d->location.id))
            return cudaErrorInvalidValue;
        if (d->location.id != pp->location.id) {
            LOG_WARN("cudaGraphAddMemAllocNode: access from device %d to graph memory of device %d is not supported by pilot",
                     d->location.id, pp->location.id);
            return cudaErrorNotSupported;
        }
    }
    return cudaSuccess;
}

cudaError_t pilot_gmem_create(const struct cudaMemAllocNodeParams *p, struct gmem **out)
{
    cudaError_t err = check_params(p);
    if (err)
        return err;
    struct gmem *m = calloc(1, sizeof *m);
    if (!m)
        return cudaErrorMemoryAllocation;
    m->size = p->bytesize;
    m->device = p->poolProps.location.id;
    if ((err = pilot_malloc_on(m->device, m->size, &m->ptr))) {
        free(m);
        return err;
    }
    m->refs = 1; /* the creator's */
    pilot_gmem_track(m);
    *out = m;
    return cudaSuccess;
}

void pilot_gmem_drain(void)
{
    struct gmem *m = pilot_gmem_take_released();
    while (m) {
        struct gmem *next = m->next;
        cudaError_t err = pilot_free_relaxed(m->ptr);
        if (err)
            LOG_WARN("graph memory at %p (%zu bytes): cudaFree: %s", m->ptr, m->size, cudaGetErrorName(err));
        free(m);
        m = next;
    }
}

cudaError_t pilot_gmem_before_launch(struct gnode *const *order, size_t count, int auto_free)
{
    for (size_t i = 0; i < count; i++) {
        if (order[i]->type != cudaGraphNodeTypeMemAlloc || !order[i]->u.alloc.mem->live)
            continue;
        if (!auto_free)
            return cudaErrorInvalidValue; /* its last allocation was never freed */
        order[i]->u.alloc.mem->live = 0;
    }
    return cudaSuccess;
}

void pilot_gmem_issued(const struct gnode *n)
{
    pthread_mutex_lock(&pilot_graph_lock);
    if (n->type == cudaGraphNodeTypeMemAlloc)
        n->u.alloc.mem->live = 1;
    else if (n->type == cudaGraphNodeTypeMemFree)
        n->u.freed->live = 0; /* a free node holds a reference: nothing to release here */
    pthread_mutex_unlock(&pilot_graph_lock);
}

int pilot_gmem_user_free(void *ptr, int async, cudaStream_t stream, cudaError_t *err)
{
    if (!pilot_gmem_user_release(ptr, err))
        return 0;
    if (*err == cudaSuccess && async && pilot_gmem_released_pending())
        *err = cudaStreamSynchronize(stream); /* the stream's work before the free may use it */
    pilot_gmem_drain();
    return 1;
}

/* ---- the API ---- */

struct alloc_fill {
    const struct cudaMemAllocNodeParams *p;
    struct gmem *mem;
};

static cudaError_t fill_alloc(struct gnode *n, const void *arg)
{
    const struct alloc_fill *f = arg;
    return pilot_gmem_fill_alloc(n, f->p, f->mem, 0);
}

/* Under the lock: memory of graph the new node may have again (pilot_gmem_reusable), with a
 * reference for the caller; NULL if none, or if graph or a dependency is not valid (the add
 * then says so). */
static struct gmem *reuse(cudaGraph_t graph, const cudaGraphNode_t *deps, size_t ndeps,
                          const struct cudaMemAllocNodeParams *p)
{
    struct ggraph *g = pilot_graph_get(graph);
    if (!g || (ndeps && !deps))
        return NULL;
    for (size_t i = 0; i < ndeps; i++) {
        struct gnode *d = pilot_node_get(deps[i]);
        if (!d || d->graph != g)
            return NULL;
    }
    struct gmem *m = pilot_gmem_reusable(g, (struct gnode *const *)deps, ndeps, p);
    if (m)
        pilot_gmem_ref(m, 0);
    return m;
}

PILOT_EXPORT cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                  const cudaGraphNode_t *pDependencies,
                                                  size_t numDependencies,
                                                  struct cudaMemAllocNodeParams *nodeParams)
{
    PILOT_REQUIRE_SESSION();
    pthread_mutex_lock(&pilot_graph_lock);
    int ok = pilot_graph_get(graph) && pGraphNode;
    pthread_mutex_unlock(&pilot_graph_lock);
    if (!ok)
        PILOT_RETURN(cudaErrorInvalidValue);
    cudaError_t err = check_params(nodeParams);
    if (err)
        PILOT_RETURN(err);
    struct alloc_fill f = {.p = nodeParams};
    pthread_mutex_lock(&pilot_graph_lock);
    f.mem = reuse(graph, pDependencies, numDependencies, nodeParams);
    pthread_mutex_unlock(&pilot_graph_lock);
    if (!f.mem && (err = pilot_gmem_create(nodeParams, &f.mem)))
        PILOT_RETURN(err);
    err = pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies,
                          cudaGraphNodeTypeMemAlloc, fill_alloc, &f);
    if (err == cudaSuccess)
        nodeParams->dptr = f.mem->ptr;
    pthread_mutex_lock(&pilot_graph_lock);
    pilot_gmem_unref(f.mem, 0); /* ours: the node holds its own, or no node took it */
    pthread_mutex_unlock(&pilot_graph_lock);
    pilot_gmem_drain();
    PILOT_RETURN(err);
}

static cudaError_t fill_free(struct gnode *n, const void *arg)
{
    struct gmem *m = pilot_gmem_find(arg);
    if (!m)
        return cudaErrorInvalidValue; /* not an address an allocation node returned */
    if (!pilot_gmem_can_free(n->graph, m))
        return cudaErrorInvalidValue; /* freed twice in one graph */
    n->u.freed = m;
    pilot_gmem_ref(m, 0);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphAddMemFreeNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                                 const cudaGraphNode_t *pDependencies,
                                                 size_t numDependencies, void *dptr)
{
    PILOT_RETURN(pilot_graph_add(pGraphNode, graph, pDependencies, numDependencies,
                                 cudaGraphNodeTypeMemFree, fill_free, dptr));
}

static cudaError_t alloc_params(cudaGraphNode_t node, struct cudaMemAllocNodeParams *out)
{
    struct gnode *n = pilot_node_get(node);
    if (!n || n->type != cudaGraphNodeTypeMemAlloc || !out)
        return cudaErrorInvalidValue;
    memset(out, 0, sizeof *out);
    out->poolProps = n->u.alloc.props;
    out->accessDescs = n->u.alloc.descs;
    out->accessDescCount = n->u.alloc.ndescs;
    out->bytesize = n->u.alloc.bytesize;
    out->dptr = n->u.alloc.mem->ptr;
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphMemAllocNodeGetParams(cudaGraphNode_t node,
                                                        struct cudaMemAllocNodeParams *params_out)
{
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = alloc_params(node, params_out);
    pthread_mutex_unlock(&pilot_graph_lock);
    PILOT_RETURN(err);
}

static cudaError_t free_params(cudaGraphNode_t node, void *dptr_out)
{
    struct gnode *n = pilot_node_get(node);
    if (!n || n->type != cudaGraphNodeTypeMemFree || !dptr_out)
        return cudaErrorInvalidValue;
    memcpy(dptr_out, &n->u.freed->ptr, sizeof n->u.freed->ptr);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaGraphMemFreeNodeGetParams(cudaGraphNode_t node, void *dptr_out)
{
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = free_params(node, dptr_out);
    pthread_mutex_unlock(&pilot_graph_lock);
    PILOT_RETURN(err);
}

/* Nothing cached to give back: graph memory is freed when its nodes go (see the top). */
PILOT_EXPORT cudaError_t cudaDeviceGraphMemTrim(int device)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(valid_device(device) ? cudaSuccess : cudaErrorInvalidDevice);
}

/* Used and reserved are the same here: the bytes of every graph allocation on the device. */
PILOT_EXPORT cudaError_t cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr,
                                                        void *value)
{
    PILOT_REQUIRE_SESSION();
    if (!valid_device(device))
        PILOT_RETURN(cudaErrorInvalidDevice);
    if (!value)
        PILOT_RETURN(cudaErrorInvalidValue);
    unsigned long long v, high;
    pilot_gmem_usage(device, &v, &high);
    switch (attr) {
    case cudaGraphMemAttrUsedMemCurrent:
    case cudaGraphMemAttrReservedMemCurrent:
        *(unsigned long long *)value = v;
        return cudaSuccess;
    case cudaGraphMemAttrUsedMemHigh:
    case cudaGraphMemAttrReservedMemHigh:
        *(unsigned long long *)value = high;
        return cudaSuccess;
    default:
        PILOT_RETURN(cudaErrorInvalidValue);
    }
}

/* Only the high watermarks can be set, and only to 0 (they become the current value). */
PILOT_EXPORT cudaError_t cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr,
                                                        void *value)
{
    PILOT_REQUIRE_SESSION();
    if (!valid_device(device))
        PILOT_RETURN(cudaErrorInvalidDevice);
    if (!value || (attr != cudaGraphMemAttrUsedMemHigh && attr != cudaGraphMemAttrReservedMemHigh) ||
        *(const unsigned long long *)value != 0)
        PILOT_RETURN(cudaErrorInvalidValue);
    pilot_gmem_reset_high(device);
    return cudaSuccess;
}

PILOT_HOOK(graph_mem, .on_graph_memory_alloc = pilot_gmem_create,
           .on_graph_memory_released = pilot_gmem_drain, .on_memory_free = pilot_gmem_user_free);
