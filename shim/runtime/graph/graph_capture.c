/* Stream capture, in the shim. cudaStreamBeginCapture puts a stream (a daemon handle) in capture
 * mode: from then on the operations issued on it are not sent to pilotd but recorded as nodes of
 * the capture's graph (api_graph.c), each depending on the stream's current dependency set, which
 * it then replaces. The entry points ask first (`pilot_capture_*`, one atomic load while nothing
 * captures): kernel launches, async copies and memsets (1D, 2D, symbols), host functions, event
 * records and waits (a graph launch is refused, as CUDA 13 does). Cross-stream capture works as in CUDA: an event recorded on a
 * capturing stream remembers the stream's dependency set; a stream that waits for it joins the
 * capture (fork) or merges that set into its own (join). cudaStreamEndCapture on the origin stream
 * ends the capture for every stream in it and returns the graph (cudaErrorStreamCaptureUnjoined if
 * a stream that joined was not joined back).
 *
 * What CUDA forbids during a capture gets CUDA's error and invalidates the capture (EndCapture
 * then returns cudaErrorStreamCaptureInvalidated and no graph): synchronizing or querying a
 * capturing stream and cudaDeviceSynchronize (cudaErrorStreamCaptureUnsupported); legacy-stream
 * work while a blocking stream of the device captures (cudaErrorStreamCaptureImplicit); a
 * synchronous copy or memset where the thread's capture mode forbids unsafe calls
 * (cudaErrorStreamCaptureUnsupported); waiting in a capture for an event recorded outside it
 * (cudaErrorStreamCaptureIsolation); cudaMalloc and cudaFree where the capture modes forbid
 * unsafe calls (cudaErrorStreamCaptureUnsupported); synchronizing or querying an event recorded
 * in a capture (cudaErrorCapturedEvent). cudaMallocAsync and cudaFreeAsync of graph memory
 * become allocation and free nodes (graph_mem.c). Work pilot cannot put in a graph (allocation
 * from an explicit pool, a free of memory no graph allocated, peer copies, cooperative launches,
 * stream callbacks) is cudaErrorNotSupported on a capturing stream, logged, and invalidates the
 * capture. */
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "log.h"
#include "hooks.h"

struct capture {
    uint64_t id;
    struct ggraph *graph;
    int own_graph; /* created by BeginCapture (freed if the capture fails), else the program's */
    uint64_t origin;
    enum cudaStreamCaptureMode mode;
    pthread_t thread;
    int device;
    int invalidated;
    int blocking; /* the origin stream synchronizes with the legacy stream */
    struct capture *next;
};

struct cstream { /* a stream taking part in a capture */
    uint64_t handle;
    struct capture *cap;
    struct gnode **deps;
    size_t n, cap_deps;
    cudaGraphEdgeData *edges; /* zeros, for cudaStreamGetCaptureInfo */
    size_t cap_edges;
    struct cstream *next;
};

struct cevent { /* an event last recorded in a capture */
    uint64_t event;
    struct capture *cap;
    struct gnode **deps;
    size_t n;
    struct cevent *next;
};

static struct capture *g_captures;
static struct cstream *g_streams;
static struct cevent *g_events;
static int g_active; /* captures under way: the hot paths' one check */
static uint64_t g_next_id;
static __thread enum cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

int pilot_capture_any(void)
{
    return __atomic_load_n(&g_active, __ATOMIC_ACQUIRE) > 0;
}

int pilot_capture_owns(const struct ggraph *g)
{
    for (struct capture *c = g_captures; c; c = c->next)
        if (c->graph == g)
            return 1;
    return 0;
}

static struct cstream *find_stream(uint64_t h)
{
    for (struct cstream *s = g_streams; s; s = s->next)
        if (s->handle == h)
            return s;
    return NULL;
}

static struct cevent *find_event(uint64_t event)
{
    for (struct cevent *e = g_events; e; e = e->next)
        if (e->event == event)
            return e;
    return NULL;
}

static void drop_event(uint64_t event)
{
    for (struct cevent **p = &g_events; *p; p = &(*p)->next)
        if ((*p)->event == event) {
            struct cevent *e = *p;
            *p = e->next;
            free(e->deps);
            free(e);
            return;
        }
}

