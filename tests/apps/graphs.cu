// graphs: CUDA graphs, built explicitly and by stream capture, instantiated, launched, updated.
//
//   - an explicit graph: memset (a 32-bit value), memcpy H2D, two kernels, a child graph (a copy
//     to a __device__ table, then a kernel reading it), memcpy D2H, a host node, an empty node;
//     its structure (nodes, roots, edges, types), three launches, then exec-side updates
//     (kernel and memset parameters, a disabled node), cudaGraphExecUpdate from an edited clone
//     and from a graph of another topology;
//   - a capture of a loop of order-dependent kernels on one stream, and its capture info;
//   - a fork/join capture over two streams with events (the simpleCudaGraphs pattern), launched
//     on the other stream; a captured graph launch (a child graph node); an unjoined fork;
//   - what CUDA forbids during a capture and the errors it gives; a relaxed-mode capture;
//   - cudaGraphAddNode and the generic set calls, a child graph moved into its parent;
//   - NULL handles; stream attributes.
// Prints only exact values and error names (identical natively and under pilot).
// `graphs garbage` (pilot only: natively these would crash) passes destroyed and made-up handles.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include <cuda_runtime.h>

#include "graph_kernels.cuh"

#define N 1024
#define TABLE 16
#define THREADS 256

__device__ int g_table[TABLE];

__global__ void graph_table(int *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += g_table[i % TABLE];
}

static unsigned fnv(const int *x, int n)
{
    unsigned h = 2166136261u;
    for (int i = 0; i < n; i++)
        h = (h ^ (unsigned)x[i]) * 16777619u;
    return h;
}

static void show(const char *what, const int *x)
{
    printf("%s %08x %d %d\n", what, fnv(x, N), x[0], x[N - 1]);
}

struct record {
    const int *data;
    int calls;
    long long sum;
};

static void CUDART_CB host_record(void *p)
{
    record *r = (record *)p;
    long long s = 0;
    for (int i = 0; i < N; i++)
        s += r->data[i];
    r->calls++;
    r->sum = s;
}

static size_t count_nodes(cudaGraph_t g)
{
    size_t n = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &n));
    return n;
}

static void structure(const char *what, cudaGraph_t g)
{
    size_t nodes = 0, roots = 0, edges = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &nodes));
    CHECK(cudaGraphGetRootNodes(g, NULL, &roots));
    CHECK(cudaGraphGetEdges(g, NULL, NULL, NULL, &edges));
    printf("%s nodes %zu roots %zu edges %zu\n", what, nodes, roots, edges);
}

static cudaKernelNodeParams axpb_params(int **x, int *n, int *mul, int *add, void **args)
{
    args[0] = x;
    args[1] = n;
    args[2] = mul;
    args[3] = add;
    cudaKernelNodeParams p = {};
    p.func = (void *)graph_axpb;
    p.gridDim = dim3(N / THREADS);
    p.blockDim = dim3(THREADS);
    p.sharedMemBytes = 0;
    p.kernelParams = args;
    return p;
}

static int *h_in, *h_out, *h_out2, *h_out3, *h_table;
static int *d_a, *d_b, *d_c, *d_x, *d_y;
static cudaStream_t s1, s2;

