// graph_mem: CUDA graph memory nodes (allocation and free nodes), built explicitly and by
// capturing cudaMallocAsync / cudaFreeAsync, and the rules CUDA gives them:
//   - a graph that allocates, uses and frees two buffers, launched three times on new input;
//   - an allocation the graph does not free: used by stream work after the launch, a relaunch
//     while it is still allocated, freed by cudaFree, cudaFreeAsync and a free node of another
//     graph; cudaGraphInstantiateFlagAutoFreeOnLaunch;
//   - the same pipeline captured from a stream, and an allocation captured without its free;
//   - what a graph with memory nodes may not do (clone, child graph, node or edge removal, a
//     second executable graph, update), bad parameters, and the device's graph memory counters.
// Prints only exact values and error names (identical natively and under pilot).
// `graph_mem moved`: memory nodes in a child graph moved into its parent (not yet run natively).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "graph_kernels.cuh"

#define N 4096
#define THREADS 256
#define BYTES (N * sizeof(int))

static int h_in[N], h_out[N];

static long long sum(const int *x)
{
    long long s = 0;
    for (int i = 0; i < N; i++)
        s += x[i];
    return s;
}

static void input(int k)
{
    for (int i = 0; i < N; i++)
        h_in[i] = i * k + 7;
}

// launch e on input(k) and print what the pipeline wrote to h_out
static void launch_on_input(cudaGraphExec_t e, cudaStream_t s, const char *what, int k)
{
    input(k);
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaStreamSynchronize(s));
    printf("%s launch %d sum %lld first %d last %d\n", what, k, sum(h_out), h_out[0], h_out[N - 1]);
}

static cudaMemAllocNodeParams alloc_params(int device, size_t bytes)
{
    cudaMemAllocNodeParams p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = device;
    p.bytesize = bytes;
    return p;
}

static cudaKernelNodeParams kernel(void *func, void **args)
{
    cudaKernelNodeParams k = {};
    k.func = func;
    k.gridDim = dim3(N / THREADS);
    k.blockDim = dim3(THREADS);
    k.kernelParams = args;
    return k;
}

static cudaMemsetParams memset32(void *dst, unsigned value)
{
    cudaMemsetParams m = {};
    m.dst = dst;
    m.value = value;
    m.elementSize = 4;
    m.width = N;
    m.height = 1;
    return m;
}

// a -> h2d -> b -> memset(b) -> b += a -> free(a) -> b = 3b + 1 -> d2h -> free(b)
static cudaGraph_t explicit_graph(int device, cudaGraphNode_t *alloc_a, cudaGraphNode_t *free_a,
                                  void **a_ptr)
{
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams p = alloc_params(device, BYTES);
    CHECK(cudaGraphAddMemAllocNode(alloc_a, g, NULL, 0, &p));
    int *a = (int *)p.dptr;
    *a_ptr = a;
    cudaGraphNode_t h2d, alloc_b, set_b, add, free_node_a, axpb, d2h, free_b;
    CHECK(cudaGraphAddMemcpyNode1D(&h2d, g, alloc_a, 1, a, h_in, BYTES, cudaMemcpyHostToDevice));
    p = alloc_params(device, BYTES);
    CHECK(cudaGraphAddMemAllocNode(&alloc_b, g, &h2d, 1, &p));
    int *b = (int *)p.dptr;
    cudaMemsetParams m = memset32(b, 0);
    CHECK(cudaGraphAddMemsetNode(&set_b, g, &alloc_b, 1, &m));
    int n = N;
    void *add_args[] = {&b, &a, &n};
    cudaKernelNodeParams k = kernel((void *)graph_add, add_args);
    CHECK(cudaGraphAddKernelNode(&add, g, &set_b, 1, &k));
    CHECK(cudaGraphAddMemFreeNode(&free_node_a, g, &add, 1, a));
    *free_a = free_node_a;
    int mul = 3, plus = 1;
    void *axpb_args[] = {&b, &n, &mul, &plus};
    k = kernel((void *)graph_axpb, axpb_args);
    CHECK(cudaGraphAddKernelNode(&axpb, g, &add, 1, &k));
    CHECK(cudaGraphAddMemcpyNode1D(&d2h, g, &axpb, 1, h_out, b, BYTES, cudaMemcpyDeviceToHost));
    CHECK(cudaGraphAddMemFreeNode(&free_b, g, &d2h, 1, b));
    // c, ordered after a's free, may have a's memory again; e, ordered with nothing, may not
    cudaGraphNode_t alloc_c, set_c, free_c, alloc_e, free_e;
    p = alloc_params(device, BYTES / 2);
    CHECK(cudaGraphAddMemAllocNode(&alloc_c, g, &free_node_a, 1, &p));
    void *c = p.dptr;
    m = memset32(c, 1);
    m.width = N / 2;
    CHECK(cudaGraphAddMemsetNode(&set_c, g, &alloc_c, 1, &m));
    CHECK(cudaGraphAddMemFreeNode(&free_c, g, &set_c, 1, c));
    p = alloc_params(device, BYTES);
    CHECK(cudaGraphAddMemAllocNode(&alloc_e, g, NULL, 0, &p));
    CHECK(cudaGraphAddMemFreeNode(&free_e, g, &alloc_e, 1, p.dptr));
    cudaMemAllocNodeParams got;
    CHECK(cudaGraphMemAllocNodeGetParams(alloc_c, &got));
    printf("reuse after_free %d unordered_distinct %d bytes %zu\n", c == a, p.dptr != a && p.dptr != c,
           got.bytesize);
    return g;
}