static int set_deps(struct cstream *s, struct gnode *const *deps, size_t n)
{
    if (n > s->cap_deps) {
        struct gnode **d = realloc(s->deps, n * sizeof *d);
        if (!d)
            return -1;
        s->deps = d;
        s->cap_deps = n;
    }
    if (n)
        memmove(s->deps, deps, n * sizeof *deps);
    s->n = n;
    return 0;
}

/* Adds to s's set the nodes of deps it lacks. */
static int merge_deps(struct cstream *s, struct gnode *const *deps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int have = 0;
        for (size_t j = 0; j < s->n; j++)
            have |= s->deps[j] == deps[i];
        if (have)
            continue;
        if (s->n == s->cap_deps) {
            size_t cap = s->cap_deps ? s->cap_deps * 2 : 4;
            struct gnode **d = realloc(s->deps, cap * sizeof *d);
            if (!d)
                return -1;
            s->deps = d;
            s->cap_deps = cap;
        }
        s->deps[s->n++] = deps[i];
    }
    return 0;
}

static struct cstream *join(uint64_t h, struct capture *cap, struct gnode *const *deps, size_t n)
{
    struct cstream *s = calloc(1, sizeof *s);
    if (!s || set_deps(s, deps, n)) {
        free(s);
        return NULL;
    }
    s->handle = h;
    s->cap = cap;
    s->next = g_streams;
    g_streams = s;
    return s;
}

/* Ends a capture: its streams leave capture mode, its events forget it. */
static void end_capture(struct capture *cap, int free_graph)
{
    for (struct cstream **p = &g_streams; *p;) {
        struct cstream *s = *p;
        if (s->cap == cap) {
            *p = s->next;
            free(s->deps);
            free(s->edges);
            free(s);
        } else {
            p = &s->next;
        }
    }
    for (struct cevent **p = &g_events; *p;) {
        struct cevent *e = *p;
        if (e->cap == cap) {
            *p = e->next;
            free(e->deps);
            free(e);
        } else {
            p = &e->next;
        }
    }
    for (struct capture **p = &g_captures; *p; p = &(*p)->next)
        if (*p == cap) {
            *p = cap->next;
            break;
        }
    if (free_graph && cap->own_graph)
        pilot_graph_free(cap->graph);
    free(cap);
    __atomic_sub_fetch(&g_active, 1, __ATOMIC_RELEASE);
}

/* Legacy-stream work while a blocking stream of the device captures would depend on the capture:
 * cudaErrorStreamCaptureImplicit, and those captures are invalidated. */
static int legacy_conflict(uint64_t h)
{
    if (h)
        return 0;
    int dev = pilot_current_device(), hit = 0;
    for (struct capture *c = g_captures; c; c = c->next)
        if (c->blocking && c->device == dev) {
            c->invalidated = 1;
            hit = 1;
        }
    return hit;
}

/* The capturing stream an operation on h is recorded in, or NULL (issue it as usual). With the
 * lock held on return when *taken; *err is set when the operation must fail instead. */
static struct cstream *enter(uint64_t h, int *taken, cudaError_t *err)
{
    *taken = 0;
    if (!pilot_capture_any())
        return NULL;
    pthread_mutex_lock(&pilot_graph_lock);
    struct cstream *s = find_stream(h);
    if (!s && legacy_conflict(h)) {
        *err = cudaErrorStreamCaptureImplicit;
        *taken = 1;
        return NULL;
    }
    if (!s) {
        pthread_mutex_unlock(&pilot_graph_lock);
        return NULL;
    }
    *taken = 1;
    if (s->cap->invalidated) {
        *err = cudaErrorStreamCaptureInvalidated;
        return NULL;
    }
    *err = cudaSuccess;
    return s;
}

static int leave(cudaError_t *err, cudaError_t value)
{
    *err = value;
    pthread_mutex_unlock(&pilot_graph_lock);
    return 1;
}

/* A new node of s's capture after s's dependencies; s now depends on it alone. */
static struct gnode *append(struct cstream *s, enum cudaGraphNodeType type)
{
    struct gnode *n = pilot_node_add(s->cap->graph, type, s->deps, s->n);
    if (n && set_deps(s, &n, 1)) {
        pilot_node_destroy(n);
        return NULL;
    }
    return n;
}

/* Finishes a node whose parameters failed: it goes, and the stream's dependencies stay as they
 * were before it (the node was their only member). */
