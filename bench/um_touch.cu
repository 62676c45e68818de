// um_touch: GPU first touch of host-written managed pages. PAGES pages (4 KiB each) of managed
// memory are written on the host, then one kernel reads one float from each page, timed with
// events: the pages in order, then, in a fresh allocation, in a random order. Each round uses
// new allocations (so every touch is a first touch). Prints `metric value` lines:
//   um_touch_seq_ms   median over ROUNDS of the kernel's time, pages in order
//   um_touch_rand_ms  the same, pages in a fixed random permutation
// Usage: um_touch [PAGES (512)] [ROUNDS (20)]. Exits non-zero on a CUDA error or a wrong sum.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include "check.h"

#define PAGE_FLOATS 1024  // 4 KiB

__global__ void touch_pages(const float *x, const int *order, int pages, float *out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < pages)
        out[i] = x[(size_t)order[i] * PAGE_FLOATS];
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float one_round(int pages, const int *d_order, float *d_out, float *host_out)
{
    float *x;
    CHECK(cudaMallocManaged(&x, (size_t)pages * PAGE_FLOATS * sizeof(float), cudaMemAttachGlobal));
    for (int p = 0; p < pages; p++)  // the host writes every page
        for (int j = 0; j < PAGE_FLOATS; j += 256)
            x[(size_t)p * PAGE_FLOATS + j] = (float)p;
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a, 0));
    touch_pages<<<(pages + 127) / 128, 128>>>(x, d_order, pages, d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(b, 0));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaMemcpy(host_out, d_out, (size_t)pages * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    CHECK(cudaFree(x));
    return ms;
}

int main(int argc, char **argv)
{
    const int pages = argc > 1 ? atoi(argv[1]) : 512, rounds = argc > 2 ? atoi(argv[2]) : 20;
    if (pages < 1 || rounds < 1) {
        fprintf(stderr, "usage: %s [PAGES>0] [ROUNDS>0]\n", argv[0]);
        return 2;
    }
    int *order = (int *)malloc((size_t)pages * sizeof(int));
    float *host_out = (float *)malloc((size_t)pages * sizeof(float));
    float *t = (float *)malloc((size_t)rounds * sizeof(float));
    if (!order || !host_out || !t)
        return 1;
    int *d_order;
    float *d_out;
    CHECK(cudaMalloc(&d_order, (size_t)pages * sizeof(int)));
    CHECK(cudaMalloc(&d_out, (size_t)pages * sizeof(float)));
    srand(12345);
    for (int mode = 0; mode < 2; mode++) {
        for (int p = 0; p < pages; p++)
            order[p] = p;
        if (mode == 1)
            for (int p = pages - 1; p > 0; p--) {  // Fisher-Yates, fixed seed
                int q = rand() % (p + 1), tmp = order[p];
                order[p] = order[q];
                order[q] = tmp;
            }
        CHECK(cudaMemcpy(d_order, order, (size_t)pages * sizeof(int), cudaMemcpyHostToDevice));
        one_round(pages, d_order, d_out, host_out);  // warm-up: context, module, first launch
        for (int r = 0; r < rounds; r++) {
            t[r] = one_round(pages, d_order, d_out, host_out);
            for (int p = 0; p < pages; p++)
                if (host_out[p] != (float)order[p]) {
                    fprintf(stderr, "um_touch: page %d read %f, expected %d\n", order[p], host_out[p],
                            order[p]);
                    return 1;
                }
        }
        qsort(t, (size_t)rounds, sizeof *t, cmp_float);
        float med = rounds % 2 ? t[rounds / 2] : 0.5f * (t[rounds / 2 - 1] + t[rounds / 2]);
        printf("%s %.4f\n", mode == 0 ? "um_touch_seq_ms" : "um_touch_rand_ms", med);
    }
    CHECK(cudaFree(d_order));
    CHECK(cudaFree(d_out));
    return 0;
}