static void explicit_graph()
{
    record rec = {h_out, 0, 0};
    cudaGraph_t g, child;
    CHECK(cudaGraphCreate(&g, 0));
    CHECK(cudaGraphCreate(&child, 0));

    cudaGraphNode_t nset, ncpy, nk1, nk2, nchild, nout, nhost, nend, csym, ck;
    cudaMemsetParams ms = {};
    ms.dst = d_b;
    ms.value = 7;
    ms.elementSize = 4;
    ms.width = N;
    ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&nset, g, NULL, 0, &ms));

    cudaMemcpy3DParms cp = {};
    cp.srcPtr = make_cudaPitchedPtr(h_in, N * sizeof(int), N, 1);
    cp.dstPtr = make_cudaPitchedPtr(d_a, N * sizeof(int), N, 1);
    cp.extent = make_cudaExtent(N * sizeof(int), 1, 1);
    cp.kind = cudaMemcpyHostToDevice;
    CHECK(cudaGraphAddMemcpyNode(&ncpy, g, NULL, 0, &cp));

    int n = N, mul = 3, add = 5;
    void *args[4];
    cudaKernelNodeParams kp = axpb_params(&d_a, &n, &mul, &add, args);
    CHECK(cudaGraphAddKernelNode(&nk1, g, &ncpy, 1, &kp));
    mul = 1000; // the node keeps the values it was given
    add = 1000;

    void *add_args[3] = {&d_a, &d_b, &n};
    cudaKernelNodeParams ap = {};
    ap.func = (void *)graph_add;
    ap.gridDim = dim3(N / THREADS);
    ap.blockDim = dim3(THREADS);
    ap.kernelParams = add_args;
    cudaGraphNode_t k2deps[2] = {nk1, nset};
    CHECK(cudaGraphAddKernelNode(&nk2, g, k2deps, 2, &ap));

    CHECK(cudaGraphAddMemcpyNodeToSymbol(&csym, child, NULL, 0, g_table, h_table,
                                         TABLE * sizeof(int), 0, cudaMemcpyHostToDevice));
    void *table_args[2] = {&d_a, &n};
    cudaKernelNodeParams tp = {};
    tp.func = (void *)graph_table;
    tp.gridDim = dim3(N / THREADS);
    tp.blockDim = dim3(THREADS);
    tp.kernelParams = table_args;
    CHECK(cudaGraphAddKernelNode(&ck, child, &csym, 1, &tp));
    CHECK(cudaGraphAddChildGraphNode(&nchild, g, &nk2, 1, child));
    CHECK(cudaGraphDestroy(child)); // the node holds its own copy

    CHECK(cudaGraphAddMemcpyNode1D(&nout, g, &nchild, 1, h_out, d_a, N * sizeof(int),
                                   cudaMemcpyDeviceToHost));
    cudaHostNodeParams hp = {host_record, &rec};
    CHECK(cudaGraphAddHostNode(&nhost, g, &nout, 1, &hp));
    CHECK(cudaGraphAddEmptyNode(&nend, g, &nhost, 1));

    structure("explicit", g);
    cudaGraphNode_t all[8] = {nset, ncpy, nk1, nk2, nchild, nout, nhost, nend};
    printf("types");
    for (int i = 0; i < 8; i++) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(all[i], &t));
        printf(" %d", (int)t);
    }
    printf("\n");
    size_t ndeps = 0, nouts = 0;
    CHECK(cudaGraphNodeGetDependencies(nk2, NULL, NULL, &ndeps));
    CHECK(cudaGraphNodeGetDependentNodes(nk2, NULL, NULL, &nouts));
    cudaGraphNode_t dep_list[2] = {};
    CHECK(cudaGraphNodeGetDependencies(nk2, dep_list, NULL, &ndeps));
    int found = (dep_list[0] == nk1 || dep_list[1] == nk1) && (dep_list[0] == nset || dep_list[1] == nset);
    cudaGraph_t inner;
    CHECK(cudaGraphChildGraphNodeGetGraph(nchild, &inner));
    printf("deps %zu dependents %zu found %d child_nodes %zu\n", ndeps, nouts, found,
           count_nodes(inner));

    cudaGraphExec_t exec;
    cudaGraphInstantiateParams ip = {};
    ip.flags = 0;
    CHECK(cudaGraphInstantiateWithParams(&exec, g, &ip));
    unsigned long long flags = 1;
    CHECK(cudaGraphExecGetFlags(exec, &flags));
    printf("instantiate result %d flags %llu\n", (int)ip.result_out, flags);
    CHECK(cudaGraphUpload(exec, s1));
    for (int i = 0; i < 3; i++)
        CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    show("launch3", h_out);
    printf("host calls %d sum %lld\n", rec.calls, rec.sum);

    // exec-side updates: the graph keeps its own parameters
    int mul2 = 5, add2 = -2;
    void *args2[4];
    cudaKernelNodeParams kp2 = axpb_params(&d_a, &n, &mul2, &add2, args2);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, nk1, &kp2));
    cudaMemsetParams ms2 = ms;
    ms2.value = 0x00010002; // bytes differ: not a byte memset
    CHECK(cudaGraphExecMemsetNodeSetParams(exec, nset, &ms2));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    show("exec_set", h_out);
    cudaKernelNodeParams got = {};
    CHECK(cudaGraphKernelNodeGetParams(nk1, &got));
    cudaMemsetParams got_ms = {};
    CHECK(cudaGraphMemsetNodeGetParams(nset, &got_ms));
    printf("graph keeps mul %d add %d grid %u memset %u elem %u\n", *(int *)got.kernelParams[2],
           *(int *)got.kernelParams[3], got.gridDim.x, got_ms.value, got_ms.elementSize);

    unsigned enabled = 7;
    CHECK(cudaGraphNodeSetEnabled(exec, nk2, 0));
    CHECK(cudaGraphNodeGetEnabled(exec, nk2, &enabled));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("enabled %u\n", enabled);
    show("disabled", h_out);
    CHECK(cudaGraphNodeSetEnabled(exec, nk2, 1));

    // cudaGraphExecUpdate from an edited clone
    cudaGraph_t clone;
    CHECK(cudaGraphClone(&clone, g));
    cudaGraphNode_t ck1, cset;
    CHECK(cudaGraphNodeFindInClone(&ck1, nk1, clone));
    CHECK(cudaGraphNodeFindInClone(&cset, nset, clone));
    int mul3 = 2, add3 = 1;
    void *args3[4];
    cudaKernelNodeParams kp3 = axpb_params(&d_a, &n, &mul3, &add3, args3);
    CHECK(cudaGraphKernelNodeSetParams(ck1, &kp3));
    cudaMemsetParams ms3 = ms;
    ms3.value = 3;
    CHECK(cudaGraphMemsetNodeSetParams(cset, &ms3));
    cudaGraphExecUpdateResultInfo info = {};
    cudaError_t e = cudaGraphExecUpdate(exec, clone, &info);
    printf("update %s result %d\n", name(e), (int)info.result);
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    show("updated", h_out);

    cudaGraph_t other;
    CHECK(cudaGraphCreate(&other, 0));
    cudaGraphNode_t lone;
    CHECK(cudaGraphAddEmptyNode(&lone, other, NULL, 0));
    e = cudaGraphExecUpdate(exec, other, &info);
    printf("update_other %s result %d\n", name(e), (int)info.result);
    (void)cudaGetLastError();
    printf("host calls %d\n", rec.calls);

    char path[64];
    snprintf(path, sizeof path, "/tmp/pilot-graphs-%d.dot", (int)getpid());
    CHECK(cudaGraphDebugDotPrint(g, path, cudaGraphDebugDotFlagsVerbose));
    FILE *f = fopen(path, "r");
    char head[64] = {};
    if (f) {
        if (!fgets(head, sizeof head, f))
            head[0] = 0;
        fclose(f);
    }
    unlink(path);
    printf("dot %d\n", strncmp(head, "digraph", 7) == 0);

    // removing and adding edges, destroying a node
    CHECK(cudaGraphRemoveDependencies(g, &nhost, &nend, NULL, 1));
    size_t edges = 0;
    CHECK(cudaGraphGetEdges(g, NULL, NULL, NULL, &edges));
    e = cudaGraphRemoveDependencies(g, &nhost, &nend, NULL, 1);
    printf("remove_edge edges %zu again %s\n", edges, name(e));
    (void)cudaGetLastError();
    CHECK(cudaGraphAddDependencies(g, &nhost, &nend, NULL, 1));
    CHECK(cudaGraphDestroyNode(nend));
    structure("after_destroy", g);

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(clone));
    CHECK(cudaGraphDestroy(other));
    CHECK(cudaGraphDestroy(g));
}

