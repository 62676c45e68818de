/* The graph model (graph.h): graphs and nodes, the registry of live handles, node parameters,
 * the lock over them and the graph walks, and the table of graph allocations (struct gmem)
 * that nodes hold references on. Stream capture (graph_capture.c), graph memory (graph_mem.c)
 * and the graph API (api_graph.c) build on it; it calls none of them and nothing that reaches
 * the daemon except to resolve a kernel's parameter layout. */
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "log.h"

#define GRAPH_MAGIC 0x47524150u
#define NODE_MAGIC 0x4e4f4445u
#define PATTERN_MAX (64u << 20) /* a memset node's row whose value bytes differ: copied from here */

pthread_mutex_t pilot_graph_lock = PTHREAD_MUTEX_INITIALIZER;

static int g_logged_array;
static uint64_t g_mark; /* the last mark of a graph walk */

/* ---- the registry of live objects: an open-addressed set of pointers ---- */

static void **g_live;
static size_t g_live_cap, g_live_used; /* used counts tombstones too */
#define TOMB ((void *)1)

static size_t slot_of(const void *p, size_t cap)
{
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

int pilot_graph_live_has(const void *p)
{
    if (!p || !g_live_cap)
        return 0;
    for (size_t i = slot_of(p, g_live_cap), n = 0; n < g_live_cap; i = (i + 1) & (g_live_cap - 1), n++) {
        if (g_live[i] == p)
            return 1;
        if (!g_live[i])
            return 0;
    }
    return 0;
}

int pilot_graph_live_add(void *p)
{
    if ((g_live_used + 1) * 2 > g_live_cap) { /* rebuilt at most a quarter full, tombstones gone */
        size_t live = 0;
        for (size_t i = 0; i < g_live_cap; i++)
            live += g_live[i] && g_live[i] != TOMB;
        size_t cap = g_live_cap ? g_live_cap : 256;
        while ((live + 1) * 4 > cap)
            cap *= 2;
        void **table = calloc(cap, sizeof *table);
        if (!table)
            return -1;
        size_t used = 0;
        for (size_t i = 0; i < g_live_cap; i++)
            if (g_live[i] && g_live[i] != TOMB) {
                size_t j = slot_of(g_live[i], cap);
                while (table[j])
                    j = (j + 1) & (cap - 1);
                table[j] = g_live[i];
                used++;
            }
        free(g_live);
        g_live = table;
        g_live_cap = cap;
        g_live_used = used;
    }
    size_t i = slot_of(p, g_live_cap);
    while (g_live[i] && g_live[i] != TOMB)
        i = (i + 1) & (g_live_cap - 1);
    if (!g_live[i])
        g_live_used++;
    g_live[i] = p;
    return 0;
}

void pilot_graph_live_del(const void *p)
{
    if (!g_live_cap)
        return;
    for (size_t i = slot_of(p, g_live_cap), n = 0; n < g_live_cap && g_live[i];
         i = (i + 1) & (g_live_cap - 1), n++)
        if (g_live[i] == p) {
            g_live[i] = TOMB;
            return;
        }
}

struct ggraph *pilot_graph_get(cudaGraph_t h)
{
    struct ggraph *g = (struct ggraph *)h;
    return pilot_graph_live_has(g) && g->magic == GRAPH_MAGIC ? g : NULL;
}

struct gnode *pilot_node_get(cudaGraphNode_t h)
{
    struct gnode *n = (struct gnode *)h;
    return pilot_graph_live_has(n) && n->magic == NODE_MAGIC ? n : NULL;
}

/* ---- graphs and nodes ---- */

int pilot_graph_grow(void *array, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 4;
    while (n < need)
        n *= 2;
    void *p = realloc(*(void **)array, n * size);
    if (!p)
        return -1;
    *(void **)array = p;
    *cap = n;
    return 0;
}

struct ggraph *pilot_graph_new(void)
{
    struct ggraph *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->magic = GRAPH_MAGIC;
    if (pilot_graph_live_add(g)) {
        free(g);
        return NULL;
    }
    return g;
}

static void node_free_params(struct gnode *n)
{
    if (n->lib) {
        free(n->lib->req);
        free(n->lib->payload);
        free(n->lib);
        n->lib = NULL;
    }
    if (n->type == cudaGraphNodeTypeKernel) {
        free(n->u.k.buf);
        free(n->u.k.args);
        free(n->u.k.offsets);
        free(n->u.k.sizes);
    } else if (n->type == cudaGraphNodeTypeMemset) {
        free(n->u.set.pattern);
    } else if (n->type == cudaGraphNodeTypeGraph && n->u.child) {
        pilot_graph_free(n->u.child);
    } else if (n->type == cudaGraphNodeTypeMemAlloc && n->u.alloc.mem) {
        free(n->u.alloc.descs);
        pilot_gmem_unref(n->u.alloc.mem, n->orig != NULL); /* copies come from instantiation */
    } else if (n->type == cudaGraphNodeTypeMemFree && n->u.freed) {
        pilot_gmem_unref(n->u.freed, 0);
    }
}

static void node_free(struct gnode *n)
{
    pilot_graph_live_del(n);
    n->magic = 0;
    node_free_params(n);
    free(n->kattrs); /* kept across new parameters, as CUDA keeps a node's attributes */
    free(n->deps);
    free(n->outs);
    free(n);
}

void pilot_graph_free(struct ggraph *g)
{
    if (!g)
        return;
    pilot_graph_live_del(g);
    g->magic = 0;
    for (size_t i = 0; i < g->count; i++)
        node_free(g->nodes[i]);
    free(g->nodes);
    free(g);
}

int pilot_graph_edge_add(struct gnode *from, struct gnode *to)
{
    if (pilot_graph_grow(&from->outs, &from->cap_outs, from->nouts + 1, sizeof *from->outs) ||
        pilot_graph_grow(&to->deps, &to->cap_deps, to->ndeps + 1, sizeof *to->deps))
        return -1;
    from->outs[from->nouts++] = to;
    to->deps[to->ndeps++] = from;
    return 0;
}

void pilot_graph_remove_ptr(struct gnode **array, size_t *count, const struct gnode *p)
{
    for (size_t i = 0; i < *count; i++)
        if (array[i] == p) {
            memmove(&array[i], &array[i + 1], (*count - i - 1) * sizeof *array);
            (*count)--;
            return;
        }
}

int pilot_graph_has_edge(const struct gnode *from, const struct gnode *to)
{
    for (size_t i = 0; i < from->nouts; i++)
        if (from->outs[i] == to)
            return 1;
    return 0;
}

static uint64_t g_seq;

struct gnode *pilot_node_add(struct ggraph *g, enum cudaGraphNodeType type, struct gnode *const *deps,
                             size_t ndeps)
{
    struct gnode *n = calloc(1, sizeof *n);
    if (!n || pilot_graph_grow(&g->nodes, &g->cap, g->count + 1, sizeof *g->nodes) || pilot_graph_live_add(n)) {
        free(n);
        return NULL;
    }
    n->magic = NODE_MAGIC;
    n->type = type;
    n->graph = g;
    n->enabled = 1;
    n->seq = ++g_seq;
    g->nodes[g->count++] = n;
    for (size_t i = 0; i < ndeps; i++)
        if (!pilot_graph_has_edge(deps[i], n) && pilot_graph_edge_add(deps[i], n)) {
            pilot_node_destroy(n);
            return NULL;
        }
    return n;
}

void pilot_node_destroy(struct gnode *n)
{
    for (size_t i = 0; i < n->ndeps; i++)
        pilot_graph_remove_ptr(n->deps[i]->outs, &n->deps[i]->nouts, n);
    for (size_t i = 0; i < n->nouts; i++)
        pilot_graph_remove_ptr(n->outs[i]->deps, &n->outs[i]->ndeps, n);
    pilot_graph_remove_ptr(n->graph->nodes, &n->graph->count, n);
    node_free(n);
}

/* Fills a kernel node from a packed argument buffer (info: the kernel's layout). */
cudaError_t pilot_node_set_kernel_packed(struct gnode *n, struct pilot_kernel *kernel, void *func,
                                         dim3 grid, dim3 block, unsigned shared,
                                         const struct pilot_kernel_launch_info *info,
                                         const unsigned char *buf)
{
    uint32_t np = info->nparams;
    unsigned char *copy = malloc(info->arg_bytes ? info->arg_bytes : 1);
    void **args = calloc(np ? np : 1, sizeof *args);
    uint32_t *offsets = calloc(np ? np : 1, sizeof *offsets);
    uint32_t *sizes = calloc(np ? np : 1, sizeof *sizes);
    if (!copy || !args || !offsets || !sizes) {
        free(copy);
        free(args);
        free(offsets);
        free(sizes);
        return cudaErrorMemoryAllocation;
    }
    memcpy(copy, buf, info->arg_bytes);
    for (uint32_t i = 0; i < np; i++) {
        offsets[i] = info->params[i].offset;
        sizes[i] = info->params[i].size;
        args[i] = copy + offsets[i];
    }
    node_free_params(n);
    n->u.k.kernel = kernel;
    n->u.k.func = func;
    n->u.k.grid = grid;
    n->u.k.block = block;
    n->u.k.shared = shared;
    n->u.k.nparams = np;
    n->u.k.arg_bytes = info->arg_bytes;
    n->u.k.offsets = offsets;
    n->u.k.sizes = sizes;
    n->u.k.buf = copy;
    n->u.k.args = args;
    return cudaSuccess;
}

static int has_array(const struct cudaMemcpy3DParms *p)
{
    if (!p->srcArray && !p->dstArray)
        return 0;
    if (!__atomic_exchange_n(&g_logged_array, 1, __ATOMIC_RELAXED))
        LOG_WARN("memcpy graph nodes with CUDA arrays are not supported by pilot");
    return 1;
}

cudaError_t pilot_node_set_copy(struct gnode *n, const struct cudaMemcpy3DParms *p)
{
    if (has_array(p))
        return cudaErrorNotSupported;
    if ((unsigned)p->kind > cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    if (!p->extent.width || !p->extent.height || !p->extent.depth)
        return cudaErrorInvalidValue;
    n->u.copy.p = *p;
    return cudaSuccess;
}

cudaError_t pilot_node_set_copy_1d(struct gnode *n, void *dst, const void *src, size_t count,
                                   enum cudaMemcpyKind kind)
{
    if ((unsigned)kind > cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    if (!count)
        return cudaErrorInvalidValue;
    struct cudaMemcpy3DParms p = {0};
    p.srcPtr = (struct cudaPitchedPtr){.ptr = (void *)src, .pitch = count, .xsize = count, .ysize = 1};
    p.dstPtr = (struct cudaPitchedPtr){.ptr = dst, .pitch = count, .xsize = count, .ysize = 1};
    p.extent = (struct cudaExtent){.width = count, .height = 1, .depth = 1};
    p.kind = kind;
    n->u.copy.p = p;
    return cudaSuccess;
}

cudaError_t pilot_node_set_memset(struct gnode *n, const struct cudaMemsetParams *p)
{
    unsigned e = p->elementSize;
    if (e != 1 && e != 2 && e != 4)
        return cudaErrorInvalidValue;
    if (!p->dst || !p->width || !p->height)
        return cudaErrorInvalidValue;
    if (p->height > 1 && p->width * e > p->pitch)
        return cudaErrorInvalidValue;
    unsigned char bytes[4];
    memcpy(bytes, &p->value, 4); /* little-endian: the element's bytes in memory order */
    int uniform = 1;
    for (unsigned i = 1; i < e; i++)
        uniform &= bytes[i] == bytes[0];
    unsigned char *pattern = NULL;
    if (!uniform) {
        /* The daemon sets bytes; a row of 16- or 32-bit values whose bytes differ is copied. */
        if (p->width > PATTERN_MAX / e)
            return cudaErrorNotSupported;
        if (!(pattern = malloc(p->width * e)))
            return cudaErrorMemoryAllocation;
        for (size_t i = 0; i < p->width; i++)
            memcpy(pattern + i * e, bytes, e);
    }
    free(n->u.set.pattern);
    n->u.set.p = *p;
    n->u.set.pattern = pattern;
    return cudaSuccess;
}

cudaError_t pilot_node_set_library(struct gnode *n, const struct glib *call)
{
    struct glib *lib = malloc(sizeof *lib);
    unsigned char *req = malloc(call->req_len ? call->req_len : 1);
    unsigned char *payload = malloc(call->payload_len ? call->payload_len : 1);
    if (!lib || !req || !payload) {
        free(lib);
        free(req);
        free(payload);
        return cudaErrorMemoryAllocation;
    }
    memcpy(req, call->req, call->req_len);
    if (call->payload_len)
        memcpy(payload, call->payload, call->payload_len);
    node_free_params(n);
    memset(&n->u.k, 0, sizeof n->u.k);
    *lib = *call;
    lib->req = req;
    lib->payload = payload;
    n->lib = lib;
    return cudaSuccess;
}

int pilot_graph_has_mem_nodes(const struct ggraph *g)
{
    for (size_t i = 0; i < g->count; i++) {
        const struct gnode *n = g->nodes[i];
        if (n->type == cudaGraphNodeTypeMemAlloc || n->type == cudaGraphNodeTypeMemFree ||
            (n->type == cudaGraphNodeTypeGraph && pilot_graph_has_mem_nodes(n->u.child)))
            return 1;
    }
    return 0;
}

/* Checks a graph and a dependency list given to an Add call: every dependency a node of g. */
static cudaError_t check_add(cudaGraphNode_t *pNode, cudaGraph_t graph,
                             const cudaGraphNode_t *deps, size_t ndeps, struct ggraph **g)
{
    if (!pNode || !(*g = pilot_graph_get(graph)) || (ndeps && !deps))
        return cudaErrorInvalidValue;
    for (size_t i = 0; i < ndeps; i++) {
        struct gnode *d = pilot_node_get(deps[i]);
        if (!d || d->graph != *g)
            return cudaErrorInvalidValue;
        for (size_t j = 0; j < i; j++)
            if (deps[j] == deps[i])
                return cudaErrorInvalidValue; /* a dependency named twice */
    }
    return cudaSuccess;
}

cudaError_t pilot_graph_add(cudaGraphNode_t *pNode, cudaGraph_t graph, const cudaGraphNode_t *deps,
                            size_t ndeps, enum cudaGraphNodeType type,
                            cudaError_t (*fill)(struct gnode *, const void *), const void *arg)
{
    pthread_mutex_lock(&pilot_graph_lock);
    struct ggraph *g = NULL;
    cudaError_t err = check_add(pNode, graph, deps, ndeps, &g);
    struct gnode *n = NULL;
    if (err == cudaSuccess && !(n = pilot_node_add(g, type, (struct gnode *const *)deps, ndeps)))
        err = cudaErrorMemoryAllocation;
    if (err == cudaSuccess && fill && (err = fill(n, arg)))
        pilot_node_destroy(n);
    else if (err == cudaSuccess)
        *pNode = (cudaGraphNode_t)n;
    pthread_mutex_unlock(&pilot_graph_lock);
    PILOT_RETURN(err);
}

/* Marks every node the origin's dependency set depends on (itself included) with `mark`,
 * without recursion (a capture of a long loop is a chain of as many nodes). 0: out of memory. */
int pilot_graph_mark_ancestors(struct gnode *const *from, size_t n, uint64_t *out)
{
    uint64_t mark = *out = ++g_mark;
    size_t cap = n + 16, top = 0;
    struct gnode **stack = malloc(cap * sizeof *stack);
    if (!stack)
        return 0;
    for (size_t i = 0; i < n; i++)
        stack[top++] = from[i];
    while (top) {
        struct gnode *node = stack[--top];
        if (node->mark == mark)
            continue;
        node->mark = mark;
        if (top + node->ndeps > cap) {
            cap = (top + node->ndeps) * 2;
            struct gnode **bigger = realloc(stack, cap * sizeof *stack);
            if (!bigger) {
                free(stack);
                return 0;
            }
            stack = bigger;
        }
        for (size_t i = 0; i < node->ndeps; i++)
            stack[top++] = node->deps[i];
    }
    free(stack);
    return 1;
}

/* ---- the table of graph allocations (graph_mem.c makes and frees the memory) ---- */

static struct gmem *g_mems;     /* every allocation some node names or the program holds */
static struct gmem *g_dead;     /* released, to be freed by pilot_gmem_drain */
static int g_count;             /* entries in g_mems: cudaFree's one check while none exists */
static unsigned long long g_reserved[PILOT_MAX_DEVICES], g_high[PILOT_MAX_DEVICES];

void pilot_gmem_track(struct gmem *m)
{
    pthread_mutex_lock(&pilot_graph_lock);
    m->next = g_mems;
    g_mems = m;
    __atomic_add_fetch(&g_count, 1, __ATOMIC_RELEASE);
    g_reserved[m->device] += m->size;
    if (g_reserved[m->device] > g_high[m->device])
        g_high[m->device] = g_reserved[m->device];
    pthread_mutex_unlock(&pilot_graph_lock);
}

struct gmem *pilot_gmem_find(const void *ptr)
{
    for (struct gmem *m = g_mems; m; m = m->next)
        if (m->ptr == ptr)
            return m;
    return NULL;
}

/* Under the lock: m leaves the table for g_dead if nothing holds it any more. */
static void maybe_release(struct gmem *m)
{
    if (m->refs || m->live)
        return;
    for (struct gmem **p = &g_mems; *p; p = &(*p)->next)
        if (*p == m) { /* (not there in a forked child: its parent's, left alone) */
            *p = m->next;
            __atomic_sub_fetch(&g_count, 1, __ATOMIC_RELEASE);
            g_reserved[m->device] -= m->size;
            m->next = g_dead;
            g_dead = m;
            return;
        }
}

void pilot_gmem_ref(struct gmem *m, int exec_alloc)
{
    m->refs++;
    m->exec_allocs += exec_alloc != 0;
}

void pilot_gmem_unref(struct gmem *m, int exec_alloc)
{
    m->refs--;
    m->exec_allocs -= exec_alloc != 0;
    maybe_release(m);
}

struct gmem *pilot_gmem_take_released(void)
{
    if (!__atomic_load_n(&g_dead, __ATOMIC_ACQUIRE))
        return NULL;
    pthread_mutex_lock(&pilot_graph_lock);
    struct gmem *m = g_dead;
    g_dead = NULL;
    pthread_mutex_unlock(&pilot_graph_lock);
    return m;
}

int pilot_gmem_user_release(void *ptr, cudaError_t *err)
{
    if (!__atomic_load_n(&g_count, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&pilot_graph_lock);
    struct gmem *m = pilot_gmem_find(ptr);
    if (!m) {
        pthread_mutex_unlock(&pilot_graph_lock);
        return 0;
    }
    *err = m->live ? cudaSuccess : cudaErrorInvalidValue; /* not allocated now: nothing to free */
    m->live = 0;
    maybe_release(m);
    pthread_mutex_unlock(&pilot_graph_lock);
    return 1;
}

int pilot_gmem_released_pending(void)
{
    return __atomic_load_n(&g_dead, __ATOMIC_ACQUIRE) != NULL;
}

void pilot_gmem_usage(int device, unsigned long long *current, unsigned long long *high)
{
    pthread_mutex_lock(&pilot_graph_lock);
    *current = g_reserved[device];
    *high = g_high[device];
    pthread_mutex_unlock(&pilot_graph_lock);
}

void pilot_gmem_reset_high(int device)
{
    pthread_mutex_lock(&pilot_graph_lock);
    g_high[device] = g_reserved[device];
    pthread_mutex_unlock(&pilot_graph_lock);
}

void pilot_gmem_forget(void)
{
    g_mems = NULL; /* the entries stay reachable from the graph objects copied with the process */
    g_dead = NULL;
    g_count = 0;
    memset(g_reserved, 0, sizeof g_reserved);
    memset(g_high, 0, sizeof g_high);
}

cudaError_t pilot_gmem_fill_alloc(struct gnode *n, const struct cudaMemAllocNodeParams *p,
                                  struct gmem *m, int exec_alloc)
{
    struct cudaMemAccessDesc *descs = NULL;
    if (p->accessDescCount) {
        if (!(descs = malloc(p->accessDescCount * sizeof *descs)))
            return cudaErrorMemoryAllocation;
        memcpy(descs, p->accessDescs, p->accessDescCount * sizeof *descs);
    }
    n->u.alloc.mem = m;
    n->u.alloc.bytesize = p->bytesize;
    n->u.alloc.props = p->poolProps;
    n->u.alloc.descs = descs;
    n->u.alloc.ndescs = p->accessDescCount;
    pilot_gmem_ref(m, exec_alloc);
    return cudaSuccess;
}

/* How many allocation nodes and free nodes of g name m, and how many of those free nodes carry
 * `mark` (0: none does). */
static void count_nodes(const struct ggraph *g, const struct gmem *m, uint64_t mark, size_t *allocs,
                        size_t *frees, size_t *marked_frees)
{
    *allocs = *frees = *marked_frees = 0;
    for (size_t i = 0; i < g->count; i++) {
        const struct gnode *n = g->nodes[i];
        int is_free = n->type == cudaGraphNodeTypeMemFree && n->u.freed == m;
        *allocs += n->type == cudaGraphNodeTypeMemAlloc && n->u.alloc.mem == m;
        *frees += is_free;
        *marked_frees += is_free && mark && n->mark == mark;
    }
}

int pilot_gmem_can_free(const struct ggraph *g, const struct gmem *m)
{
    size_t allocs, frees, marked;
    count_nodes(g, m, 0, &allocs, &frees, &marked);
    return frees < (allocs ? allocs : 1);
}

struct gmem *pilot_gmem_reusable(const struct ggraph *g, struct gnode *const *deps, size_t ndeps,
                                 const struct cudaMemAllocNodeParams *p)
{
    uint64_t mark;
    if (!ndeps || !pilot_graph_has_mem_nodes(g) || !pilot_graph_mark_ancestors(deps, ndeps, &mark))
        return NULL;
    for (size_t i = 0; i < g->count; i++) {
        const struct gnode *f = g->nodes[i];
        if (f->type != cudaGraphNodeTypeMemFree || f->mark != mark)
            continue;
        struct gmem *m = f->u.freed;
        size_t allocs, frees, before;
        count_nodes(g, m, mark, &allocs, &frees, &before);
        if (allocs && allocs == frees && before == frees && m->size >= p->bytesize &&
            m->device == p->poolProps.location.id)
            return m;
    }
    return NULL;
}
