// launch_ex: cooperative launches (cudaLaunchCooperativeKernel, and the cooperative attribute
// of cudaLaunchKernelEx) with a grid-wide barrier, a cooperative grid too large for the
// device, thread-block clusters, launch priorities, and the errors CUDA gives for clusters
// that do not fit. Everything printed is deterministic.
//
// `launch_ex unsupported` (pilot's tests only): a launch attribute pilot does not carry is
// refused with cudaErrorNotSupported, and the next launch works.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__,       \
                   __LINE__, #call);                                                       \
            printf("FAIL\n");                                                              \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

// Every thread writes a[j] for its share of j, waits for the whole grid, then reads a value
// another block wrote: b[j] = a[(j + 1) % n]. Without a grid-wide barrier this races.
__global__ void coop_shift(int *a, int *b, int n)
{
    cg::grid_group grid = cg::this_grid();
    int stride = gridDim.x * blockDim.x;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        a[j] = 3 * j + 1;
    grid.sync();
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        b[j] = a[(j + 1) % n];
}

__global__ void stamp_blocks(int *p, int base)
{
    p[blockIdx.x * blockDim.x + threadIdx.x] = base + (int)blockIdx.x;
}

static const int N = 10000;

static bool shifted(const int *dev_b)
{
    std::vector<int> b(N);
    CHECK(cudaMemcpy(b.data(), dev_b, N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int j = 0; j < N; j++)
        if (b[j] != 3 * ((j + 1) % N) + 1)
            return false;
    return true;
}

static bool stamped(const int *dev, int blocks, int threads, int base)
{
    std::vector<int> p(blocks * threads);
    CHECK(cudaMemcpy(p.data(), dev, p.size() * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < blocks * threads; i++)
        if (p[i] != base + i / threads)
            return false;
    return true;
}

static const char *yes(bool b)
{
    return b ? "yes" : "no";
}

// Launches stamp_blocks with `cfg` (4 blocks of 32 threads on its stream), waits, and says
// whether every thread stamped `v`.
static bool run_stamp(const char *what, const cudaLaunchConfig_t &cfg, int *p, int v)
{
    cudaError_t err = cudaLaunchKernelEx(&cfg, stamp_blocks, p, v);
    CHECK(cudaStreamSynchronize(cfg.stream));
    bool ok = stamped(p, 4, 32, v);
    printf("%s: %s, ran: %s\n", what, cudaGetErrorName(err), yes(ok));
    return err == cudaSuccess && ok;
}

static int unsupported(int *p)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    attr[0].id = cudaLaunchAttributeLaunchCompletionEvent; // an event the program waits on: refused
    attr[0].val.launchCompletionEvent.event = done;
    attr[0].val.launchCompletionEvent.flags = 0;
    cfg.gridDim = dim3(2);
    cfg.blockDim = dim3(32);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t err = cudaLaunchKernelEx(&cfg, stamp_blocks, p, 7);
    printf("launch completion event: %s (last %s)\n", cudaGetErrorName(err),
           cudaGetErrorName(cudaGetLastError()));
    attr[0].id = cudaLaunchAttributeAccessPolicyWindow; // a hint, but checked: hit ratio in [0, 1]
    attr[0].val.accessPolicyWindow.base_ptr = p;
    attr[0].val.accessPolicyWindow.num_bytes = 4096;
    attr[0].val.accessPolicyWindow.hitRatio = 2.0f;
    attr[0].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr[0].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    err = cudaLaunchKernelEx(&cfg, stamp_blocks, p, 7);
    printf("hit ratio 2: %s (last %s)\n", cudaGetErrorName(err), cudaGetErrorName(cudaGetLastError()));
    cfg.numAttrs = 0;
    CHECK(cudaLaunchKernelEx(&cfg, stamp_blocks, p, 7));
    printf("next launch: %s\n", yes(stamped(p, 2, 32, 7)));
    printf("PASS\n");
    return 0;
}

int main(int argc, char **argv)
{
    int *a, *b, *p;
    CHECK(cudaMalloc(&a, N * sizeof(int)));
    CHECK(cudaMalloc(&b, N * sizeof(int)));
    CHECK(cudaMalloc(&p, 64 * 128 * sizeof(int)));
    if (argc > 1 && strcmp(argv[1], "unsupported") == 0)
        return unsupported(p);
    int failed = 0, supported = 0;
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrCooperativeLaunch, 0));
    printf("cooperative launch supported: %s\n", yes(supported));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    // cudaLaunchCooperativeKernel: 8 blocks of 128 threads, all co-resident.
    int n = N;
    void *args[] = {&a, &b, &n};
    CHECK(cudaMemset(b, 0, N * sizeof(int)));
    cudaError_t err = cudaLaunchCooperativeKernel((const void *)coop_shift, dim3(8), dim3(128), args, 0, s);
    CHECK(cudaStreamSynchronize(s));
    bool ok = shifted(b);
    printf("cooperative launch: %s, grid barrier held: %s\n", cudaGetErrorName(err), yes(ok));
    failed |= err != cudaSuccess || !ok;

    // The same through cudaLaunchKernelEx and the cooperative attribute.
    CHECK(cudaMemset(b, 0, N * sizeof(int)));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attrs[3];
    attrs[0].id = cudaLaunchAttributeCooperative;
    attrs[0].val.cooperative = 1;
    attrs[1].id = cudaLaunchAttributeIgnore;
    cfg.gridDim = dim3(16);
    cfg.blockDim = dim3(64);
    cfg.stream = s;
    cfg.attrs = attrs;
    cfg.numAttrs = 2;
    err = cudaLaunchKernelEx(&cfg, coop_shift, a, b, n);
    CHECK(cudaStreamSynchronize(s));
    ok = shifted(b);
    printf("cudaLaunchKernelEx cooperative: %s, grid barrier held: %s\n", cudaGetErrorName(err), yes(ok));
    failed |= err != cudaSuccess || !ok;

    // A cooperative grid that cannot be resident at once.
    err = cudaLaunchCooperativeKernel((const void *)coop_shift, dim3(1000000), dim3(128), args, 0, s);
    printf("cooperative grid of 1000000 blocks: %s\n", cudaGetErrorName(err));
    cudaError_t last = cudaGetLastError(), then = cudaGetLastError();
    printf("last error: %s, then %s\n", cudaGetErrorName(last), cudaGetErrorName(then));
    failed |= err != cudaErrorCooperativeLaunchTooLarge;

    // Clusters of 2 blocks over a grid of 64 blocks, with a scheduling preference.
    cudaLaunchConfig_t ccfg = {};
    cudaLaunchAttribute cattrs[2];
    cattrs[0].id = cudaLaunchAttributeClusterDimension;
    cattrs[0].val.clusterDim.x = 2;
    cattrs[0].val.clusterDim.y = 1;
    cattrs[0].val.clusterDim.z = 1;
    cattrs[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
    cattrs[1].val.clusterSchedulingPolicyPreference = cudaClusterSchedulingPolicySpread;
    ccfg.gridDim = dim3(64);
    ccfg.blockDim = dim3(128);
    ccfg.attrs = cattrs;
    ccfg.numAttrs = 2;
    err = cudaLaunchKernelEx(&ccfg, stamp_blocks, p, 100);
    CHECK(cudaDeviceSynchronize());
    ok = stamped(p, 64, 128, 100);
    printf("clusters of 2: %s, every block ran: %s\n", cudaGetErrorName(err), yes(ok));
    failed |= err != cudaSuccess || !ok;
    ccfg.gridDim = dim3(63); // not a multiple of the cluster
    err = cudaLaunchKernelEx(&ccfg, stamp_blocks, p, 100);
    printf("clusters of 2 over 63 blocks refused: %s\n", yes(err != cudaSuccess));
    cudaGetLastError();
    cattrs[0].val.clusterDim.x = 16; // past the portable size, not opted in
    ccfg.gridDim = dim3(64);
    err = cudaLaunchKernelEx(&ccfg, stamp_blocks, p, 100);
    printf("clusters of 16 without opting in refused: %s\n", yes(err != cudaSuccess));
    cudaGetLastError();

    // A launch priority (the device's highest) on a default-priority stream.
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaLaunchConfig_t pcfg = {};
    cudaLaunchAttribute pattr[1];
    pattr[0].id = cudaLaunchAttributePriority;
    pattr[0].val.priority = greatest;
    pcfg.gridDim = dim3(4);
    pcfg.blockDim = dim3(32);
    pcfg.stream = s;
    pcfg.attrs = pattr;
    pcfg.numAttrs = 1;
    failed |= !run_stamp("launch with priority", pcfg, p, 40);

    // Programmatic dependent launch (as Thrust and CUB ask for it): two kernels in a row.
    cudaLaunchAttribute dattr[1];
    dattr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dattr[0].val.programmaticStreamSerializationAllowed = 1;
    pcfg.attrs = dattr;
    CHECK(cudaLaunchKernelEx(&pcfg, stamp_blocks, p, 50));
    failed |= !run_stamp("programmatic dependent launch", pcfg, p, 60);

    // Performance hints (an L2 access policy window, the memory synchronization domain): the
    // kernel runs with them.
    cudaLaunchAttribute hattr[2];
    hattr[0].id = cudaLaunchAttributeAccessPolicyWindow;
    hattr[0].val.accessPolicyWindow.base_ptr = p;
    hattr[0].val.accessPolicyWindow.num_bytes = 4096;
    hattr[0].val.accessPolicyWindow.hitRatio = 0.5f;
    hattr[0].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    hattr[0].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    hattr[1].id = cudaLaunchAttributeMemSyncDomain;
    hattr[1].val.memSyncDomain = cudaLaunchMemSyncDomainRemote;
    pcfg.attrs = hattr;
    pcfg.numAttrs = 2;
    failed |= !run_stamp("access policy window and sync domain", pcfg, p, 70);
    CHECK(cudaCtxResetPersistingL2Cache());

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(p));
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed;
}