static void capture_loop()
{
    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    cudaGraph_t g = NULL, during = NULL;
    const cudaGraphNode_t *deps = NULL;
    size_t ndeps = 99;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaStreamIsCapturing(s1, &st));
    CHECK(cudaStreamGetCaptureInfo(s1, &st, &id, &during, &deps, NULL, &ndeps));
    printf("capture status %d id %d graph %d deps %zu\n", (int)st, id != 0, during != NULL, ndeps);
    CHECK(cudaMemcpyAsync(d_c, h_in, N * sizeof(int), cudaMemcpyHostToDevice, s1));
    CHECK(cudaStreamGetCaptureInfo(s1, &st, NULL, NULL, &deps, NULL, &ndeps));
    cudaGraphNodeType t = cudaGraphNodeTypeCount;
    if (ndeps == 1)
        CHECK(cudaGraphNodeGetType(deps[0], &t));
    printf("after_copy deps %zu type %d\n", ndeps, (int)t);
    for (int k = 0; k < 20; k++)
        graph_axpb<<<N / THREADS, THREADS, 0, s1>>>(d_c, N, k % 2 ? 2 : 1, k);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h_out2, d_c, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamEndCapture(s1, &g));
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("ended status %d\n", (int)st);
    structure("loop", g);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    memset(h_out2, 0, N * sizeof(int));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    show("loop", h_out2);

    // a graph launch into a capturing stream: CUDA 13 refuses it (cudaErrorStreamCaptureUnsupported
    // on the H100), and the capture cannot end in a graph
    cudaGraph_t outer = NULL;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    cudaError_t launched = cudaGraphLaunch(exec, s1);
    cudaError_t ended = cudaStreamEndCapture(s1, &outer);
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("captured_launch %s end %s graph %d status %d\n", name(launched), name(ended),
           outer != NULL, (int)st);
    cudaGetLastError();
    if (outer)
        CHECK(cudaGraphDestroy(outer));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // a long chain: 3000 launches captured, one node each
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < 3000; k++)
        graph_axpb<<<1, THREADS, 0, s1>>>(d_c, THREADS, 1, k % 3);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamEndCapture(s1, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaMemcpyAsync(d_c, h_in, N * sizeof(int), cudaMemcpyHostToDevice, s1));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaMemcpyAsync(h_out2, d_c, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("long_chain nodes %zu\n", count_nodes(g));
    show("long_chain", h_out2);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
}

