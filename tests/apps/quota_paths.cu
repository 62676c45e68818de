// quota_paths: one allocation through every path pilot's resource broker charges, each call's
// result printed by name: cudaMalloc (8 MiB), cudaMallocPitch (1000 x 1000 bytes),
// cudaMallocManaged (4 MiB), cudaHostAlloc (1 MiB, pinned host memory), a 32 MiB larger malloc
// heap (cudaDeviceSetLimit), and this module's 256 MiB of globals, which are loaded with the
// module at the first use of one of its variables (cudaMemcpyToSymbol below).
//
// Usage: quota_paths [all|hold|biglimit]
//   all (default)  the allocations above, then free everything and print "done"
//   hold           the same, but print "holding" and wait for a line on stdin before freeing
//                  (tests/apps/test_scheduler_core.py reads the tenant's quota meanwhile)
//   biglimit       only ask for a malloc heap 1 GiB larger than the current one
// Prints only error names and booleans: the output is the same natively and under pilot with
// no quota. Under a small quota the refused paths print cudaErrorMemoryAllocation.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1ull << 20)

__device__ char g_big[256 << 20];

static void report(const char *what, cudaError_t err)
{
    printf("%s: %s\n", what, cudaGetErrorName(err));
}

static int biglimit(void)
{
    size_t heap = 0, after = 0;
    cudaError_t err = cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize);
    report("cudaDeviceGetLimit heap", err);
    report("cudaDeviceSetLimit heap +1GiB", cudaDeviceSetLimit(cudaLimitMallocHeapSize, heap + 1024 * MiB));
    cudaGetLastError();
    report("cudaDeviceGetLimit heap again", cudaDeviceGetLimit(&after, cudaLimitMallocHeapSize));
    printf("heap raised: %s\n", after >= heap + 1024 * MiB ? "yes" : "no");
    printf("done\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    if (strcmp(mode, "biglimit") == 0)
        return biglimit();
    if (strcmp(mode, "all") != 0 && strcmp(mode, "hold") != 0) {
        printf("usage: quota_paths [all|hold|biglimit]\n");
        return 2;
    }

    void *dev = NULL, *pitched = NULL, *managed = NULL, *pinned = NULL;
    size_t pitch = 0;
    report("cudaMalloc 8MiB", cudaMalloc(&dev, 8 * MiB));
    report("cudaMallocPitch 1000x1000", cudaMallocPitch(&pitched, &pitch, 1000, 1000));
    printf("pitch >= 1000: %s\n", pitch >= 1000 ? "yes" : "no");
    report("cudaMallocManaged 4MiB", cudaMallocManaged(&managed, 4 * MiB, cudaMemAttachGlobal));
    report("cudaHostAlloc 1MiB", cudaHostAlloc(&pinned, 1 * MiB, cudaHostAllocDefault));

    size_t heap = 0, raised = 0;
    report("cudaDeviceGetLimit heap", cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
    report("cudaDeviceSetLimit heap +32MiB",
           cudaDeviceSetLimit(cudaLimitMallocHeapSize, heap + 32 * MiB));
    cudaDeviceGetLimit(&raised, cudaLimitMallocHeapSize);
    printf("heap raised: %s\n", raised >= heap + 32 * MiB ? "yes" : "no");

    // The first use of g_big loads the module, and with it 256 MiB of globals.
    static char pattern[4096], back[4096];
    for (int i = 0; i < (int)sizeof pattern; i++)
        pattern[i] = (char)(i * 7 + 3);
    const size_t at = (256 << 20) - sizeof pattern; // the last bytes of the array
    cudaError_t err = cudaMemcpyToSymbol(g_big, pattern, sizeof pattern, at);
    report("cudaMemcpyToSymbol g_big", err);
    cudaGetLastError();
    if (err == cudaSuccess) {
        err = cudaMemcpyFromSymbol(back, g_big, sizeof back, at);
        report("cudaMemcpyFromSymbol g_big", err);
        printf("g_big readback: %s\n",
               err == cudaSuccess && memcmp(pattern, back, sizeof back) == 0 ? "ok" : "FAIL");
    }

    if (strcmp(mode, "hold") == 0) {
        printf("holding\n");
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin))
            printf("stdin closed\n");
    }

    cudaError_t freed = cudaSuccess, e;
    if (dev && (e = cudaFree(dev)) != cudaSuccess)
        freed = e;
    if (pitched && (e = cudaFree(pitched)) != cudaSuccess)
        freed = e;
    if (managed && (e = cudaFree(managed)) != cudaSuccess)
        freed = e;
    if (pinned && (e = cudaFreeHost(pinned)) != cudaSuccess)
        freed = e;
    report("free", freed);
    printf("done\n");
    return 0;
}
