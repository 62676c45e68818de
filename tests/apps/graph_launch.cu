// Executable graphs of device work only (kernels, device-to-device copies, memsets), the kind
// pilotd instantiates as real CUDA graphs (shim/runtime/graph/graph_remote.c, daemon/ops/graphs.py): captured
// and explicit graphs launched many times on other streams, an exec changed after instantiation
// (kernel parameters, a node disabled, a whole-graph update), memory freed between launches,
// and two executable graphs of one graph. Prints what native CUDA prints
// (tests/gpu/graphs_compare.sh diffs it on a GPU).
#include <cstring>
#include <vector>

#include "graph_kernels.cuh"

#define N 4096
#define THREADS 256

static unsigned sum(const int *x)
{
    unsigned h = 0;
    for (int i = 0; i < N; i++)
        h = h * 31u + (unsigned)x[i];
    return h;
}

static int *d_a, *d_b, *d_c;
static int h[N], out[N];
static cudaStream_t s1, s2;

static void show(const char *what, const int *dev)
{
    CHECK(cudaMemcpy(out, dev, sizeof out, cudaMemcpyDeviceToHost));
    printf("%s %08x %d %d\n", what, sum(out), out[0], out[N - 1]);
}

// b = a; b = b + 1 (x steps); c = 0; c += b
static cudaGraph_t capture(int steps)
{
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaMemcpyAsync(d_b, d_a, sizeof h, cudaMemcpyDeviceToDevice, s1));
    for (int k = 0; k < steps; k++)
        graph_axpb<<<N / THREADS, THREADS, 0, s1>>>(d_b, N, 1, 1);
    CHECK(cudaMemsetAsync(d_c, 0, sizeof h, s1));
    graph_add<<<N / THREADS, THREADS, 0, s1>>>(d_c, d_b, N);
    CHECK(cudaStreamEndCapture(s1, &g));
    return g;
}

static void captured()
{
    cudaGraph_t g = capture(50);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int r = 0; r < 3; r++)
        CHECK(cudaGraphLaunch(exec, r % 2 ? s2 : (cudaStream_t)0));
    CHECK(cudaDeviceSynchronize());
    show("captured", d_c);
    // between launches: memory of the program freed (pilotd checks the graph again)
    int *tmp;
    CHECK(cudaMalloc(&tmp, 1 << 20));
    CHECK(cudaFree(tmp));
    CHECK(cudaMemset(d_c, 0xff, sizeof h));
    CHECK(cudaGraphLaunch(exec, s2));
    CHECK(cudaStreamSynchronize(s2));
    show("after_free", d_c);
    // a second exec of the same graph, then a whole-graph update from a longer chain's twin
    cudaGraphExec_t exec2;
    CHECK(cudaGraphInstantiate(&exec2, g, 0));
    cudaGraph_t other = capture(50);
    cudaGraphNode_t nodes[60];
    size_t n = 60;
    CHECK(cudaGraphGetNodes(other, nodes, &n));
    cudaKernelNodeParams p;
    CHECK(cudaGraphKernelNodeGetParams(nodes[1], &p));
    int mul = 3, add = 0, len = N;
    void *args[] = {&d_b, &len, &mul, &add};
    p.kernelParams = args;
    CHECK(cudaGraphKernelNodeSetParams(nodes[1], &p));
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(exec2, other, &info));
    CHECK(cudaGraphLaunch(exec2, s1));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    show("exec_then_other", d_c);
    CHECK(cudaGraphLaunch(exec2, s1));
    CHECK(cudaStreamSynchronize(s1));
    show("updated", d_c);
    CHECK(cudaGraphExecDestroy(exec2));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(other));
    CHECK(cudaGraphDestroy(g));
}

static void explicit_nodes()
{
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t copy, scale, clear, add;
    CHECK(cudaGraphAddMemcpyNode1D(&copy, g, NULL, 0, d_b, d_a, sizeof h, cudaMemcpyDeviceToDevice));
    int len = N, mul = 2, addv = 7;
    void *args[] = {&d_b, &len, &mul, &addv};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)graph_axpb;
    kp.gridDim = dim3(N / THREADS);
    kp.blockDim = dim3(THREADS);
    kp.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&scale, g, &copy, 1, &kp));
    cudaMemsetParams mp = {};
    mp.dst = d_c;
    mp.value = 1;
    mp.elementSize = 4;
    mp.width = N;
    mp.height = 1;
    CHECK(cudaGraphAddMemsetNode(&clear, g, NULL, 0, &mp));
    void *add_args[] = {&d_c, &d_b, &len};
    cudaKernelNodeParams ap = kp;
    ap.func = (void *)graph_add;
    ap.kernelParams = add_args;
    cudaGraphNode_t deps[] = {scale, clear};
    CHECK(cudaGraphAddKernelNode(&add, g, deps, 2, &ap));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, s2));
    CHECK(cudaStreamSynchronize(s2));
    show("explicit", d_c);
    mul = 5;
    CHECK(cudaGraphExecKernelNodeSetParams(exec, scale, &kp));
    CHECK(cudaGraphLaunch(exec, s2));
    CHECK(cudaStreamSynchronize(s2));
    show("exec_set", d_c);
    CHECK(cudaGraphNodeSetEnabled(exec, scale, 0));
    CHECK(cudaGraphLaunch(exec, s2));
    CHECK(cudaStreamSynchronize(s2));
    show("disabled", d_c);
    CHECK(cudaGraphNodeSetEnabled(exec, scale, 1));
    for (int r = 0; r < 100; r++)
        CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaDeviceSynchronize());
    show("relaunched", d_c);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
}

int main()
{
    for (int i = 0; i < N; i++)
        h[i] = 3 * i - 1000;
    CHECK(cudaMalloc(&d_a, sizeof h));
    CHECK(cudaMalloc(&d_b, sizeof h));
    CHECK(cudaMalloc(&d_c, sizeof h));
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreate(&s2));
    CHECK(cudaMemcpy(d_a, h, sizeof h, cudaMemcpyHostToDevice));
    captured();
    explicit_nodes();
    printf("done\n");
    return 0;
}