static void fork_join()
{
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    cudaStreamCaptureStatus st;
    unsigned long long id1 = 0, id2 = 0;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(d_x, 0, N * sizeof(int), s1));
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    CHECK(cudaStreamIsCapturing(s2, &st));
    CHECK(cudaStreamGetCaptureInfo(s1, &st, &id1));
    CHECK(cudaStreamGetCaptureInfo(s2, &st, &id2));
    printf("fork s2 status %d same_id %d\n", (int)st, id1 == id2);
    graph_axpb<<<N / THREADS, THREADS, 0, s1>>>(d_x, N, 1, 10);
    CHECK(cudaMemcpyAsync(d_y, h_in, N * sizeof(int), cudaMemcpyHostToDevice, s2));
    graph_axpb<<<N / THREADS, THREADS, 0, s2>>>(d_y, N, 2, 0);
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s1, join, 0));
    graph_add<<<N / THREADS, THREADS, 0, s1>>>(d_x, d_y, N);
    CHECK(cudaMemcpyAsync(h_out3, d_x, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s1, &g));
    CHECK(cudaStreamIsCapturing(s2, &st));
    printf("joined s2 status %d\n", (int)st);
    structure("forkjoin", g);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, s2));
    CHECK(cudaStreamSynchronize(s2));
    show("forkjoin", h_out3);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // a fork never joined back
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    graph_axpb<<<N / THREADS, THREADS, 0, s2>>>(d_y, N, 1, 1);
    g = (cudaGraph_t)&g;
    cudaError_t e = cudaStreamEndCapture(s1, &g);
    CHECK(cudaStreamIsCapturing(s2, &st));
    printf("unjoined %s graph %d s2 status %d\n", name(e), g != NULL, (int)st);
    (void)cudaGetLastError();
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
}