// one allocation the graph fills with `value` and does not free
static cudaGraph_t escaping_graph(int device, int **out, unsigned value)
{
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams p = alloc_params(device, BYTES);
    cudaGraphNode_t alloc, set;
    CHECK(cudaGraphAddMemAllocNode(&alloc, g, NULL, 0, &p));
    *out = (int *)p.dptr;
    cudaMemsetParams m = memset32(p.dptr, value);
    CHECK(cudaGraphAddMemsetNode(&set, g, &alloc, 1, &m));
    return g;
}

static int read_first(const int *d, cudaStream_t s)
{
    int v = -1;
    CHECK(cudaMemcpyAsync(&v, d, sizeof v, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    return v;
}

static void count_types(cudaGraph_t g, const char *what)
{
    size_t n = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &n));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(n * sizeof *nodes);
    CHECK(cudaGraphGetNodes(g, nodes, &n));
    int allocs = 0, frees = 0, kernels = 0, copies = 0, sets = 0;
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(nodes[i], &t));
        allocs += t == cudaGraphNodeTypeMemAlloc;
        frees += t == cudaGraphNodeTypeMemFree;
        kernels += t == cudaGraphNodeTypeKernel;
        copies += t == cudaGraphNodeTypeMemcpy;
        sets += t == cudaGraphNodeTypeMemset;
    }
    printf("%s nodes %zu alloc %d free %d kernel %d memcpy %d memset %d\n", what, n, allocs, frees,
           kernels, copies, sets);
    free(nodes);
}

// `graph_mem moved`: memory nodes in a child graph moved into its parent
// (cudaGraphChildGraphOwnershipMove, the one way CUDA lets them into a child graph).
static int moved(int device)
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t child, parent;
    CHECK(cudaGraphCreate(&child, 0));
    cudaMemAllocNodeParams p = alloc_params(device, BYTES);
    cudaGraphNode_t alloc, set, d2h, freed, node;
    CHECK(cudaGraphAddMemAllocNode(&alloc, child, NULL, 0, &p));
    cudaMemsetParams m = memset32(p.dptr, 7);
    CHECK(cudaGraphAddMemsetNode(&set, child, &alloc, 1, &m));
    CHECK(cudaGraphAddMemcpyNode1D(&d2h, child, &set, 1, h_out, p.dptr, BYTES, cudaMemcpyDeviceToHost));
    CHECK(cudaGraphAddMemFreeNode(&freed, child, &d2h, 1, p.dptr));
    CHECK(cudaGraphCreate(&parent, 0));
    cudaGraphNodeParams np = {};
    np.type = cudaGraphNodeTypeGraph;
    np.graph.graph = child;
    np.graph.ownership = cudaGraphChildGraphOwnershipMove;
    CHECK(cudaGraphAddNode(&node, parent, NULL, NULL, 0, &np));
    cudaGraphExec_t e, second = NULL;
    CHECK(cudaGraphInstantiate(&e, parent, 0));
    for (int k = 1; k <= 2; k++) {
        memset(h_out, 0, sizeof h_out);
        CHECK(cudaGraphLaunch(e, s));
        CHECK(cudaStreamSynchronize(s));
        printf("moved launch %d sum %lld\n", k, sum(h_out));
    }
    cudaGraph_t clone = NULL;
    printf("moved instantiate_twice %s clone %s\n", name(cudaGraphInstantiate(&second, parent, 0)),
           name(cudaGraphClone(&clone, parent)));
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(parent));
    unsigned long long used = 1;
    CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent, &used));
    printf("moved after_cleanup used %llu\n", used);
    CHECK(cudaStreamDestroy(s));
    return 0;
}