static int fail_node(struct cstream *s, struct gnode *n, cudaError_t *err, cudaError_t why)
{
    size_t nd = n->ndeps;
    struct gnode **before = malloc((nd ? nd : 1) * sizeof *before);
    if (before)
        memcpy(before, n->deps, nd * sizeof *before);
    pilot_node_destroy(n);
    if (before && set_deps(s, before, nd) == 0) {
        free(before);
        return leave(err, why);
    }
    free(before);
    s->cap->invalidated = 1;
    return leave(err, why);
}

/* ---- hooks of the entry points ---- */

int pilot_capture_launch(uint64_t stream, struct pilot_kernel *kernel, dim3 grid, dim3 block,
                         unsigned shared, const struct pilot_kernel_launch_info *info,
                         const unsigned char *buf, cudaError_t *err)
{
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    struct gnode *n = append(s, cudaGraphNodeTypeKernel);
    if (!n)
        return leave(err, cudaErrorMemoryAllocation);
    cudaError_t e = pilot_node_set_kernel_packed(n, kernel, (void *)kernel, grid, block, shared,
                                                 info, buf);
    return e ? fail_node(s, n, err, e) : leave(err, cudaSuccess);
}

int pilot_capture_library(uint64_t stream, uint16_t op, int device, size_t stream_offset,
                          const void *req, size_t req_len, const void *payload,
                          size_t payload_len, cudaError_t *err)
{
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    struct gnode *n = append(s, cudaGraphNodeTypeKernel);
    if (!n)
        return leave(err, cudaErrorMemoryAllocation);
    struct glib call = {.op = op, .device = device, .stream_offset = stream_offset,
                        .req = (unsigned char *)req, .req_len = req_len,
                        .payload = (unsigned char *)payload, .payload_len = payload_len};
    cudaError_t e = pilot_node_set_library(n, &call);
    return e ? fail_node(s, n, err, e) : leave(err, cudaSuccess);
}

int pilot_capture_copy(uint64_t stream, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t height, enum cudaMemcpyKind kind, cudaError_t *err)
{
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    if (!width || !height)
        return leave(err, cudaSuccess); /* nothing to copy: no node */
    struct gnode *n = append(s, cudaGraphNodeTypeMemcpy);
    if (!n)
        return leave(err, cudaErrorMemoryAllocation);
    cudaError_t e;
    if (height == 1) {
        e = pilot_node_set_copy_1d(n, dst, src, width, kind);
    } else {
        struct cudaMemcpy3DParms p = {0};
        p.srcPtr = (struct cudaPitchedPtr){.ptr = (void *)src, .pitch = spitch, .xsize = width,
                                           .ysize = height};
        p.dstPtr = (struct cudaPitchedPtr){.ptr = dst, .pitch = dpitch, .xsize = width,
                                           .ysize = height};
        p.extent = (struct cudaExtent){.width = width, .height = height, .depth = 1};
        p.kind = kind;
        e = (width > dpitch || width > spitch) ? cudaErrorInvalidPitchValue
                                               : pilot_node_set_copy(n, &p);
    }
    return e ? fail_node(s, n, err, e) : leave(err, cudaSuccess);
}

int pilot_capture_memset(uint64_t stream, void *ptr, size_t pitch, int value, size_t width,
                         size_t height, cudaError_t *err)
{
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    if (!width || !height)
        return leave(err, cudaSuccess);
    struct gnode *n = append(s, cudaGraphNodeTypeMemset);
    if (!n)
        return leave(err, cudaErrorMemoryAllocation);
    struct cudaMemsetParams p = {.dst = ptr, .pitch = height > 1 ? pitch : width,
                                 .value = (unsigned)value & 0xffu, .elementSize = 1,
                                 .width = width, .height = height};
    cudaError_t e = pilot_node_set_memset(n, &p);
    return e ? fail_node(s, n, err, e) : leave(err, cudaSuccess);
}

int pilot_capture_host(uint64_t stream, cudaHostFn_t fn, void *data, cudaError_t *err)
{
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    struct gnode *n = append(s, cudaGraphNodeTypeHost);
    if (!n)
        return leave(err, cudaErrorMemoryAllocation);
    n->u.host = (struct cudaHostNodeParams){.fn = fn, .userData = data};
    return leave(err, cudaSuccess);
}

