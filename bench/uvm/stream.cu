// stream: a streaming vector op over three managed float arrays of --bytes in all (default
// 2GiB), a[i] += b[i] * c[i] once per pass (default 2000 passes), a = 0, b = 1, c = i % 8 set by a
// kernel first; then a kernel checks a[i] == passes * (i % 8) for every i. Its working set is all
// of its memory, every pass. Prints the uvm line (uvm.h).
#include "uvm.h"

__global__ void init(float *a, float *b, float *c, size_t n)
{
    FOR_EACH(i, n) {
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = (float)(i % 8);
    }
}

__global__ void fma_pass(float *a, const float *b, const float *c, size_t n)
{
    FOR_EACH(i, n) a[i] += b[i] * c[i];
}

__global__ void check(const float *a, size_t n, float passes, unsigned long long *wrong)
{
    FOR_EACH(i, n) if (a[i] != passes * (float)(i % 8)) atomicAdd(wrong, 1ull);
}

int main(int argc, char **argv)
{
    struct uvm_opts o = uvm_parse(argc, argv, "a += b * c over three managed float arrays of "
                                  "SIZE bytes in all", (size_t)2 << 30, 2000);
    size_t n = o.bytes / 12;
    const unsigned T = 256, B = uvm_blocks(n, T);
    double t_start = now_s();
    float *a, *b, *c;
    unsigned long long *wrong;
    CHECK(cudaMallocManaged(&a, n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&b, n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&c, n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&wrong, sizeof *wrong, cudaMemAttachGlobal));
    *wrong = 0;
    init<<<B, T>>>(a, b, c, n);
    CHECK(cudaDeviceSynchronize());
    long passes = 0;
    double t0 = now_s();
    while (uvm_more(&o, passes, t0) && passes < (1 << 20)) {  // 7 * passes stays exact
        fma_pass<<<B, T>>>(a, b, c, n);
        CHECK(cudaDeviceSynchronize());
        passes++;
    }
    double kernel_s = now_s() - t0;
    check<<<B, T>>>(a, n, (float)passes, wrong);
    CHECK(cudaDeviceSynchronize());
    int ok = *wrong == 0;
    if (!ok) fprintf(stderr, "stream: %llu of %zu elements wrong\n", *wrong, n);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    CHECK(cudaFree(wrong));
    uvm_report("stream", n * 12, passes, t_start, kernel_s, "", ok);
    return ok ? 0 : 1;
}