static void forbidden()
{
    cudaStreamCaptureStatus st;
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    graph_axpb<<<N / THREADS, THREADS, 0, s1>>>(d_c, N, 1, 1);
    cudaError_t e = cudaStreamSynchronize(s1);
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("sync_in_capture %s status %d\n", name(e), (int)st);
    graph_axpb<<<N / THREADS, THREADS, 0, s1>>>(d_c, N, 1, 1);
    e = cudaGetLastError();
    g = (cudaGraph_t)&g;
    cudaError_t end = cudaStreamEndCapture(s1, &g);
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("launch_after %s end %s graph %d status %d\n", name(e), name(end), g != NULL, (int)st);
    (void)cudaGetLastError();

    e = cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal);
    printf("legacy_capture %s\n", name(e));
    e = cudaStreamEndCapture(s1, &g);
    printf("end_not_capturing %s\n", name(e));
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    e = cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
    printf("begin_twice %s\n", name(e));
    g = NULL;
    (void)cudaStreamEndCapture(s1, &g); // whether that invalidated it is not printed
    if (g)
        CHECK(cudaGraphDestroy(g));
    (void)cudaGetLastError();

    // asking about the legacy stream while a blocking stream captures: refused, not invalidated
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    e = cudaStreamIsCapturing(0, &st);
    graph_axpb<<<N / THREADS, THREADS, 0, s1>>>(d_c, N, 1, 1);
    end = cudaStreamEndCapture(s1, &g);
    printf("legacy_query %s end %s\n", name(e), name(end));
    if (end == cudaSuccess)
        CHECK(cudaGraphDestroy(g));
    (void)cudaGetLastError();

    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    e = cudaMemcpy(h_out, d_a, N * sizeof(int), cudaMemcpyDeviceToHost);
    end = cudaStreamEndCapture(s1, &g);
    printf("sync_copy %s end %s\n", name(e), name(end));
    (void)cudaGetLastError();

    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    e = cudaDeviceSynchronize();
    end = cudaStreamEndCapture(s1, &g);
    printf("device_sync %s end %s\n", name(e), name(end));
    (void)cudaGetLastError();

    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    graph_axpb<<<N / THREADS, THREADS, 0, s1>>>(d_c, N, 1, 1);
    CHECK(cudaEventRecord(ev, s1));
    e = cudaEventQuery(ev);
    end = cudaStreamEndCapture(s1, &g);
    printf("event_query %s end %s\n", name(e), name(end));
    (void)cudaGetLastError();

    // cudaMalloc is an unsafe call in a global-mode capture of the calling thread
    int *scratch = NULL;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    e = cudaMalloc(&scratch, 256);
    g = NULL;
    (void)cudaStreamEndCapture(s1, &g); // whether that invalidated it is not printed
    if (g)
        CHECK(cudaGraphDestroy(g));
    printf("malloc_in_capture %s\n", name(e));
    if (e == cudaSuccess)
        CHECK(cudaFree(scratch));
    (void)cudaGetLastError();
    CHECK(cudaEventDestroy(ev));

    // relaxed mode, on a non-blocking stream: a synchronous copy is allowed
    CHECK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeRelaxed));
    e = cudaMemcpy(h_out, d_x, N * sizeof(int), cudaMemcpyDeviceToHost);
    CHECK(cudaStreamEndCapture(s2, &g));
    printf("relaxed_copy %s nodes %zu\n", name(e), count_nodes(g));
    show("relaxed", h_out);
    CHECK(cudaGraphDestroy(g));
}

