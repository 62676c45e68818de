// jacobi: a 2D five-point Jacobi stencil on a periodic N x N managed float grid (two grids of
// --bytes in all, default 2GiB; N even), out = average of the four neighbours, one sweep per pass
// (default 2500 passes), grids swapped. The grid starts as 3 + (-1)^(i+j), which the sweep maps
// exactly to 3 - (-1)^(i+j), so after P passes every cell must be 3 + (-1)^(i+j+P): a kernel
// checks all of them. Prints the uvm line (uvm.h).
#include "uvm.h"

__device__ float expected(size_t i, size_t j, long passes)
{
    return ((i + j + (size_t)passes) & 1) ? 2.0f : 4.0f;
}

__global__ void init(float *u, size_t n)
{
    FOR_EACH(k, n * n) u[k] = expected(k / n, k % n, 0);
}

__global__ void sweep(const float *in, float *out, size_t n)
{
    FOR_EACH(k, n * n) {
        size_t i = k / n, j = k % n;
        size_t up = (i + n - 1) % n, down = (i + 1) % n, left = (j + n - 1) % n, right = (j + 1) % n;
        out[k] = 0.25f * (in[up * n + j] + in[down * n + j] + in[i * n + left] + in[i * n + right]);
    }
}

__global__ void check(const float *u, size_t n, long passes, unsigned long long *wrong)
{
    FOR_EACH(k, n * n) if (u[k] != expected(k / n, k % n, passes)) atomicAdd(wrong, 1ull);
}

int main(int argc, char **argv)
{
    struct uvm_opts o = uvm_parse(argc, argv, "periodic 2D Jacobi sweeps over two managed grids "
                                  "of SIZE bytes in all", (size_t)2 << 30, 2500);
    size_t n = (size_t)sqrt((double)(o.bytes / 8)) & ~(size_t)1;
    if (n < 2) {
        fprintf(stderr, "jacobi: --bytes too small\n");
        return 2;
    }
    const unsigned T = 256, B = uvm_blocks(n * n, T);
    double t_start = now_s();
    float *u, *v;
    unsigned long long *wrong;
    CHECK(cudaMallocManaged(&u, n * n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&v, n * n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&wrong, sizeof *wrong, cudaMemAttachGlobal));
    *wrong = 0;
    init<<<B, T>>>(u, n);
    CHECK(cudaDeviceSynchronize());
    long passes = 0;
    double t0 = now_s();
    while (uvm_more(&o, passes, t0)) {
        sweep<<<B, T>>>(u, v, n);
        CHECK(cudaDeviceSynchronize());
        float *t = u;
        u = v;
        v = t;
        passes++;
    }
    double kernel_s = now_s() - t0;
    check<<<B, T>>>(u, n, passes, wrong);
    CHECK(cudaDeviceSynchronize());
    int ok = *wrong == 0;
    if (!ok) fprintf(stderr, "jacobi: %llu of %zu cells wrong\n", *wrong, n * n);
    CHECK(cudaFree(u));
    CHECK(cudaFree(v));
    CHECK(cudaFree(wrong));
    char extra[32];
    snprintf(extra, sizeof extra, " n=%zu", n);
    uvm_report("jacobi", n * n * 8, passes, t_start, kernel_s, extra, ok);
    return ok ? 0 : 1;
}
