// What cuBLAS prints for each bad argument of the GEMM family (its xerbla line: function name and
// argument number), natively: the table shim/cublas_api.c reproduces. Run on the GPU machine:
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
    cublasDestroy(h);
    return 0;
}