// cudaGraphAddNode / cudaGraphNodeSetParams / cudaGraphExecNodeSetParams, a child graph moved in
static void generic_nodes()
{
    cudaGraph_t g, child;
    CHECK(cudaGraphCreate(&g, 0));
    CHECK(cudaGraphCreate(&child, 0));
    int n = N, mul = 3, add = 4, one = 1, seven = 7;
    void *args[4] = {&d_c, &n, &mul, &add};
    void *child_args[4] = {&d_c, &n, &one, &seven};
    cudaGraphNodeParams sp = {};
    sp.type = cudaGraphNodeTypeMemset;
    sp.memset.dst = d_c;
    sp.memset.value = 2;
    sp.memset.elementSize = 4;
    sp.memset.width = N;
    sp.memset.height = 1;
    cudaGraphNode_t set, k, ck, sub;
    CHECK(cudaGraphAddNode(&set, g, NULL, NULL, 0, &sp));
    cudaGraphNodeParams kp = {};
    kp.type = cudaGraphNodeTypeKernel;
    kp.kernel.func = (void *)graph_axpb;
    kp.kernel.gridDim = dim3(N / THREADS);
    kp.kernel.blockDim = dim3(THREADS);
    kp.kernel.kernelParams = args;
    CHECK(cudaGraphAddNode(&k, g, &set, NULL, 1, &kp)); // c = 2 * mul + add
    cudaGraphNodeParams ckp = kp;
    ckp.kernel.kernelParams = child_args;
    CHECK(cudaGraphAddNode(&ck, child, NULL, NULL, 0, &ckp)); // c += 7
    cudaGraphNodeParams gp = {};
    gp.type = cudaGraphNodeTypeGraph;
    gp.graph.graph = child;
    gp.graph.ownership = cudaGraphChildGraphOwnershipMove;
    CHECK(cudaGraphAddNode(&sub, g, &k, NULL, 1, &gp));
    structure("generic", g);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    int got[3];
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaMemcpyAsync(h_out, d_c, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    got[0] = h_out[N - 1];
    mul = 5;
    CHECK(cudaGraphExecNodeSetParams(exec, k, &kp));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaMemcpyAsync(h_out, d_c, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    got[1] = h_out[N - 1];
    add = 1;
    CHECK(cudaGraphNodeSetParams(k, &kp));
    cudaGraphExecUpdateResultInfo info = {};
    CHECK(cudaGraphExecUpdate(exec, g, &info));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaMemcpyAsync(h_out, d_c, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    got[2] = h_out[N - 1];
    cudaGraphNodeParams wrong = {};
    wrong.type = cudaGraphNodeTypeEmpty;
    cudaError_t e = cudaGraphNodeSetParams(k, &wrong);
    (void)cudaGetLastError();
    printf("generic values %d %d %d wrong_type %s\n", got[0], got[1], got[2], name(e));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
}

static void null_handles()
{
    cudaGraphExec_t exec;
    cudaGraphNode_t node;
    cudaGraphNodeType t;
    printf("null instantiate %s\n", name(cudaGraphInstantiate(&exec, NULL, 0)));
    printf("null add %s\n", name(cudaGraphAddEmptyNode(&node, NULL, NULL, 0)));
    printf("null type %s\n", name(cudaGraphNodeGetType(NULL, &t)));
    printf("null destroy %s\n", name(cudaGraphDestroy(NULL)));
    printf("null create %s\n", name(cudaGraphCreate(NULL, 0)));
    printf("null launch %s\n", name(cudaGraphLaunch(NULL, s1)));
    (void)cudaGetLastError();
}

static void garbage()
{
    // Under pilot only: destroyed and made-up handles are refused, never dereferenced.
    cudaGraph_t g, g2;
    cudaGraphNode_t a, b, other;
    CHECK(cudaGraphCreate(&g, 0));
    CHECK(cudaGraphCreate(&g2, 0));
    CHECK(cudaGraphAddEmptyNode(&a, g, NULL, 0));
    CHECK(cudaGraphAddEmptyNode(&b, g, NULL, 0));
    CHECK(cudaGraphAddEmptyNode(&other, g2, NULL, 0));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphDestroyNode(b));
    cudaGraphNodeType t;
    long junk[8] = {0x1234, 0x5678};
    printf("destroyed node %s\n", name(cudaGraphNodeGetType(b, &t)));
    printf("made_up node %s\n", name(cudaGraphNodeGetType((cudaGraphNode_t)junk, &t)));
    printf("made_up graph %s\n", name(cudaGraphAddEmptyNode(&b, (cudaGraph_t)junk, NULL, 0)));
    printf("made_up exec %s\n", name(cudaGraphLaunch((cudaGraphExec_t)junk, s1)));
    printf("node as graph %s\n", name(cudaGraphDestroy((cudaGraph_t)a)));
    printf("foreign dep %s\n", name(cudaGraphAddEmptyNode(&b, g, &other, 1)));
    printf("foreign edge %s\n", name(cudaGraphAddDependencies(g, &a, &other, NULL, 1)));
    cudaLaunchAttributeValue av = {};
    printf("attribute of an empty node %s\n",
           name(cudaGraphKernelNodeGetAttribute(a, cudaLaunchAttributePriority, &av)));
    printf("attribute of a made_up node %s\n",
           name(cudaGraphKernelNodeSetAttribute((cudaGraphNode_t)junk, cudaLaunchAttributePriority, &av)));
    CHECK(cudaGraphExecDestroy(exec));
    printf("destroyed exec %s\n", name(cudaGraphLaunch(exec, s1)));
    CHECK(cudaGraphDestroy(g));
    printf("destroyed graph %s\n", name(cudaGraphAddEmptyNode(&b, g, NULL, 0)));
    printf("node of destroyed %s\n", name(cudaGraphNodeGetType(a, &t)));
    CHECK(cudaGraphDestroy(g2));
    (void)cudaGetLastError();
    printf("garbage done\n");
}

// An L2 access policy window over the first 4 KiB at `base`, half of it persisting.
static cudaAccessPolicyWindow window_over(void *base)
{
    cudaAccessPolicyWindow w = {};
    w.base_ptr = base;
    w.num_bytes = 4096;
    w.hitRatio = 0.5f;
    w.hitProp = cudaAccessPropertyPersisting;
    w.missProp = cudaAccessPropertyStreaming;
    return w;
}

static void stream_attributes()
{
    cudaStreamAttrValue v = {};
    v.accessPolicyWindow = window_over(d_a);
    CHECK(cudaStreamSetAttribute(s1, cudaStreamAttributeAccessPolicyWindow, &v));
    cudaStreamAttrValue sp = {};
    sp.syncPolicy = cudaSyncPolicySpin;
    CHECK(cudaStreamSetAttribute(s1, cudaStreamAttributeSynchronizationPolicy, &sp));
    cudaStreamAttrValue got = {};
    CHECK(cudaStreamGetAttribute(s1, cudaStreamAttributeAccessPolicyWindow, &got));
    printf("window base %d bytes %zu hit %d props %d %d\n", got.accessPolicyWindow.base_ptr == d_a,
           got.accessPolicyWindow.num_bytes, (int)(got.accessPolicyWindow.hitRatio * 100),
           (int)got.accessPolicyWindow.hitProp, (int)got.accessPolicyWindow.missProp);
    CHECK(cudaStreamGetAttribute(s1, cudaStreamAttributeSynchronizationPolicy, &got));
    printf("sync_policy %d\n", (int)got.syncPolicy);
    CHECK(cudaStreamCopyAttributes(s2, s1));
    memset(&got, 0, sizeof got);
    CHECK(cudaStreamGetAttribute(s2, cudaStreamAttributeAccessPolicyWindow, &got));
    printf("copied bytes %zu\n", got.accessPolicyWindow.num_bytes);
    CHECK(cudaStreamGetAttribute(s2, cudaStreamAttributePriority, &got));
    printf("priority %d\n", got.priority);
    unsigned long long id1 = 0, id2 = 0;
    CHECK(cudaStreamGetId(s1, &id1));
    CHECK(cudaStreamGetId(s2, &id2));
    printf("stream ids differ %d\n", id1 != id2);
}

// Kernel node attributes: an L2 access policy window and a launch priority set on one node,
// read back, copied to a second node; the graph runs both.
static void node_attributes()
{
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    int n = N, mul = 2, add = 1, mul2 = 1, add2 = 3;
    void *args[4], *args2[4];
    cudaKernelNodeParams kp = axpb_params(&d_x, &n, &mul, &add, args);
    cudaKernelNodeParams kp2 = axpb_params(&d_x, &n, &mul2, &add2, args2);
    cudaGraphNode_t k1, k2;
    CHECK(cudaGraphAddKernelNode(&k1, g, NULL, 0, &kp));
    CHECK(cudaGraphAddKernelNode(&k2, g, &k1, 1, &kp2));
    cudaLaunchAttributeValue got = {};
    CHECK(cudaGraphKernelNodeGetAttribute(k1, cudaLaunchAttributeAccessPolicyWindow, &got));
    printf("fresh node window bytes %zu\n", got.accessPolicyWindow.num_bytes);
    cudaLaunchAttributeValue v = {};
    v.accessPolicyWindow = window_over(d_x);
    CHECK(cudaGraphKernelNodeSetAttribute(k1, cudaLaunchAttributeAccessPolicyWindow, &v));
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaLaunchAttributeValue pv = {};
    pv.priority = greatest;
    CHECK(cudaGraphKernelNodeSetAttribute(k1, cudaLaunchAttributePriority, &pv));
    CHECK(cudaGraphKernelNodeGetAttribute(k1, cudaLaunchAttributeAccessPolicyWindow, &got));
    printf("node window base %d bytes %zu hit %d\n", got.accessPolicyWindow.base_ptr == d_x,
           got.accessPolicyWindow.num_bytes, (int)(got.accessPolicyWindow.hitRatio * 100));
    CHECK(cudaGraphKernelNodeGetAttribute(k1, cudaLaunchAttributePriority, &got));
    printf("node priority is the greatest %d\n", got.priority == greatest);
    CHECK(cudaGraphKernelNodeCopyAttributes(k2, k1));
    memset(&got, 0, sizeof got);
    CHECK(cudaGraphKernelNodeGetAttribute(k2, cudaLaunchAttributeAccessPolicyWindow, &got));
    printf("copied node window bytes %zu\n", got.accessPolicyWindow.num_bytes);
    CHECK(cudaMemcpy(d_x, h_in, N * sizeof(int), cudaMemcpyHostToDevice));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, NULL, NULL, 0));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    CHECK(cudaMemcpy(h_out, d_x, N * sizeof(int), cudaMemcpyDeviceToHost));
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= h_out[i] == h_in[i] * 2 + 1 + 3;
    printf("graph with node attributes ran: %d\n", ok);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
}

