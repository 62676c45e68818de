// blas: what a cuBLAS call costs, as `metric value` lines (bench/blas.sh runs it natively and
// under pilot side by side and prints the ratios):
//   sgemm_issue_us    host time per cublasSgemm of 64x64 matrices, N back to back on a stream,
//                     timed to the end of the stream synchronize after the last
//   sgemm_sync_us     median of M single Sgemm(64x64) + cudaStreamSynchronize
//   sgemm_1k_us       per cublasSgemm of 1024x1024 matrices (the GPU's time dominates)
//   sdot_us           median of M cublasSdot(4096) to the host (a synchronous call)
//   lt_heuristic_us   median of M cublasLtMatmulAlgoGetHeuristic for one Linear-like shape
// Usage: blas [N (20000)] [M (2000)]. Exits non-zero on any error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "../tests/apps/cublas_decls.h"

static double now_us()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 20000, m = argc > 2 ? atoi(argv[2]) : 2000;
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    BLAS(cublasSetStream(h, s));
    float *a, *b, *c, *x;
    const int big = 1024;
    CHECK(cudaMalloc(&a, (size_t)big * big * 4));
    CHECK(cudaMalloc(&b, (size_t)big * big * 4));
    CHECK(cudaMalloc(&c, (size_t)big * big * 4));
    CHECK(cudaMalloc(&x, 4096 * 4));
    CHECK(cudaMemset(a, 0, (size_t)big * big * 4));
    CHECK(cudaMemset(b, 0, (size_t)big * big * 4));
    CHECK(cudaMemset(x, 0, 4096 * 4));
    float one = 1, zero = 0;
    for (int i = 0; i < 100; i++) // warm up
        BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 64, &one, a, 64, b, 64, &zero, c, 64));
    CHECK(cudaStreamSynchronize(s));
    double t0 = now_us();
    for (int i = 0; i < n; i++)
        BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 64, &one, a, 64, b, 64, &zero, c, 64));
    CHECK(cudaStreamSynchronize(s));
    printf("sgemm_issue_us %.3f\n", (now_us() - t0) / n);
    std::vector<double> t(m);
    for (int i = 0; i < m; i++) {
        double t1 = now_us();
        BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 64, &one, a, 64, b, 64, &zero, c, 64));
        CHECK(cudaStreamSynchronize(s));
        t[i] = now_us() - t1;
    }
    printf("sgemm_sync_us %.3f\n", median(t));
    const int k = 200;
    t0 = now_us();
    for (int i = 0; i < k; i++)
        BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, big, big, big, &one, a, big, b, big, &zero, c, big));
    CHECK(cudaStreamSynchronize(s));
    printf("sgemm_1k_us %.3f\n", (now_us() - t0) / k);
    float r;
    for (int i = 0; i < m; i++) {
        double t1 = now_us();
        BLAS(cublasSdot(h, 4096, x, 1, x, 1, &r));
        t[i] = now_us() - t1;
    }
    printf("sdot_us %.3f\n", median(t));
    cublasLtHandle_t lt = (cublasLtHandle_t)h; // as PyTorch: the cuBLAS handle serves cuBLASLt
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 256, 512, 256));
    BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 512, 64, 512));
    BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 256, 64, 256));
    BLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = 1 << 22;
    BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res;
    int got = 0;
    for (int i = 0; i < m; i++) {
        double t1 = now_us();
        BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &got));
        t[i] = now_us() - t1;
    }
    printf("lt_heuristic_us %.3f\n", median(t));
    BLAS(cublasDestroy(h));
    return 0;
}