/* cudaMallocAsync on a capturing stream: an allocation node of `size` bytes on `device`, made
 * outside the lock (it is a cudaMalloc), then added if the capture is still the same. */
int pilot_capture_mem_alloc(uint64_t stream, void **ptr, size_t size, int device, cudaError_t *err)
{
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    if (!ptr)
        return leave(err, cudaErrorInvalidValue);
    *ptr = NULL;
    if (!size)
        return leave(err, cudaSuccess); /* nothing to allocate: no node */
    struct cudaMemAllocNodeParams p = {.bytesize = size};
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location = (struct cudaMemLocation){.type = cudaMemLocationTypeDevice, .id = device};
    struct gmem *m = pilot_gmem_reusable(s->cap->graph, s->deps, s->n, &p);
    if (m) { /* memory this graph freed before: its address again, as CUDA reuses it */
        pilot_gmem_ref(m, 0); /* ours until the node holds its own, as a creator's below */
    } else {
        uint64_t id = s->cap->id;
        pthread_mutex_unlock(&pilot_graph_lock);
        if ((*err = pilot_hooks_graph_memory_alloc(&p, &m)))
            return 1;
        s = enter(stream, &taken, err);
        if (!s || s->cap->id != id) {
            if (s || !taken)
                *err = cudaErrorStreamCaptureInvalidated; /* the capture ended meanwhile */
            if (!taken)
                pthread_mutex_lock(&pilot_graph_lock);
            s = NULL;
        }
    }
    struct gnode *n = s ? append(s, cudaGraphNodeTypeMemAlloc) : NULL;
    if (n) {
        (void)pilot_gmem_fill_alloc(n, &p, m, 0); /* no access descriptors: cannot fail */
        *ptr = m->ptr;
    } else if (s) {
        *err = cudaErrorMemoryAllocation;
    }
    pilot_gmem_unref(m, 0); /* ours: the node holds its own, or none took it and it goes */
    pthread_mutex_unlock(&pilot_graph_lock);
    pilot_hooks_graph_memory_released();
    if (n)
        *err = cudaSuccess;
    return 1;
}

/* cudaFreeAsync on a capturing stream of memory a graph allocated: a free node (0: not such
 * memory, for cudaFreeAsync to refuse as it refuses any other free in a capture). */
int pilot_capture_mem_free(uint64_t stream, void *ptr, cudaError_t *err)
{
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    struct gmem *m = pilot_gmem_find(ptr);
    if (!m) {
        pthread_mutex_unlock(&pilot_graph_lock);
        return 0;
    }
    if (!pilot_gmem_can_free(s->cap->graph, m))
        return leave(err, cudaErrorInvalidValue); /* freed twice in one graph */
    struct gnode *n = append(s, cudaGraphNodeTypeMemFree);
    if (!n)
        return leave(err, cudaErrorMemoryAllocation);
    n->u.freed = m;
    pilot_gmem_ref(m, 0);
    return leave(err, cudaSuccess);
}

/* A graph launched into a capturing stream: CUDA 13 refuses it with
 * cudaErrorStreamCaptureUnsupported (seen on the H100, driver 580) and the capture is then
 * invalidated, as for every call a capture cannot take. */
int pilot_capture_graph(cudaStream_t stream, const struct ggraph *g, cudaError_t *err)
{
    (void)g;
    int taken;
    struct cstream *s = enter(pilot_stream_handle(stream), &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    s->cap->invalidated = 1;
    return leave(err, cudaErrorStreamCaptureUnsupported);
}

int pilot_capture_record(uint64_t stream, cudaEvent_t event, int external, cudaError_t *err)
{
    if (!pilot_capture_any())
        return 0;
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s) {
        if (taken)
            return leave(err, *err);
        pthread_mutex_lock(&pilot_graph_lock); /* recorded outside a capture from now on */
        drop_event((uintptr_t)event);
        pthread_mutex_unlock(&pilot_graph_lock);
        return 0;
    }
    if (external) {
        struct gnode *n = append(s, cudaGraphNodeTypeEventRecord);
        if (!n)
            return leave(err, cudaErrorMemoryAllocation);
        n->u.event = event;
    }
    struct cevent *e = find_event((uintptr_t)event);
    if (!e) {
        if (!(e = calloc(1, sizeof *e)))
            return leave(err, cudaErrorMemoryAllocation);
        e->event = (uintptr_t)event;
        e->next = g_events;
        g_events = e;
    }
    struct gnode **deps = malloc((s->n ? s->n : 1) * sizeof *deps);
    if (!deps)
        return leave(err, cudaErrorMemoryAllocation);
    memcpy(deps, s->deps, s->n * sizeof *deps);
    free(e->deps);
    e->deps = deps;
    e->n = s->n;
    e->cap = s->cap;
    return leave(err, cudaSuccess);
}

