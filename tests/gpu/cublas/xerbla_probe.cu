// What cuBLAS prints for each bad argument of the GEMM family (its xerbla line: function name and
// argument number), natively: the table shim/libs/cublas_api.c reproduces. Run on the GPU machine:
//   nvcc -o xerbla_probe xerbla_probe.cu -lcublas && ./xerbla_probe
#include <cublas_v2.h>
#include <cstdio>

int main()
{
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        return 1;
    float f = 1;
    double d = 1;
    __half hf;
    // bad: 0 transa, 1 transb, 2 m, 3 n, 4 k, 5 lda, 6 ldb, 7 ldc, 8 batch
    for (int bad = 0; bad < 9; bad++) {
        cublasOperation_t ta = bad == 0 ? (cublasOperation_t)7 : CUBLAS_OP_N;
        cublasOperation_t tb = bad == 1 ? (cublasOperation_t)7 : CUBLAS_OP_N;
        int m = bad == 2 ? -1 : 8, n = bad == 3 ? -1 : 8, k = bad == 4 ? -1 : 8;
        int lda = bad == 5 ? 4 : 8, ldb = bad == 6 ? 4 : 8, ldc = bad == 7 ? 4 : 8;
        int batch = bad == 8 ? -1 : 2;
        std::printf("== bad %d\n", bad);
        std::fflush(stdout);
        if (bad < 8) {
            cublasSgemm(h, ta, tb, m, n, k, &f, nullptr, lda, nullptr, ldb, &f, nullptr, ldc);
            cublasDgemm(h, ta, tb, m, n, k, &d, nullptr, lda, nullptr, ldb, &d, nullptr, ldc);
            cublasHgemm(h, ta, tb, m, n, k, &hf, nullptr, lda, nullptr, ldb, &hf, nullptr, ldc);
            cublasGemmEx(h, ta, tb, m, n, k, &f, nullptr, CUDA_R_32F, lda, nullptr, CUDA_R_32F, ldb,
                         &f, nullptr, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        }
        cublasSgemmStridedBatched(h, ta, tb, m, n, k, &f, nullptr, lda, 64, nullptr, ldb, 64, &f,
                                  nullptr, ldc, 64, batch);
        cublasDgemmStridedBatched(h, ta, tb, m, n, k, &d, nullptr, lda, 64, nullptr, ldb, 64, &d,
                                  nullptr, ldc, 64, batch);
        cublasHgemmStridedBatched(h, ta, tb, m, n, k, &hf, nullptr, lda, 64, nullptr, ldb, 64, &hf,
                                  nullptr, ldc, 64, batch);
        cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &f, nullptr, CUDA_R_32F, lda, 64, nullptr,
                                   CUDA_R_32F, ldb, 64, &f, nullptr, CUDA_R_32F, ldc, 64, batch,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        std::fflush(stdout);
    }
    // the generic path's families: each check of shim/tables/cublas_families.tsv once
    std::printf("== gemv\n");
    std::fflush(stdout);
    cublasOperation_t bad = (cublasOperation_t)7, N = CUBLAS_OP_N;
    cublasSgemv(h, bad, 4, 4, &f, nullptr, 4, nullptr, 1, &f, nullptr, 1);
    cublasSgemv(h, N, -1, 4, &f, nullptr, 4, nullptr, 1, &f, nullptr, 1);
    cublasSgemv(h, N, 4, -1, &f, nullptr, 4, nullptr, 1, &f, nullptr, 1);
    cublasSgemv(h, N, 4, 4, &f, nullptr, 2, nullptr, 1, &f, nullptr, 1);
    cublasSgemv(h, N, 4, 4, &f, nullptr, 4, nullptr, 0, &f, nullptr, 1);
    cublasDgemv(h, N, 4, 4, &d, nullptr, 4, nullptr, 1, &d, nullptr, 0);
    std::printf("== ger\n");
    std::fflush(stdout);
    cublasSger(h, -1, 4, &f, nullptr, 1, nullptr, 1, nullptr, 4);
    cublasSger(h, 4, 4, &f, nullptr, 0, nullptr, 1, nullptr, 4);
    cublasDger(h, 4, 4, &d, nullptr, 1, nullptr, 1, nullptr, 2);
    std::printf("== geam\n");
    std::fflush(stdout);
    cublasSgeam(h, bad, N, 4, 4, &f, nullptr, 4, &f, nullptr, 4, nullptr, 4);
    cublasSgeam(h, N, N, 4, 4, &f, nullptr, 2, &f, nullptr, 4, nullptr, 4);
    cublasSgeam(h, N, N, 4, 4, &f, nullptr, 4, &f, nullptr, 2, nullptr, 4);
    cublasDgeam(h, N, N, 4, 4, &d, nullptr, 4, &d, nullptr, 4, nullptr, 2);
    std::printf("== trsm\n");
    std::fflush(stdout);
    cublasStrsm(h, (cublasSideMode_t)5, CUBLAS_FILL_MODE_LOWER, N, CUBLAS_DIAG_UNIT, 4, 4, &f, nullptr, 4, nullptr, 4);
    cublasStrsm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, N, CUBLAS_DIAG_UNIT, 4, 4, &f, nullptr, 2, nullptr, 4);
    cublasDtrsm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, N, CUBLAS_DIAG_UNIT, 4, 4, &d, nullptr, 4, nullptr, 2);
    std::printf("== syrk\n");
    std::fflush(stdout);
    cublasSsyrk(h, CUBLAS_FILL_MODE_UPPER, bad, 4, 4, &f, nullptr, 4, &f, nullptr, 4);
    cublasSsyrk(h, CUBLAS_FILL_MODE_UPPER, N, 4, 4, &f, nullptr, 2, &f, nullptr, 4);
    cublasDsyrk(h, CUBLAS_FILL_MODE_UPPER, N, 4, 4, &d, nullptr, 4, &d, nullptr, 2);
    std::printf("== batched and complex\n");
    std::fflush(stdout);
    cuComplex c1 = {1, 0};
    cuDoubleComplex z1 = {1, 0};
    cublasCgemm(h, N, N, 4, 4, 4, &c1, nullptr, 2, nullptr, 4, &c1, nullptr, 4);
    cublasZgemm(h, N, N, 4, 4, 4, &z1, nullptr, 4, nullptr, 4, &z1, nullptr, 2);
    cublasCgemmStridedBatched(h, N, N, 4, 4, 4, &c1, nullptr, 4, 16, nullptr, 4, 16, &c1, nullptr, 4, 16, -1);
    cublasSgemmBatched(h, N, N, 4, 4, 4, &f, nullptr, 2, nullptr, 4, &f, nullptr, 4, 2);
    cublasSgemmBatched(h, N, N, 4, 4, 4, &f, nullptr, 4, nullptr, 4, &f, nullptr, 4, -1);
    cublasDgemmBatched(h, N, N, 4, 4, 4, &d, nullptr, 4, nullptr, 2, &d, nullptr, 4, 2);
    cublasGemmBatchedEx(h, N, N, 4, 4, 4, &f, nullptr, CUDA_R_32F, 2, nullptr, CUDA_R_32F, 4, &f,
                        nullptr, CUDA_R_32F, 4, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cublasGemmBatchedEx(h, N, N, 4, 4, 4, &f, nullptr, CUDA_R_32F, 4, nullptr, CUDA_R_32F, 4, &f,
                        nullptr, CUDA_R_32F, 4, -1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    std::printf("== level 1 with n < 0\n");
    std::fflush(stdout);
    float r = 5;
    int ri = 5;
    cublasStatus_t st = cublasSdot(h, -1, nullptr, 1, nullptr, 1, &r);
    std::printf("sdot: %d result %g\n", (int)st, r);
    r = 5;
    st = cublasSnrm2(h, -1, nullptr, 1, &r);
    std::printf("snrm2: %d result %g\n", (int)st, r);
    st = cublasIsamax(h, -1, nullptr, 1, &ri);
    std::printf("isamax: %d result %d\n", (int)st, ri);
    st = cublasSaxpy(h, -1, &f, nullptr, 1, nullptr, 1);
    std::printf("saxpy: %d\n", (int)st);
    std::fflush(stdout);
    cublasDestroy(h);
    return 0;
}
