// The driver API's host-side calls: cuMemHostRegister / cuMemHostUnregister, cuLaunchHostFunc
// and cuStreamAddCallback in stream order, and 2D copies (cuMemcpy2D, cuMemcpy2DAsync) between
// host rows and pitched device memory, with offsets into both.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda.h>

#include "drv_check.h"

static int order[4], done;

static void host_fn(void *data) { order[done++] = *(int *)data; }

static void callback(CUstream, CUresult status, void *data)
{
    order[done++] = status == CUDA_SUCCESS ? *(int *)data : -1;
}

int main()
{
    CHECK(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    // page-locked host memory: registered, copied from asynchronously, unregistered
    const size_t bytes = 1 << 20;
    unsigned char *host = (unsigned char *)aligned_alloc(4096, bytes);
    for (size_t i = 0; i < bytes; i++)
        host[i] = (unsigned char)(i * 7);
    CHECK(cuMemHostRegister(host, bytes, 0));
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, bytes));
    CHECK(cuMemcpyHtoDAsync(d, host, bytes, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemHostUnregister(host));
    unsigned char *back = (unsigned char *)malloc(bytes);
    CHECK(cuMemcpyDtoH(back, d, bytes));
    printf("registered memory copied: %d\n", memcmp(back, host, bytes) == 0);
    printf("unregistering it twice fails: %d\n", cuMemHostUnregister(host) != CUDA_SUCCESS);

    // host functions in stream order, after the copy queued before them
    int one = 1, two = 2, three = 3;
    CHECK(cuMemcpyHtoDAsync(d, back, bytes, stream));
    CHECK(cuLaunchHostFunc(stream, host_fn, &one));
    CHECK(cuStreamAddCallback(stream, callback, &two, 0));
    CHECK(cuLaunchHostFunc(stream, host_fn, &three));
    CHECK(cuStreamSynchronize(stream));
    printf("host functions ran in order: %d %d %d (%d)\n", order[0], order[1], order[2], done);

    // 2D: 24 rows of 100 bytes from the host into pitched memory, then a 40x10 box back from
    // column 8, row 5 into column 3, row 2 of a host matrix 64 bytes wide
    const size_t width = 100, height = 24;
    CUdeviceptr pitched;
    size_t pitch;
    CHECK(cuMemAllocPitch(&pitched, &pitch, width, height, 4));
    CUDA_MEMCPY2D up = {};
    up.srcMemoryType = CU_MEMORYTYPE_HOST;
    up.srcHost = host;
    up.srcPitch = width;
    up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    up.dstDevice = pitched;
    up.dstPitch = pitch;
    up.WidthInBytes = width;
    up.Height = height;
    CHECK(cuMemcpy2D(&up));
    unsigned char box[64 * 16];
    memset(box, 0xee, sizeof box);
    CUDA_MEMCPY2D down = {};
    down.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    down.srcDevice = pitched;
    down.srcPitch = pitch;
    down.srcXInBytes = 8;
    down.srcY = 5;
    down.dstMemoryType = CU_MEMORYTYPE_HOST;
    down.dstHost = box;
    down.dstPitch = 64;
    down.dstXInBytes = 3;
    down.dstY = 2;
    down.WidthInBytes = 40;
    down.Height = 10;
    CHECK(cuMemcpy2DAsync(&down, stream));
    CHECK(cuStreamSynchronize(stream));
    int wrong = 0;
    for (int y = 0; y < 16; y++)
        for (int x = 0; x < 64; x++) {
            bool inside = y >= 2 && y < 12 && x >= 3 && x < 43;
            unsigned char want = inside ? host[(y - 2 + 5) * width + (x - 3 + 8)] : 0xee;
            wrong += box[y * 64 + x] != want;
        }
    printf("2D box copied through pitched memory: wrong %d\n", wrong);
    down.srcPitch = 10;  // narrower than a row
    printf("a pitch narrower than the width fails: %d\n", cuMemcpy2D(&down) != CUDA_SUCCESS);

    CHECK(cuMemFree(pitched));
    CHECK(cuMemFree(d));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(back);
    free(host);
    return 0;
}