int pilot_capture_wait(uint64_t stream, cudaEvent_t event, unsigned flags, cudaError_t *err)
{
    if (!pilot_capture_any())
        return 0;
    pthread_mutex_lock(&pilot_graph_lock);
    struct cstream *s = find_stream(stream);
    struct cevent *e = find_event((uintptr_t)event);
    if (!s && !e) {
        int implicit = legacy_conflict(stream);
        pthread_mutex_unlock(&pilot_graph_lock);
        if (implicit)
            *err = cudaErrorStreamCaptureImplicit;
        return implicit;
    }
    if (s && s->cap->invalidated)
        return leave(err, cudaErrorStreamCaptureInvalidated);
    if (s && (flags & cudaEventWaitExternal)) { /* a wait node for an event from outside */
        struct gnode *n = append(s, cudaGraphNodeTypeWaitEvent);
        if (!n)
            return leave(err, cudaErrorMemoryAllocation);
        n->u.event = event;
        return leave(err, cudaSuccess);
    }
    if (!e) { /* a capturing stream waits for work outside its capture */
        s->cap->invalidated = 1;
        return leave(err, cudaErrorStreamCaptureIsolation);
    }
    if (!s) { /* fork: the stream joins the capture, after what the event records */
        if (!stream || legacy_conflict(stream)) {
            e->cap->invalidated = 1;
            return leave(err, cudaErrorStreamCaptureImplicit);
        }
        if (e->cap->invalidated)
            return leave(err, cudaErrorStreamCaptureInvalidated);
        return leave(err, join(stream, e->cap, e->deps, e->n) ? cudaSuccess
                                                               : cudaErrorMemoryAllocation);
    }
    if (s->cap != e->cap) {
        s->cap->invalidated = e->cap->invalidated = 1;
        return leave(err, cudaErrorStreamCaptureMerge);
    }
    return leave(err, merge_deps(s, e->deps, e->n) ? cudaErrorMemoryAllocation : cudaSuccess);
}

int pilot_capture_refuse(uint64_t stream, const char *what, cudaError_t *err)
{
    int taken;
    struct cstream *s = enter(stream, &taken, err);
    if (!s)
        return taken ? leave(err, *err) : 0;
    s->cap->invalidated = 1;
    LOG_WARN("%s on a capturing stream: pilot cannot put it in a graph (capture invalidated)", what);
    return leave(err, cudaErrorNotSupported);
}

/* 1 if the calling thread may not make potentially unsafe calls now (CUDA's capture modes), and
 * then the captures that forbid it are invalidated. */
static int unsafe_forbidden(void)
{
    if (t_mode == cudaStreamCaptureModeRelaxed)
        return 0;
    pthread_t self = pthread_self();
    int hit = 0;
    for (struct capture *c = g_captures; c; c = c->next) {
        int mine = pthread_equal(c->thread, self);
        if ((mine && c->mode != cudaStreamCaptureModeRelaxed) ||
            (!mine && t_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal)) {
            c->invalidated = 1;
            hit = 1;
        }
    }
    return hit;
}

cudaError_t pilot_capture_check_sync(uint64_t stream, int unsafe)
{
    if (!pilot_capture_any())
        return cudaSuccess;
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = cudaSuccess;
    struct cstream *s = find_stream(stream);
    if (s) {
        s->cap->invalidated = 1;
        err = cudaErrorStreamCaptureUnsupported;
    } else if (legacy_conflict(stream)) {
        err = cudaErrorStreamCaptureImplicit;
    } else if (unsafe && unsafe_forbidden()) {
        err = cudaErrorStreamCaptureUnsupported;
    }
    pthread_mutex_unlock(&pilot_graph_lock);
    return err;
}