int main(int argc, char **argv)
{
    int device = 0;
    CHECK(cudaSetDevice(device));
    if (argc > 1 && strcmp(argv[1], "moved") == 0)
        return moved(device);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int n = N;

    // ---- an explicit graph that allocates, uses and frees ----
    cudaGraphNode_t alloc_a, free_a;
    void *a = NULL;
    cudaGraph_t g = explicit_graph(device, &alloc_a, &free_a, &a);
    cudaMemAllocNodeParams got;
    CHECK(cudaGraphMemAllocNodeGetParams(alloc_a, &got));
    void *freed = NULL;
    CHECK(cudaGraphMemFreeNodeGetParams(free_a, &freed));
    cudaGraphNodeType ta, tf;
    CHECK(cudaGraphNodeGetType(alloc_a, &ta));
    CHECK(cudaGraphNodeGetType(free_a, &tf));
    printf("explicit type_alloc %d type_free %d bytes %zu same_ptr %d free_ptr %d device %d\n", (int)ta,
           (int)tf, got.bytesize, got.dptr == a, freed == a, got.poolProps.location.id);
    printf("getparams_wrong_type %s %s\n", name(cudaGraphMemAllocNodeGetParams(free_a, &got)),
           name(cudaGraphMemFreeNodeGetParams(alloc_a, &freed)));
    count_types(g, "explicit");
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int k = 1; k <= 3; k++)
        launch_on_input(e, s, "explicit", k);

    // ---- what a graph with memory nodes may not do ----
    cudaGraph_t clone = NULL;
    printf("clone %s\n", name(cudaGraphClone(&clone, g)));
    cudaGraph_t parent;
    CHECK(cudaGraphCreate(&parent, 0));
    cudaGraphNode_t child;
    printf("child %s\n", name(cudaGraphAddChildGraphNode(&child, parent, NULL, 0, g)));
    cudaGraphExec_t second = NULL;
    printf("instantiate_twice %s\n", name(cudaGraphInstantiate(&second, g, 0)));
    cudaGraphExecUpdateResultInfo info;
    cudaError_t up = cudaGraphExecUpdate(e, g, &info);
    printf("update %s result %d\n", name(up), (int)info.result);
    printf("remove_edge %s\n", name(cudaGraphRemoveDependencies(g, &alloc_a, &free_a, NULL, 1)));
    printf("destroy_node %s\n", name(cudaGraphDestroyNode(free_a)));
    cudaGraphNode_t bad;
    int not_graph_memory;
    printf("free_unknown %s\n", name(cudaGraphAddMemFreeNode(&bad, g, NULL, 0, &not_graph_memory)));
    printf("free_twice %s\n", name(cudaGraphAddMemFreeNode(&bad, g, NULL, 0, a)));
    cudaMemAllocNodeParams p = alloc_params(device, 0);
    printf("alloc_zero %s\n", name(cudaGraphAddMemAllocNode(&bad, parent, NULL, 0, &p)));
    p = alloc_params(99, BYTES);
    printf("alloc_bad_device %s\n", name(cudaGraphAddMemAllocNode(&bad, parent, NULL, 0, &p)));
    p = alloc_params(device, BYTES);
    p.poolProps.location.type = cudaMemLocationTypeHost;
    printf("alloc_host %s\n", name(cudaGraphAddMemAllocNode(&bad, parent, NULL, 0, &p)));
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphInstantiate(&e, parent, 0)); // nothing was added to it
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(parent));

    // ---- an allocation the graph does not free ----
    int *c;
    g = escaping_graph(device, &c, 5);
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaGraphLaunch(e, s));
    int mul = 2, plus = 1;
    graph_axpb<<<N / THREADS, THREADS, 0, s>>>(c, n, mul, plus); // stream work after the launch
    printf("escape outside %d\n", read_first(c, s));
    printf("relaunch_live %s\n", name(cudaGraphLaunch(e, s)));
    CHECK(cudaStreamSynchronize(s));
    printf("user_free %s\n", name(cudaFree(c)));
    printf("double_free %s\n", name(cudaFree(c)));
    cudaError_t relaunched = cudaGraphLaunch(e, s);
    printf("relaunch_after_free %s value %d\n", name(relaunched), read_first(c, s));
    printf("free_async %s\n", name(cudaFreeAsync(c, s)));
    CHECK(cudaStreamSynchronize(s));
    cudaGraph_t fg;
    CHECK(cudaGraphCreate(&fg, 0));
    cudaGraphNode_t fnode;
    printf("free_graph add %s\n", name(cudaGraphAddMemFreeNode(&fnode, fg, NULL, 0, c)));
    cudaGraphExec_t fe;
    CHECK(cudaGraphInstantiate(&fe, fg, 0));
    CHECK(cudaGraphDestroy(fg));
    CHECK(cudaGraphLaunch(e, s));
    printf("free_graph launch %s\n", name(cudaGraphLaunch(fe, s)));
    CHECK(cudaStreamSynchronize(s));
    printf("relaunch_after_free_graph %s\n", name(cudaGraphLaunch(e, s)));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
    printf("free_after_destroy %s\n", name(cudaFree(c))); // still allocated: the last launch's
    CHECK(cudaGraphExecDestroy(fe));

    // ---- cudaGraphInstantiateFlagAutoFreeOnLaunch ----
    int *d;
    g = escaping_graph(device, &d, 9);
    CHECK(cudaGraphInstantiateWithFlags(&e, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    cudaError_t l1 = cudaGraphLaunch(e, s);
    cudaError_t l2 = cudaGraphLaunch(e, s);
    printf("autofree launch %s %s value %d\n", name(l1), name(l2), read_first(d, s));
    printf("autofree user_free %s\n", name(cudaFree(d)));
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));

    // ---- captured from a stream: the same pipeline with cudaMallocAsync / cudaFreeAsync ----
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int *tmp = NULL, *out = NULL;
    CHECK(cudaMallocAsync((void **)&tmp, BYTES, s));
    CHECK(cudaMemcpyAsync(tmp, h_in, BYTES, cudaMemcpyHostToDevice, s));
    CHECK(cudaMallocAsync((void **)&out, BYTES, s));
    CHECK(cudaMemsetAsync(out, 0, BYTES, s));
    graph_add<<<N / THREADS, THREADS, 0, s>>>(out, tmp, n);
    CHECK(cudaFreeAsync(tmp, s));
    int *again = NULL; // after tmp's free in stream order: may have tmp's memory again
    CHECK(cudaMallocAsync((void **)&again, BYTES / 4, s));
    CHECK(cudaMemsetAsync(again, 0, BYTES / 4, s));
    CHECK(cudaFreeAsync(again, s));
    mul = 5;
    plus = -3;
    graph_axpb<<<N / THREADS, THREADS, 0, s>>>(out, n, mul, plus);
    CHECK(cudaMemcpyAsync(h_out, out, BYTES, cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(out, s));
    CHECK(cudaStreamEndCapture(s, &g));
    printf("captured distinct %d reuse %d\n", tmp != out && tmp && out, again == tmp);
    count_types(g, "captured");
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int k = 4; k <= 5; k++)
        launch_on_input(e, s, "captured", k);
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));

    // an allocation captured without its free: the program frees it after the launch
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int *kept = NULL;
    CHECK(cudaMallocAsync((void **)&kept, BYTES, s));
    CHECK(cudaMemsetAsync(kept, 3, BYTES, s));
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaGraphLaunch(e, s));
    printf("captured_kept value %d\n", read_first(kept, s));
    printf("captured_kept free %s\n", name(cudaFree(kept)));
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));

    // ---- the device's graph memory counters ----
    unsigned long long used = 1, reserved = 1, high = 0, zero = 0, one = 1;
    CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &high));
    printf("mem high_at_least_two_buffers %d\n", high >= 2 * BYTES);
    printf("mem reset_high %s\n", name(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &zero)));
    printf("mem set_high_nonzero %s\n", name(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &one)));
    printf("mem set_current %s\n", name(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent, &zero)));
    printf("mem trim %s bad_device %s\n", name(cudaDeviceGraphMemTrim(device)), name(cudaDeviceGraphMemTrim(99)));
    CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent, &used));
    CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrReservedMemCurrent, &reserved));
    printf("mem after_cleanup used %llu reserved %llu\n", used, reserved);
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
