// memset: cudaMemset and cudaMemsetAsync over several sizes, offsets and values (values above
// 255 or negative set the low byte, as CUDA does). Each case first fills the allocation with a
// known pattern by a copy, sets a range, copies everything back and checks that exactly the
// range changed. One line per case and PASS/FAIL.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) {                                               \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_),       \
                   __FILE__, __LINE__, #call);                                   \
            printf("FAIL\n");                                                    \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#define SLACK 64  // bytes of the allocation past offset + size

static const size_t sizes[] = {0, 1, 7, 4096, 65537, (1u << 20) + 3};
static const size_t offsets[] = {0, 1, 13};
static const int values[] = {0, 0x7f, 0xff, 0x1ab, -1, 256, 0x5a5a5a01};

static unsigned char background(size_t i)
{
    return (unsigned char)(i * 7 + 3);
}

int main(void)
{
    const size_t cap = sizes[sizeof sizes / sizeof sizes[0] - 1] + 13 + SLACK;
    unsigned char *init = (unsigned char *)malloc(cap);
    unsigned char *back = (unsigned char *)malloc(cap);
    if (!init || !back) {
        printf("host allocation failed\nFAIL\n");
        return 1;
    }
    for (size_t i = 0; i < cap; i++)
        init[i] = background(i);

    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    int failed = 0, ncase = 0;
    for (int async = 0; async < 2; async++) {
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++) {
                const size_t size = sizes[si], off = offsets[oi];
                const int value = values[ncase % (sizeof values / sizeof values[0])];
                const size_t total = off + size + SLACK;
                ncase++;

                unsigned char *dev;
                CHECK(cudaMalloc(&dev, total));
                CHECK(cudaMemcpy(dev, init, total, cudaMemcpyHostToDevice));
                if (async) {
                    // cudaMemcpy from pageable memory may return before the device write has
                    // landed, and a non-blocking stream does not wait for the legacy stream.
                    CHECK(cudaDeviceSynchronize());
                    CHECK(cudaMemsetAsync(dev + off, value, size, stream));
                    CHECK(cudaStreamSynchronize(stream));
                } else {
                    CHECK(cudaMemset(dev + off, value, size));
                }
                memset(back, 0, total);
                CHECK(cudaMemcpy(back, dev, total, cudaMemcpyDeviceToHost));
                CHECK(cudaFree(dev));

                const unsigned char low = (unsigned char)(value & 0xff);
                size_t wrong = 0, first = 0;
                for (size_t i = 0; i < total; i++) {
                    unsigned char want = (i >= off && i < off + size) ? low : background(i);
                    if (back[i] != want && wrong++ == 0)
                        first = i;
                }
                printf("%s size %zu off %zu value %d -> 0x%02x: %s", async ? "async" : "sync",
                       size, off, value, low, wrong ? "WRONG" : "ok");
                if (wrong)
                    printf(" (%zu bytes, first at %zu)", wrong, first);
                printf("\n");
                failed |= wrong != 0;
            }
        }
    }

    CHECK(cudaStreamDestroy(stream));
    free(init);
    free(back);
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed ? 1 : 0;
}