cudaError_t pilot_capture_check_unsafe(void)
{
    if (!pilot_capture_any())
        return cudaSuccess;
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = unsafe_forbidden() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
    pthread_mutex_unlock(&pilot_graph_lock);
    return err;
}

cudaError_t pilot_capture_check_device(int device)
{
    if (!pilot_capture_any())
        return cudaSuccess;
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = cudaSuccess;
    for (struct capture *c = g_captures; c; c = c->next)
        if (c->device == device) {
            c->invalidated = 1;
            err = cudaErrorStreamCaptureUnsupported;
        }
    pthread_mutex_unlock(&pilot_graph_lock);
    return err;
}

cudaError_t pilot_capture_check_event(cudaEvent_t event)
{
    if (!pilot_capture_any())
        return cudaSuccess;
    pthread_mutex_lock(&pilot_graph_lock);
    struct cevent *e = find_event((uintptr_t)event);
    if (e)
        e->cap->invalidated = 1; /* as CUDA does (hip-tests check it on NVIDIA) */
    pthread_mutex_unlock(&pilot_graph_lock);
    return e ? cudaErrorCapturedEvent : cudaSuccess;
}

/* ---- the capture API ---- */

static cudaError_t begin(cudaStream_t stream, struct ggraph *into, const cudaGraphNode_t *deps,
                         size_t ndeps, enum cudaStreamCaptureMode mode)
{
    uint64_t h = pilot_stream_handle(stream);
    if (!h)
        return cudaErrorStreamCaptureUnsupported; /* the legacy stream cannot capture */
    if ((unsigned)mode > cudaStreamCaptureModeRelaxed)
        return cudaErrorInvalidValue;
    unsigned flags = 0;
    cudaError_t err = cudaStreamGetFlags(stream, &flags); /* also checks the handle */
    if (err)
        return err;
    pthread_mutex_lock(&pilot_graph_lock);
    if (find_stream(h)) {
        pthread_mutex_unlock(&pilot_graph_lock);
        return cudaErrorIllegalState;
    }
    if (into && (!pilot_graph_get((cudaGraph_t)into) || into->owner)) {
        pthread_mutex_unlock(&pilot_graph_lock);
        return cudaErrorInvalidValue;
    }
    for (size_t i = 0; i < ndeps; i++) {
        struct gnode *d = pilot_node_get(deps[i]);
        if (!d || d->graph != into) {
            pthread_mutex_unlock(&pilot_graph_lock);
            return cudaErrorInvalidValue;
        }
    }
    struct capture *cap = calloc(1, sizeof *cap);
    struct ggraph *g = into ? into : pilot_graph_new();
    struct cstream *s = cap && g ? join(h, cap, (struct gnode *const *)deps, ndeps) : NULL;
    if (!s) {
        if (!into)
            pilot_graph_free(g);
        free(cap);
        pthread_mutex_unlock(&pilot_graph_lock);
        return cudaErrorMemoryAllocation;
    }
    cap->id = ++g_next_id;
    cap->graph = g;
    cap->own_graph = !into;
    cap->origin = h;
    cap->mode = mode;
    cap->thread = pthread_self();
    cap->device = pilot_handle_device(h);
    cap->blocking = !(flags & cudaStreamNonBlocking);
    cap->next = g_captures;
    g_captures = cap;
    __atomic_add_fetch(&g_active, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&pilot_graph_lock);
    return cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(begin(stream, NULL, NULL, 0, mode));
}

PILOT_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                     enum cudaStreamCaptureMode mode)
{
    return cudaStreamBeginCapture(stream ? stream : cudaStreamPerThread, mode);
}

PILOT_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                       const cudaGraphNode_t *dependencies,
                                                       const cudaGraphEdgeData *dependencyData,
                                                       size_t numDependencies,
                                                       enum cudaStreamCaptureMode mode)
{
    PILOT_REQUIRE_SESSION();
    if (!graph || (numDependencies && !dependencies))
        PILOT_RETURN(cudaErrorInvalidValue);
    static const cudaGraphEdgeData zero;
    for (size_t i = 0; dependencyData && i < numDependencies; i++)
        if (memcmp(&dependencyData[i], &zero, sizeof zero))
            PILOT_RETURN(cudaErrorNotSupported); /* programmatic edges */
    PILOT_RETURN(begin(stream, (struct ggraph *)graph, dependencies, numDependencies, mode));
}

