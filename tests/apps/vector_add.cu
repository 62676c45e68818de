// vector_add: c = a + b over 1<<20 floats, then two partial launches that must only touch
// the elements their grid and bounds check allow. Prints checksums and PASS/FAIL.
// Expected lines are recomputed independently in tests/apps/test_apps.py.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

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

__global__ void vadd(const float *a, const float *b, float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}

static double checksum(const float *c, int n)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += (double)c[i];
    return sum;
}

int main(void)
{
    const int n = 1 << 20;
    const size_t bytes = (size_t)n * sizeof(float);
    float *a = (float *)malloc(bytes), *b = (float *)malloc(bytes), *c = (float *)malloc(bytes);
    if (!a || !b || !c) {
        printf("host allocation failed\nFAIL\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        a[i] = (float)i * 0.1f;
        b[i] = (float)(i % 1024) * 1.5f;
    }

    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));

    int failed = 0;

    // Full launch: one thread per element.
    const int threads = 256;
    vadd<<<(n + threads - 1) / threads, threads>>>(da, db, dc, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
    long mismatches = 0;
    for (int i = 0; i < n; i++)
        if (c[i] != a[i] + b[i])
            mismatches++;
    printf("n %d\n", n);
    printf("c[1] %.9g\n", c[1]);
    printf("c[777777] %.9g\n", c[777777]);
    printf("c[n-1] %.9g\n", c[n - 1]);
    printf("mismatches %ld\n", mismatches);
    printf("checksum %.17g\n", checksum(c, n));
    failed |= mismatches != 0;

    // Partial launches: the grid covers only 384 elements; then 512 threads with n=300
    // starting at element 1000 (the bounds check stops the rest). Everything else stays 0.
    CHECK(cudaMemset(dc, 0, bytes));
    vadd<<<3, 128>>>(da, db, dc, n);
    CHECK(cudaGetLastError());
    vadd<<<2, 256>>>(da + 1000, db + 1000, dc + 1000, 300);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
    long written = 0, wrong = 0;
    for (int i = 0; i < n; i++) {
        int covered = i < 384 || (i >= 1000 && i < 1300);
        float want = covered ? a[i] + b[i] : 0.0f;
        if (c[i] != want)
            wrong++;
        if (c[i] != 0.0f)
            written++;
    }
    printf("partial_nonzero %ld\n", written);
    printf("partial_wrong %ld\n", wrong);
    printf("partial_checksum %.17g\n", checksum(c, n));
    failed |= wrong != 0;

    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    free(a);
    free(b);
    free(c);
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed ? 1 : 0;
}