int main(int argc, char **argv)
{
    CHECK(cudaMallocHost(&h_in, N * sizeof(int)));
    CHECK(cudaMallocHost(&h_out, N * sizeof(int)));
    CHECK(cudaMallocHost(&h_out2, N * sizeof(int)));
    CHECK(cudaMallocHost(&h_out3, N * sizeof(int)));
    CHECK(cudaMallocHost(&h_table, TABLE * sizeof(int)));
    for (int i = 0; i < N; i++)
        h_in[i] = 3 * i + 1;
    for (int j = 0; j < TABLE; j++)
        h_table[j] = j * j - 5;
    CHECK(cudaMalloc(&d_a, N * sizeof(int)));
    CHECK(cudaMalloc(&d_b, N * sizeof(int)));
    CHECK(cudaMalloc(&d_c, N * sizeof(int)));
    CHECK(cudaMalloc(&d_x, N * sizeof(int)));
    CHECK(cudaMalloc(&d_y, N * sizeof(int)));
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

    if (argc > 1 && strcmp(argv[1], "garbage") == 0) {
        garbage();
        return 0;
    }
    explicit_graph();
    capture_loop();
    fork_join();
    forbidden();
    generic_nodes();
    null_handles();
    stream_attributes();
    node_attributes();
    CHECK(cudaDeviceSynchronize());
    printf("done\n");
    return 0;
}
