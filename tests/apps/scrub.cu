// scrub: device memory one program frees never reaches another program with its contents.
//   scrub fill   allocates each size, fills it with 0xA5, frees it; fills a __device__ array too
//   scrub read   allocates the same sizes and counts the bytes that are not zero
// Run `fill` and then `read` as two processes. Natively each has its own CUDA context, whose
// memory the driver clears; under pilot both are tenants of the daemon's one context, whose
// allocator hands out freed memory as it was, so pilotd must clear it. The same holds for a
// module's variables, whose memory goes back to the allocator when the module is unloaded at the
// end of the fill process (the 64 KiB size below is the array's).
#include <string.h>

#include "self_check.h"

__device__ unsigned char g_secret[1 << 16];

static const size_t SIZES[] = {4096, 1 << 16, 1 << 20, (3 << 20) + 5};
static const int NSIZES = sizeof SIZES / sizeof SIZES[0];

int main(int argc, char **argv)
{
    int fill = argc > 1 && strcmp(argv[1], "fill") == 0;
    if (!fill && !(argc > 1 && strcmp(argv[1], "read") == 0)) {
        fprintf(stderr, "usage: scrub fill|read\n");
        return 2;
    }
    size_t nonzero = 0;
    for (int i = 0; i < NSIZES; i++) {
        unsigned char *d;
        CHECK(cudaMalloc(&d, SIZES[i]));
        if (fill) {
            CHECK(cudaMemset(d, 0xA5, SIZES[i]));
            CHECK(cudaDeviceSynchronize());
        } else {
            unsigned char *h = (unsigned char *)malloc(SIZES[i]);
            CHECK(cudaMemcpy(h, d, SIZES[i], cudaMemcpyDeviceToHost));
            for (size_t b = 0; b < SIZES[i]; b++)
                nonzero += h[b] != 0;
            free(h);
        }
        CHECK(cudaFree(d));
    }
    if (fill) {
        static unsigned char secret[sizeof g_secret];
        memset(secret, 0xA5, sizeof secret);
        CHECK(cudaMemcpyToSymbol(g_secret, secret, sizeof secret));
        CHECK(cudaDeviceSynchronize());
    }
    if (fill)
        printf("fill: %d allocations written and freed, a module variable written\n", NSIZES);
    else
        printf("read: %d allocations, nonzero bytes %zu\n", NSIZES, nonzero);
    return 0;
}