PILOT_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                            const cudaGraphNode_t *dependencies,
                                                            const cudaGraphEdgeData *dependencyData,
                                                            size_t numDependencies,
                                                            enum cudaStreamCaptureMode mode)
{
    return cudaStreamBeginCaptureToGraph(stream ? stream : cudaStreamPerThread, graph, dependencies,
                                         dependencyData, numDependencies, mode);
}

/* 1 if every stream that joined the capture was joined back into the origin stream. */
static int joined(struct capture *cap, struct cstream *origin)
{
    uint64_t mark;
    if (!pilot_graph_mark_ancestors(origin->deps, origin->n, &mark))
        return 1; /* out of memory: the graph is returned unchecked */
    for (struct cstream *s = g_streams; s; s = s->next)
        if (s->cap == cap && s != origin)
            for (size_t i = 0; i < s->n; i++)
                if (s->deps[i]->mark != mark)
                    return 0;
    return 1;
}

static cudaError_t end(cudaStream_t stream, cudaGraph_t *pGraph)
{
    uint64_t h = pilot_stream_handle(stream);
    if (!pGraph)
        return cudaErrorInvalidValue;
    pthread_mutex_lock(&pilot_graph_lock);
    struct cstream *s = find_stream(h);
    cudaError_t err = cudaSuccess;
    if (!s) {
        err = cudaErrorIllegalState;
    } else if (s->cap->origin != h) {
        s->cap->invalidated = 1;
        err = cudaErrorStreamCaptureUnmatched;
    } else if (s->cap->mode != cudaStreamCaptureModeRelaxed &&
               !pthread_equal(s->cap->thread, pthread_self())) {
        err = cudaErrorStreamCaptureWrongThread;
    } else {
        struct capture *cap = s->cap;
        if (cap->invalidated)
            err = cudaErrorStreamCaptureInvalidated;
        else if (!joined(cap, s))
            err = cudaErrorStreamCaptureUnjoined;
        *pGraph = err ? NULL : (cudaGraph_t)cap->graph;
        end_capture(cap, err != cudaSuccess);
    }
    pthread_mutex_unlock(&pilot_graph_lock);
    return err;
}

PILOT_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    PILOT_REQUIRE_SESSION();
    cudaError_t err = end(stream, pGraph);
    pilot_hooks_graph_memory_released(); /* a failed capture's graph allocations */
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
    return cudaStreamEndCapture(stream ? stream : cudaStreamPerThread, pGraph);
}

/* A stream's capture state: *s its entry (NULL: not capturing); cudaErrorStreamCaptureImplicit
 * for the legacy stream while a blocking stream of the device captures. Under the lock. */
static cudaError_t state(cudaStream_t stream, struct cstream **s)
{
    uint64_t h = pilot_stream_handle(stream);
    *s = find_stream(h);
    if (!h) {
        int dev = pilot_current_device();
        for (struct capture *c = g_captures; c; c = c->next)
            if (c->blocking && c->device == dev)
                return cudaErrorStreamCaptureImplicit; /* the capture is not invalidated */
    }
    return cudaSuccess;
}

static enum cudaStreamCaptureStatus status_of(const struct cstream *s)
{
    if (!s)
        return cudaStreamCaptureStatusNone;
    return s->cap->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
}

PILOT_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                               enum cudaStreamCaptureStatus *pCaptureStatus)
{
    PILOT_REQUIRE_SESSION();
    if (!pCaptureStatus)
        PILOT_RETURN(cudaErrorInvalidValue);
    pthread_mutex_lock(&pilot_graph_lock);
    struct cstream *s;
    cudaError_t err = state(stream, &s);
    if (err == cudaSuccess)
        *pCaptureStatus = status_of(s);
    pthread_mutex_unlock(&pilot_graph_lock);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                                    enum cudaStreamCaptureStatus *pCaptureStatus)
{
    return cudaStreamIsCapturing(stream ? stream : cudaStreamPerThread, pCaptureStatus);
}

