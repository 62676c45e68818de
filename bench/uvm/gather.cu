// gather: random-access gathers, like a BFS frontier expansion: a managed index array idx (a
// permutation, idx[i] = (i * P + Q) mod n with P prime to n), values val[j] = j % 1024 and sums
// acc, 12 bytes an element, --bytes in all (default 2GiB); one pass does acc[i] += val[idx[i]]
// for every i (default 1000 passes), so each pass reads val at scattered pages. Check: acc[i] ==
// passes * (idx[i] % 1024) for every i, by a kernel. Prints the uvm line (uvm.h).
#include "uvm.h"

__global__ void init(unsigned *idx, float *val, float *acc, size_t n, size_t p, size_t q)
{
    FOR_EACH(i, n) {
        idx[i] = (unsigned)((i * p + q) % n);
        val[i] = (float)(i % 1024);
        acc[i] = 0.0f;
    }
}

__global__ void gather(const unsigned *idx, const float *val, float *acc, size_t n)
{
    FOR_EACH(i, n) acc[i] += val[idx[i]];
}

__global__ void check(const unsigned *idx, const float *acc, size_t n, float passes,
                      unsigned long long *wrong)
{
    FOR_EACH(i, n) if (acc[i] != passes * (float)(idx[i] % 1024)) atomicAdd(wrong, 1ull);
}

static size_t gcd(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int main(int argc, char **argv)
{
    struct uvm_opts o = uvm_parse(argc, argv, "acc[i] += val[idx[i]] over a random permutation, "
                                  "SIZE bytes of managed memory in all", (size_t)2 << 30, 1000);
    size_t n = o.bytes / 12;
    if (n < 2 || n >= (size_t)1 << 32) {
        fprintf(stderr, "gather: --bytes gives %zu elements; 2 to 2^32-1 are allowed\n", n);
        return 2;
    }
    size_t p = 2654435761u % n;
    while (gcd(p, n) != 1) p++;
    const unsigned T = 256, B = uvm_blocks(n, T);
    double t_start = now_s();
    unsigned *idx;
    float *val, *acc;
    unsigned long long *wrong;
    CHECK(cudaMallocManaged(&idx, n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&val, n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&acc, n * 4, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&wrong, sizeof *wrong, cudaMemAttachGlobal));
    *wrong = 0;
    init<<<B, T>>>(idx, val, acc, n, p, n / 3);
    CHECK(cudaDeviceSynchronize());
    long passes = 0;
    double t0 = now_s();
    while (uvm_more(&o, passes, t0) && passes < (1 << 14)) {  // 1023 * passes stays exact
        gather<<<B, T>>>(idx, val, acc, n);
        CHECK(cudaDeviceSynchronize());
        passes++;
    }
    double kernel_s = now_s() - t0;
    check<<<B, T>>>(idx, acc, n, (float)passes, wrong);
    CHECK(cudaDeviceSynchronize());
    int ok = *wrong == 0;
    if (!ok) fprintf(stderr, "gather: %llu of %zu elements wrong\n", *wrong, n);
    CHECK(cudaFree(idx));
    CHECK(cudaFree(val));
    CHECK(cudaFree(acc));
    CHECK(cudaFree(wrong));
    uvm_report("gather", n * 12, passes, t_start, kernel_s, "", ok);
    return ok ? 0 : 1;
}
