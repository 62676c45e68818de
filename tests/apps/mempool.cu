// The stream-ordered allocator and the queries programs and libraries make around it
// (shim/runtime/memory/api_mempool.c): cudaMallocAsync / cudaFreeAsync on streams, the default and a created
// memory pool with their attributes, cudaMallocFromPoolAsync, stream-capture status queries,
// and cudaInitDevice. Prints one line per check;
// compared byte for byte with native.
#include <cuda_runtime.h>

#include <stdio.h>
#include <string.h>

#define N (1 << 20)

__global__ void fill_ints(int *p, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = v + i;
}

static int failed;

static void show(const char *what, cudaError_t err)
{
    printf("%s: %s\n", what, cudaGetErrorName(err));
}

static void expect(int ok, const char *what)
{
    printf("%s: %s\n", what, ok ? "yes" : "NO");
    failed |= !ok;
}

// Fills n ints on `stream` from memory allocated there, reads them back, frees it there.
static void round_trip(cudaStream_t stream, cudaMemPool_t pool, const char *label)
{
    static int host[N];
    int *dev = NULL;
    cudaError_t err = pool ? cudaMallocFromPoolAsync((void **)&dev, N * sizeof(int), pool, stream)
                           : cudaMallocAsync((void **)&dev, N * sizeof(int), stream);
    printf("%s alloc: %s\n", label, cudaGetErrorName(err));
    if (err)
        return;
    fill_ints<<<N / 256, 256, 0, stream>>>(dev, N, 7);
    show("  launch", cudaGetLastError());
    show("  copy back", cudaMemcpyAsync(host, dev, N * sizeof(int), cudaMemcpyDeviceToHost, stream));
    show("  free", cudaFreeAsync(dev, stream));
    show("  synchronize", cudaStreamSynchronize(stream));
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= host[i] == 7 + i;
    expect(ok, "  values");
}

int main(void)
{
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

    cudaMemPool_t pool, current;
    show("default pool", cudaDeviceGetDefaultMemPool(&pool, 0));
    show("current pool", cudaDeviceGetMemPool(&current, 0));
    expect(pool == current, "current is the default");
    unsigned long long threshold = 64ull << 20, read = 0;
    show("set release threshold", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    show("get release threshold", cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &read));
    expect(read == threshold, "threshold kept");
    int reuse = -1;
    show("get reuse opportunistic", cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &reuse));
    printf("reuse opportunistic: %d\n", reuse);

    round_trip(stream, NULL, "default stream-ordered");
    round_trip(0, NULL, "legacy stream");

    unsigned long long used = 1;
    int *held = NULL;
    show("alloc to hold", cudaMallocAsync((void **)&held, 4 << 20, stream));
    cudaStreamSynchronize(stream);
    show("used while held", cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    expect(used >= (4u << 20), "used counts it");
    show("free held", cudaFreeAsync(held, stream));
    cudaStreamSynchronize(stream);
    show("used after free", cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    expect(used == 0, "used back to 0");
    unsigned long long high = 1;
    show("reset used high to 1", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
    high = 0;
    show("reset used high to 0", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
    show("set used current", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &high));
    show("last error", cudaGetLastError());
    show("trim", cudaMemPoolTrimTo(pool, 0));

    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t mine;
    show("create pool", cudaMemPoolCreate(&mine, &props));
    expect(mine != pool, "a pool of its own");
    round_trip(stream, mine, "created pool");
    show("set as current", cudaDeviceSetMemPool(0, mine));
    show("current pool again", cudaDeviceGetMemPool(&current, 0));
    expect(current == mine, "current is the created one");
    round_trip(stream, NULL, "current created pool");
    show("back to default", cudaDeviceSetMemPool(0, pool));
    enum cudaMemAccessFlags access;
    struct cudaMemLocation here = {cudaMemLocationTypeDevice, 0};
    show("access", cudaMemPoolGetAccess(&access, mine, &here));
    printf("access flags: %d\n", (int)access);
    show("destroy pool", cudaMemPoolDestroy(mine));
    show("default pool of device 99", cudaDeviceGetDefaultMemPool(&current, 99));
    props.location.id = 99;
    show("create pool on device 99", cudaMemPoolCreate(&mine, &props));

    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    show("is capturing", cudaStreamIsCapturing(stream, &status));
    printf("capture status: %d\n", (int)status);
    status = cudaStreamCaptureStatusActive;
    show("capture info", cudaStreamGetCaptureInfo(stream, &status, NULL, NULL, NULL, NULL, NULL));
    printf("capture status: %d\n", (int)status);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    show("exchange capture mode", cudaThreadExchangeStreamCaptureMode(&mode));
    printf("previous mode: %d\n", (int)mode);
    show("exchange back", cudaThreadExchangeStreamCaptureMode(&mode));
    printf("previous mode: %d\n", (int)mode);

    show("init device 0", cudaInitDevice(0, 0, 0));
    show("init device 99", cudaInitDevice(99, 0, 0));

    show("last error", cudaGetLastError());
    cudaStreamDestroy(stream);
    printf("%s\n", failed ? "FAIL" : "PASS");
    return failed;
}