PILOT_EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                  enum cudaStreamCaptureStatus *captureStatus_out,
                                                  unsigned long long *id_out, cudaGraph_t *graph_out,
                                                  const cudaGraphNode_t **dependencies_out,
                                                  const cudaGraphEdgeData **edgeData_out,
                                                  size_t *numDependencies_out)
{
    PILOT_REQUIRE_SESSION();
    if (!captureStatus_out || (edgeData_out && !dependencies_out))
        PILOT_RETURN(cudaErrorInvalidValue);
    pthread_mutex_lock(&pilot_graph_lock);
    struct cstream *s;
    cudaError_t err = state(stream, &s);
    if (err == cudaSuccess) {
        *captureStatus_out = status_of(s);
        int active = *captureStatus_out == cudaStreamCaptureStatusActive;
        if (active && edgeData_out && s->cap_edges < s->n) {
            cudaGraphEdgeData *e = calloc(s->n, sizeof *e);
            if (e) {
                free(s->edges);
                s->edges = e;
                s->cap_edges = s->n;
            }
        }
        /* the other outputs mean something only while capturing; cleared otherwise */
        if (id_out)
            *id_out = active ? s->cap->id : 0;
        if (graph_out)
            *graph_out = active ? (cudaGraph_t)s->cap->graph : NULL;
        if (dependencies_out)
            *dependencies_out = active ? (const cudaGraphNode_t *)s->deps : NULL;
        if (edgeData_out)
            *edgeData_out = active ? s->edges : NULL;
        if (numDependencies_out)
            *numDependencies_out = active ? s->n : 0;
    }
    pthread_mutex_unlock(&pilot_graph_lock);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamGetCaptureInfo_ptsz(
    cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out, unsigned long long *id_out,
    cudaGraph_t *graph_out, const cudaGraphNode_t **dependencies_out,
    const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    return cudaStreamGetCaptureInfo(stream ? stream : cudaStreamPerThread, captureStatus_out, id_out,
                                    graph_out, dependencies_out, edgeData_out, numDependencies_out);
}

static cudaError_t update_deps(cudaStream_t stream, cudaGraphNode_t *deps,
                               const cudaGraphEdgeData *data, size_t n, unsigned flags)
{
    if (flags > cudaStreamSetCaptureDependencies || (n && !deps))
        return cudaErrorInvalidValue;
    static const cudaGraphEdgeData zero;
    for (size_t i = 0; data && i < n; i++)
        if (memcmp(&data[i], &zero, sizeof zero))
            return cudaErrorNotSupported;
    struct cstream *s = find_stream(pilot_stream_handle(stream));
    if (!s || s->cap->invalidated)
        return cudaErrorIllegalState;
    for (size_t i = 0; i < n; i++) {
        struct gnode *d = pilot_node_get(deps[i]);
        if (!d || d->graph != s->cap->graph)
            return cudaErrorInvalidValue;
    }
    int rc = flags == cudaStreamSetCaptureDependencies
                 ? set_deps(s, (struct gnode *const *)deps, n)
                 : merge_deps(s, (struct gnode *const *)deps, n);
    return rc ? cudaErrorMemoryAllocation : cudaSuccess;
}

PILOT_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream,
                                                             cudaGraphNode_t *dependencies,
                                                             const cudaGraphEdgeData *dependencyData,
                                                             size_t numDependencies,
                                                             unsigned int flags)
{
    PILOT_REQUIRE_SESSION();
    pthread_mutex_lock(&pilot_graph_lock);
    cudaError_t err = update_deps(stream, dependencies, dependencyData, numDependencies, flags);
    pthread_mutex_unlock(&pilot_graph_lock);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamUpdateCaptureDependencies_ptsz(
    cudaStream_t stream, cudaGraphNode_t *dependencies, const cudaGraphEdgeData *dependencyData,
    size_t numDependencies, unsigned int flags)
{
    return cudaStreamUpdateCaptureDependencies(stream ? stream : cudaStreamPerThread, dependencies,
                                               dependencyData, numDependencies, flags);
}

PILOT_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    if (!mode || (unsigned)*mode > cudaStreamCaptureModeRelaxed)
        PILOT_RETURN(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode previous = t_mode;
    t_mode = *mode;
    *mode = previous;
    return cudaSuccess;
}

/* After fork the child has none of the parent's captures (its streams are not the child's). */
static void fork_child(void)
{
    pthread_mutex_init(&pilot_graph_lock, NULL);
    while (g_captures)
        end_capture(g_captures, 1);
    pilot_gmem_forget(); /* graph memory is the parent's session's */
}

PILOT_HOOK(graph_capture, .on_fork_child = fork_child);
