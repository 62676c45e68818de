// graph_params: the parameters of memcpy, host and event nodes read back and set, in a graph and
// in its executable graph (cudaGraph{Memcpy,Host}NodeGet/SetParams, the 1D memcpy setters,
// cudaGraphEvent{Record,Wait}NodeGet/SetEvent and the cudaGraphExec* setters): what is set is
// what is read, the graph keeps its own parameters when its executable graph's are set, and
// each executable graph runs with the parameters it was given. Memset nodes are graphs.cu's.
// Prints only exact values (identical natively and under pilot).
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define N 256

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorName(e_));              \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static int g_calls[2];

static void CUDART_CB bump(void *which)
{
    g_calls[*(const int *)which]++;
}

static cudaMemcpy3DParms copy_to(int *dst, int *src)
{
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(src, N * sizeof(int), N * sizeof(int), 1);
    p.dstPtr = make_cudaPitchedPtr(dst, N * sizeof(int), N * sizeof(int), 1);
    p.extent = make_cudaExtent(N * sizeof(int), 1, 1);
    p.kind = cudaMemcpyHostToDevice;
    return p;
}

// 1 if the device buffer d holds x, 0 if it holds zeros, -1 otherwise.
static int holds(const int *d, const int *x)
{
    int got[N];
    CHECK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
    int same = 1, zero = 1;
    for (int i = 0; i < N; i++) {
        same &= got[i] == x[i];
        zero &= got[i] == 0;
    }
    return same ? 1 : zero ? 0 : -1;
}

int main()
{
    int *h; // pinned, as a graph's copies want
    CHECK(cudaMallocHost(&h, N * sizeof(int)));
    for (int i = 0; i < N; i++)
        h[i] = 3 * i + 1;
    int *a, *b;
    CHECK(cudaMalloc(&a, N * sizeof(int)));
    CHECK(cudaMalloc(&b, N * sizeof(int)));
    CHECK(cudaMemset(a, 0, N * sizeof(int)));
    CHECK(cudaMemset(b, 0, N * sizeof(int)));
    cudaEvent_t e1, e2;
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventCreate(&e2));
    static int which[2] = {0, 1};

    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t ncpy, nhost, nrec, nwait;
    cudaMemcpy3DParms cp = copy_to(a, h);
    CHECK(cudaGraphAddMemcpyNode(&ncpy, g, NULL, 0, &cp));
    cudaHostNodeParams hp = {bump, &which[0]};
    CHECK(cudaGraphAddHostNode(&nhost, g, &ncpy, 1, &hp));
    CHECK(cudaGraphAddEventRecordNode(&nrec, g, &nhost, 1, e1));
    CHECK(cudaGraphAddEventWaitNode(&nwait, g, &nrec, 1, e2));

    cudaMemcpy3DParms gc = {};
    CHECK(cudaGraphMemcpyNodeGetParams(ncpy, &gc));
    printf("memcpy dst_a %d src_h %d width %zu\n", gc.dstPtr.ptr == a, gc.srcPtr.ptr == h,
           gc.extent.width);
    cudaHostNodeParams gh = {};
    CHECK(cudaGraphHostNodeGetParams(nhost, &gh));
    printf("host fn %d data 0 %d\n", gh.fn == bump, gh.userData == &which[0]);
    cudaEvent_t ge = NULL, gw = NULL;
    CHECK(cudaGraphEventRecordNodeGetEvent(nrec, &ge));
    CHECK(cudaGraphEventWaitNodeGetEvent(nwait, &gw));
    printf("events record e1 %d wait e2 %d\n", ge == e1, gw == e2);

    // The graph's own parameters set: the copy to b (1D form), the other host datum, the events
    // swapped.
    CHECK(cudaGraphMemcpyNodeSetParams1D(ncpy, b, h, N * sizeof(int), cudaMemcpyHostToDevice));
    hp.userData = &which[1];
    CHECK(cudaGraphHostNodeSetParams(nhost, &hp));
    CHECK(cudaGraphEventRecordNodeSetEvent(nrec, e2));
    CHECK(cudaGraphEventWaitNodeSetEvent(nwait, e1));
    CHECK(cudaGraphMemcpyNodeGetParams(ncpy, &gc));
    CHECK(cudaGraphHostNodeGetParams(nhost, &gh));
    CHECK(cudaGraphEventRecordNodeGetEvent(nrec, &ge));
    CHECK(cudaGraphEventWaitNodeGetEvent(nwait, &gw));
    printf("set dst_b %d src_h %d width %zu data 1 %d record e2 %d wait e1 %d\n",
           gc.dstPtr.ptr == b, gc.srcPtr.ptr == h, gc.extent.width, gh.userData == &which[1],
           ge == e2, gw == e1);

    // An executable graph given the first parameters back; the graph keeps its own.
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphExecMemcpyNodeSetParams(exec, ncpy, &cp));
    hp.userData = &which[0];
    CHECK(cudaGraphExecHostNodeSetParams(exec, nhost, &hp));
    CHECK(cudaGraphExecEventRecordNodeSetEvent(exec, nrec, e1));
    CHECK(cudaGraphExecEventWaitNodeSetEvent(exec, nwait, e2));
    CHECK(cudaGraphMemcpyNodeGetParams(ncpy, &gc));
    CHECK(cudaGraphHostNodeGetParams(nhost, &gh));
    CHECK(cudaGraphEventRecordNodeGetEvent(nrec, &ge));
    printf("graph keeps dst_b %d data 1 %d record e2 %d\n", gc.dstPtr.ptr == b,
           gh.userData == &which[1], ge == e2);

    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("exec ran: a %d b %d calls %d %d e1 %s\n", holds(a, h), holds(b, h), g_calls[0],
           g_calls[1], cudaGetErrorName(cudaEventQuery(e1)));

    // A second executable graph of the graph: its own (set) parameters.
    cudaGraphExec_t exec2;
    CHECK(cudaGraphInstantiate(&exec2, g, 0));
    CHECK(cudaGraphLaunch(exec2, s));
    CHECK(cudaStreamSynchronize(s));
    printf("graph ran: b %d calls %d %d e2 %s\n", holds(b, h), g_calls[0], g_calls[1],
           cudaGetErrorName(cudaEventQuery(e2)));

    CHECK(cudaGraphExecDestroy(exec2));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaEventDestroy(e1));
    CHECK(cudaEventDestroy(e2));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFreeHost(h));
    printf("done\n");
    return 0;
}
