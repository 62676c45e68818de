// cuBLAS and cuBLASLt as programs use them: handles, host-device matrix copies, the GEMM family
// (S/D, Ex with half inputs, strided batches, transposes, padded leading dimensions, device
// pointer mode, a stream and a workspace of the program's), cuBLASLt matmuls with a heuristic,
// a ReLU+bias epilogue, row-major and batched layouts, descriptors in the program's storage,
// and the statuses of bad arguments. Each result is checked against the CPU; only "ok" or
// "MISMATCH" and status names are printed, so the output is the same natively and under pilot
// (tests/gpu compares them on the H100).
//
// `cublas_gemm isolation` (under pilot only) passes a matrix that is not the program's memory:
// pilotd refuses the GEMM and the next synchronizing call reports the error.
#include <cuComplex.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cublas_decls.h"


// C = alpha op(A) op(B) + beta C, column-major, on the CPU in double precision.
static void ref_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const std::vector<double> &A,
                     int lda, const std::vector<double> &B, int ldb, double beta,
                     std::vector<double> &C, int ldc)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                double a = ta ? A[p + (size_t)i * lda] : A[i + (size_t)p * lda];
                double b = tb ? B[j + (size_t)p * ldb] : B[p + (size_t)j * ldb];
                s += a * b;
            }
            C[i + (size_t)j * ldc] = alpha * s + beta * C[i + (size_t)j * ldc];
        }
}

static std::vector<double> values(size_t n, int seed)
{
    std::vector<double> v(n);
    unsigned x = 2463534242u + (unsigned)seed * 7919u;
    for (auto &e : v) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        e = (double)(x % 2001) / 1000.0 - 1.0; // [-1, 1], exact in half precision to 3 digits
    }
    return v;
}

template <typename T> static std::vector<T> as(const std::vector<double> &v)
{
    return std::vector<T>(v.begin(), v.end());
}

static void verdict(const char *what, const std::vector<double> &want, const double *got,
                    size_t n, double tol)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = std::fmax(worst, std::fabs(want[i] - got[i]) / (1.0 + std::fabs(want[i])));
    std::printf("%s: %s\n", what, worst <= tol ? "ok" : "MISMATCH");
    if (worst > tol)
        std::fprintf(stderr, "%s: worst relative error %g > %g\n", what, worst, tol);
}

static int sgemm_cases(cublasHandle_t h)
{
    const int m = 37, n = 29, k = 45, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
            auto A = values((size_t)lda * (ta ? m : k), 1), B = values((size_t)ldb * (tb ? k : n), 2);
            auto C = values((size_t)ldc * n, 3);
            auto fa = as<float>(A), fb = as<float>(B), fc = as<float>(C);
            float *dA, *dB, *dC;
            CHECK(cudaMalloc(&dA, fa.size() * 4));
            CHECK(cudaMalloc(&dB, fb.size() * 4));
            CHECK(cudaMalloc(&dC, fc.size() * 4));
            BLAS(cublasSetMatrix(lda, ta ? m : k, 4, fa.data(), lda, dA, lda));
            BLAS(cublasSetMatrix(ldb, tb ? k : n, 4, fb.data(), ldb, dB, ldb));
            BLAS(cublasSetMatrix(ldc, n, 4, fc.data(), ldc, dC, ldc));
            float alpha = 1.5f, beta = -0.5f;
            BLAS(cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m,
                             n, k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc));
            BLAS(cublasGetMatrix(ldc, n, 4, dC, ldc, fc.data(), ldc));
            ref_gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
            std::vector<double> got(fc.begin(), fc.end());
            char what[64];
            std::snprintf(what, sizeof what, "sgemm %c%c", ta ? 'T' : 'N', tb ? 'T' : 'N');
            verdict(what, C, got.data(), got.size(), 1e-4);
            cudaFree(dA), cudaFree(dB), cudaFree(dC);
        }
    return 0;
}

static int dgemm_device_scalars(cublasHandle_t h, cudaStream_t stream)
{
    const int m = 64, n = 48, k = 33;
    auto A = values((size_t)m * k, 4), B = values((size_t)k * n, 5), C = values((size_t)m * n, 6);
    double *dA, *dB, *dC, *dScalars;
    CHECK(cudaMalloc(&dA, A.size() * 8));
    CHECK(cudaMalloc(&dB, B.size() * 8));
    CHECK(cudaMalloc(&dC, C.size() * 8));
    CHECK(cudaMalloc(&dScalars, 16));
    double scalars[2] = {0.75, 2.0};
    CHECK(cudaMemcpy(dA, A.data(), A.size() * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, B.data(), B.size() * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dC, C.data(), C.size() * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dScalars, scalars, 16, cudaMemcpyHostToDevice));
    BLAS(cublasSetStream(h, stream));
    BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
    BLAS(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, dScalars, dA, m, dB, k, dScalars + 1, dC, m));
    BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    std::vector<double> got(C.size());
    CHECK(cudaMemcpyAsync(got.data(), dC, got.size() * 8, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    BLAS(cublasSetStream(h, 0));
    ref_gemm(false, false, m, n, k, 0.75, A, m, B, k, 2.0, C, m);
    verdict("dgemm device scalars, stream", C, got.data(), got.size(), 1e-12);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dScalars);
    return 0;
}

static int gemm_ex_half(cublasHandle_t h)
{
    const int m = 64, n = 32, k = 128;
    auto A = values((size_t)k * m, 7), B = values((size_t)k * n, 8);
    std::vector<__half> ha(A.size()), hb(B.size());
    for (size_t i = 0; i < A.size(); i++)
        ha[i] = __double2half(A[i]), A[i] = __half2float(ha[i]);
    for (size_t i = 0; i < B.size(); i++)
        hb[i] = __double2half(B[i]), B[i] = __half2float(hb[i]);
    __half *dA, *dB;
    float *dC, *ws;
    CHECK(cudaMalloc(&dA, ha.size() * 2));
    CHECK(cudaMalloc(&dB, hb.size() * 2));
    CHECK(cudaMalloc(&dC, (size_t)m * n * 4));
    CHECK(cudaMalloc(&ws, 4 << 20));
    CHECK(cudaMemcpy(dA, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    BLAS(cublasSetWorkspace(h, ws, 4 << 20));
    float alpha = 1.0f, beta = 0.0f;
    CHECK(cudaMemset(dC, 0xff, (size_t)m * n * 4)); // NaNs: beta == 0 must not read C
    BLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16F, k, dB,
                      CUDA_R_16F, k, &beta, dC, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    std::vector<float> fc((size_t)m * n);
    CHECK(cudaMemcpy(fc.data(), dC, fc.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> C((size_t)m * n, 0.0), got(fc.begin(), fc.end());
    ref_gemm(true, false, m, n, k, 1.0, A, k, B, k, 0.0, C, m);
    verdict("gemmEx half->float, beta 0 over NaN, workspace", C, got.data(), got.size(), 1e-3);
    BLAS(cublasSetWorkspace(h, nullptr, 0)); // the handle lets go of it before it is freed
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(ws);
    return 0;
}

static int strided_batched(cublasHandle_t h)
{
    const int m = 16, n = 24, k = 20, batch = 3;
    const long long sa = (long long)m * k + 8, sb = (long long)k * n, sc = (long long)m * n + 5;
    auto A = values((size_t)sa * batch, 9), B = values((size_t)sb * batch, 10);
    auto C = values((size_t)sc * batch, 11);
    auto fa = as<float>(A), fb = as<float>(B), fc = as<float>(C);
    float *dA, *dB, *dC;
    CHECK(cudaMalloc(&dA, fa.size() * 4));
    CHECK(cudaMalloc(&dB, fb.size() * 4));
    CHECK(cudaMalloc(&dC, fc.size() * 4));
    CHECK(cudaMemcpy(dA, fa.data(), fa.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, fb.data(), fb.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dC, fc.data(), fc.size() * 4, cudaMemcpyHostToDevice));
    float alpha = 1.0f, beta = 1.0f;
    BLAS(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, dA, m, sa, dB, k,
                                   sb, &beta, dC, m, sc, batch));
    CHECK(cudaMemcpy(fc.data(), dC, fc.size() * 4, cudaMemcpyDeviceToHost));
    for (int b = 0; b < batch; b++) {
        std::vector<double> a(A.begin() + b * sa, A.begin() + b * sa + m * k);
        std::vector<double> bb(B.begin() + b * sb, B.begin() + b * sb + k * n);
        std::vector<double> c(C.begin() + b * sc, C.begin() + b * sc + m * n);
        ref_gemm(false, false, m, n, k, 1.0, a, m, bb, k, 1.0, c, m);
        std::copy(c.begin(), c.end(), C.begin() + b * sc);
    }
    std::vector<double> got(fc.begin(), fc.end());
    verdict("sgemm strided batched", C, got.data(), got.size(), 1e-4);
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    return 0;
}

// Pointer-array batches (cublasSgemmBatched) and a complex GEMM (cublasZgemm).
static int batched_and_complex(cublasHandle_t h)
{
    const int m = 12, n = 9, k = 7, batch = 4;
    std::vector<float *> ha(batch), hb(batch), hc(batch);
    std::vector<std::vector<double>> A(batch), B(batch), C(batch);
    for (int i = 0; i < batch; i++) {
        A[i] = values((size_t)m * k, 20 + i), B[i] = values((size_t)k * n, 30 + i);
        C[i] = values((size_t)m * n, 40 + i);
        auto fa = as<float>(A[i]), fb = as<float>(B[i]), fc = as<float>(C[i]);
        CHECK(cudaMalloc(&ha[i], fa.size() * 4));
        CHECK(cudaMalloc(&hb[i], fb.size() * 4));
        CHECK(cudaMalloc(&hc[i], fc.size() * 4));
        CHECK(cudaMemcpy(ha[i], fa.data(), fa.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(hb[i], fb.data(), fb.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(hc[i], fc.data(), fc.size() * 4, cudaMemcpyHostToDevice));
    }
    float **da, **db, **dc;
    CHECK(cudaMalloc(&da, batch * sizeof(float *)));
    CHECK(cudaMalloc(&db, batch * sizeof(float *)));
    CHECK(cudaMalloc(&dc, batch * sizeof(float *)));
    CHECK(cudaMemcpy(da, ha.data(), batch * sizeof(float *), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, hb.data(), batch * sizeof(float *), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dc, hc.data(), batch * sizeof(float *), cudaMemcpyHostToDevice));
    float alpha = 1.25f, beta = -1.0f;
    BLAS(cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, db, k, &beta, dc,
                            m, batch));
    bool all = true;
    for (int i = 0; i < batch; i++) {
        std::vector<float> got((size_t)m * n);
        CHECK(cudaMemcpy(got.data(), hc[i], got.size() * 4, cudaMemcpyDeviceToHost));
        ref_gemm(false, false, m, n, k, 1.25, A[i], m, B[i], k, -1.0, C[i], m);
        for (size_t j = 0; j < got.size(); j++)
            all &= std::fabs(got[j] - C[i][j]) <= 1e-4 * (1 + std::fabs(C[i][j]));
        cudaFree(ha[i]), cudaFree(hb[i]), cudaFree(hc[i]);
    }
    std::printf("sgemm batched (pointer arrays): %s\n", all ? "ok" : "MISMATCH");
    cudaFree(da), cudaFree(db), cudaFree(dc);
    // C = alpha A B with complex doubles: A 3x2, B 2x2, alpha = i
    double a[12] = {1, 0, 0, 1, 2, -1, 3, 0, 0, -2, 1, 1}, b[8] = {1, 1, 2, 0, 0, 1, 1, -1};
    double want[12];
    for (int j = 0; j < 2; j++)
        for (int r = 0; r < 3; r++) {
            double re = 0, im = 0;
            for (int p = 0; p < 2; p++) {
                double ar = a[2 * (r + 3 * p)], ai = a[2 * (r + 3 * p) + 1];
                double br = b[2 * (p + 2 * j)], bi = b[2 * (p + 2 * j) + 1];
                re += ar * br - ai * bi, im += ar * bi + ai * br;
            }
            want[2 * (r + 3 * j)] = -im, want[2 * (r + 3 * j) + 1] = re; // times i
        }
    double *dA, *dB, *dC;
    CHECK(cudaMalloc(&dA, sizeof a));
    CHECK(cudaMalloc(&dB, sizeof b));
    CHECK(cudaMalloc(&dC, sizeof want));
    CHECK(cudaMemcpy(dA, a, sizeof a, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, b, sizeof b, cudaMemcpyHostToDevice));
    cuDoubleComplex zi = {0, 1}, z0 = {0, 0};
    BLAS(cublasZgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 2, &zi, (cuDoubleComplex *)dA, 3,
                     (cuDoubleComplex *)dB, 2, &z0, (cuDoubleComplex *)dC, 3));
    double got[12];
    CHECK(cudaMemcpy(got, dC, sizeof got, cudaMemcpyDeviceToHost));
    bool same = true;
    for (int i = 0; i < 12; i++)
        same &= std::fabs(got[i] - want[i]) < 1e-12;
    std::printf("zgemm: %s\n", same ? "ok" : "MISMATCH");
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    return 0;
}

static int vectors(void)
{
    float host[12], back[12] = {0};
    for (int i = 0; i < 12; i++)
        host[i] = (float)i;
    float *d;
    CHECK(cudaMalloc(&d, 12 * sizeof(float)));
    CHECK(cudaMemset(d, 0, 12 * sizeof(float)));
    BLAS(cublasSetVector(4, 4, host, 3, d, 2)); // host[0,3,6,9] -> d[0,2,4,6]
    BLAS(cublasGetVector(4, 4, d, 2, back, 1));
    std::printf("strided vectors: %g %g %g %g\n", back[0], back[1], back[2], back[3]);
    std::printf("cublasSetVector incx 0: %s\n", cublasGetStatusName(cublasSetVector(4, 4, host, 0, d, 1)));
    std::printf("cublasSetMatrix lda < rows: %s\n",
                cublasGetStatusName(cublasSetMatrix(4, 2, 4, host, 3, d, 4)));
    cudaFree(d);
    return 0;
}

static int lt_matmul(cublasLtHandle_t lt)
{
    // D = relu(A B + bias) with A stored transposed (k x m, row-major as TRANSA), batched twice.
    const int m = 40, n = 24, k = 56, batch = 2;
    auto A = values((size_t)m * k * batch, 12), B = values((size_t)k * n * batch, 13);
    auto bias = values(m, 14);
    auto fa = as<float>(A), fb = as<float>(B), fbias = as<float>(bias);
    float *dA, *dB, *dD, *dBias, *ws;
    const size_t ws_size = 1 << 20;
    CHECK(cudaMalloc(&dA, fa.size() * 4));
    CHECK(cudaMalloc(&dB, fb.size() * 4));
    CHECK(cudaMalloc(&dD, (size_t)m * n * batch * 4));
    CHECK(cudaMalloc(&dBias, m * 4));
    CHECK(cudaMalloc(&ws, ws_size));
    CHECK(cudaMemcpy(dA, fa.data(), fa.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, fb.data(), fb.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dBias, fbias.data(), m * 4, cudaMemcpyHostToDevice));

    cublasLtMatmulDesc_t op;
    BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t trans = CUBLAS_OP_T;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans));
    BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dBias, sizeof dBias));
    cublasOperation_t readback = CUBLAS_OP_N;
    size_t written = 0;
    BLAS(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &readback, sizeof readback, &written));
    std::printf("lt transa read back: %d (%zu bytes)\n", (int)readback, written);

    cublasLtMatrixLayout_t la, lb, ld;
    BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, k, m, k)); // A^T stored: k x m
    BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, n)); // B row-major: ld = n
    cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
    BLAS(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
    cublasLtMatrixLayoutOpaque_t d_storage; // the program's own storage (cublasLtMatrixLayoutInit)
    ld = &d_storage;
    BLAS(cublasLtMatrixLayoutInit(ld, CUDA_R_32F, m, n, m));
    int32_t count = batch;
    int64_t strides[3] = {(int64_t)m * k, (int64_t)k * n, (int64_t)m * n};
    cublasLtMatrixLayout_t layouts[3] = {la, lb, ld};
    for (int i = 0; i < 3; i++) {
        BLAS(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        BLAS(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &strides[i], sizeof strides[i]));
    }
    cublasLtMatmulPreference_t pref;
    BLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t max_ws = ws_size;
    BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws));
    cublasLtMatmulHeuristicResult_t results[4];
    int returned = 0;
    BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 4, results, &returned));
    std::printf("lt heuristic returned at least one: %d, first usable: %d\n", returned >= 1,
                results[0].state == CUBLAS_STATUS_SUCCESS && results[0].workspaceSize <= ws_size);
    float alpha = 1.0f, beta = 0.0f;
    BLAS(cublasLtMatmul(lt, op, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, &results[0].algo,
                        ws, ws_size, 0));
    std::vector<float> fd((size_t)m * n * batch);
    CHECK(cudaMemcpy(fd.data(), dD, fd.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> want((size_t)m * n * batch);
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = bias[i];
                for (int p = 0; p < k; p++)
                    s += A[b * m * k + p + (size_t)i * k] * B[b * k * n + (size_t)p * n + j];
                want[b * m * n + i + (size_t)j * m] = s > 0 ? s : 0;
            }
    std::vector<double> got(fd.begin(), fd.end());
    verdict("lt matmul relu+bias, transposed A, row-major B, batched", want, got.data(), got.size(), 1e-4);
    // The same without an algorithm (the library picks one).
    BLAS(cublasLtMatmul(lt, op, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, nullptr, ws, ws_size, 0));
    CHECK(cudaMemcpy(fd.data(), dD, fd.size() * 4, cudaMemcpyDeviceToHost));
    got.assign(fd.begin(), fd.end());
    verdict("lt matmul, no algorithm given", want, got.data(), got.size(), 1e-4);
    std::printf("lt heuristic, 0 requested: %s\n",
                cublasGetStatusName(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 0, results, &returned)));
    BLAS(cublasLtMatmulPreferenceDestroy(pref));
    BLAS(cublasLtMatrixLayoutDestroy(la));
    BLAS(cublasLtMatrixLayoutDestroy(lb));
    BLAS(cublasLtMatmulDescDestroy(op));
    cudaFree(dA), cudaFree(dB), cudaFree(dD), cudaFree(dBias), cudaFree(ws);
    return 0;
}

// C = 2 A B + C by cublasSgemm, then D = C^T (geam), captured from a stream into a graph and
// launched three times (A changed between launches, on another stream the last time), as
// PyTorch's CUDA graphs capture their matmuls.
static int captured(cublasHandle_t h)
{
    const int n = 32;
    std::vector<float> a((size_t)n * n), b((size_t)n * n);
    for (int i = 0; i < n * n; i++)
        a[i] = (float)(i % 7) - 3, b[i] = (float)(i % 5) - 2;
    float *dA, *dB, *dC, *dD;
    CHECK(cudaMalloc(&dA, a.size() * 4));
    CHECK(cudaMalloc(&dB, b.size() * 4));
    CHECK(cudaMalloc(&dC, a.size() * 4));
    CHECK(cudaMalloc(&dD, a.size() * 4));
    CHECK(cudaMemcpy(dB, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dC, 0, a.size() * 4));
    cudaStream_t s, other;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    BLAS(cublasSetStream(h, s));
    float two = 2, one = 1, zero = 0;
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &two, dA, n, dB, n, &one, dC, n));
    BLAS(cublasSgeam(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, &one, dC, n, &zero, dD, n, dD, n));
    CHECK(cudaStreamEndCapture(s, &graph));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    std::printf("captured nodes: %s\n", nodes >= 2 ? "at least 2" : "fewer than 2");
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<double> C((size_t)n * n, 0.0);
    bool all = true;
    for (int round = 0; round < 3; round++) {
        for (auto &v : a)
            v += 1.0f;
        CHECK(cudaMemcpy(dA, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
        cudaStream_t on = round == 2 ? other : s;
        CHECK(cudaGraphLaunch(exec, on));
        CHECK(cudaStreamSynchronize(on));
        for (int j = 0; j < n; j++)
            for (int i = 0; i < n; i++) {
                double acc = 0;
                for (int k = 0; k < n; k++)
                    acc += (double)a[i + (size_t)k * n] * b[k + (size_t)j * n];
                C[i + (size_t)j * n] += 2 * acc;
            }
        std::vector<float> d(a.size());
        CHECK(cudaMemcpy(d.data(), dD, d.size() * 4, cudaMemcpyDeviceToHost));
        for (int j = 0; j < n; j++)
            for (int i = 0; i < n; i++)
                all &= std::fabs(d[i + (size_t)j * n] - C[j + (size_t)i * n]) <=
                       1e-4 * (1 + std::fabs(C[j + (size_t)i * n]));
    }
    std::printf("graph of cuBLAS calls, 3 launches: %s\n", all ? "ok" : "MISMATCH");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    BLAS(cublasSetStream(h, 0));
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
    cudaStreamDestroy(s), cudaStreamDestroy(other);
    return 0;
}

static int isolation(cublasHandle_t h)
{
    float *mine;
    CHECK(cudaMalloc(&mine, 64 * 64 * 4));
    float alpha = 1.0f, beta = 0.0f;
    // A reaches past the end of the program's allocation: pilotd refuses the whole GEMM.
    cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 64, &alpha, mine + 64 * 32,
                                    64, mine, 64, &beta, mine, 64);
    std::printf("out-of-range gemm issued: %s\n", cublasGetStatusName(st));
    cudaError_t err = cudaDeviceSynchronize();
    std::printf("next synchronize: %s\n", cudaGetErrorName(err));
    std::printf("then: %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    // a pointer array naming memory that is not the program's: the whole batch is refused
    float *list[2] = {mine, (float *)(uintptr_t)0x7000000000ull}, **dlist;
    CHECK(cudaMalloc(&dlist, sizeof list));
    CHECK(cudaMemcpy(dlist, list, sizeof list, cudaMemcpyHostToDevice));
    st = cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &alpha, dlist, 8, dlist, 8, &beta,
                            dlist, 8, 2);
    std::printf("batched gemm with a foreign pointer issued: %s\n", cublasGetStatusName(st));
    std::printf("next synchronize: %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    cudaFree(dlist);
    cudaFree(mine);
    return 0;
}

int main(int argc, char **argv)
{
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    if (argc > 1 && std::strcmp(argv[1], "loop") == 0) { // GEMMs until killed (a test kills it)
        float *m;
        CHECK(cudaMalloc(&m, 3 * 256 * 256 * 4));
        CHECK(cudaMemset(m, 0, 3 * 256 * 256 * 4));
        float one = 1, zero = 0;
        cublasLtHandle_t lt;
        BLAS(cublasLtCreate(&lt));
        std::printf("looping\n");
        std::fflush(stdout);
        for (;;) {
            BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 256, 256, 256, &one, m, 256,
                             m + 256 * 256, 256, &zero, m + 2 * 256 * 256, 256));
            CHECK(cudaDeviceSynchronize());
        }
    }
    if (argc > 1 && std::strcmp(argv[1], "graph") == 0) { // cuBLAS calls captured into a graph
        int rc = captured(h);
        BLAS(cublasDestroy(h));
        return rc;
    }
    if (argc > 1 && std::strcmp(argv[1], "devices") == 0) { // a handle of the second GPU
        int count = 0;
        CHECK(cudaGetDeviceCount(&count));
        if (count < 2) {
            std::printf("devices: fewer than 2\n");
            return 0;
        }
        CHECK(cudaSetDevice(1));
        cublasHandle_t h1;
        BLAS(cublasCreate(&h1));
        std::vector<float> a(16 * 16, 1.0f);
        float *d1;
        CHECK(cudaMalloc(&d1, a.size() * 4 * 2));
        CHECK(cudaMemcpy(d1, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
        float alpha = 2, beta = 0;
        BLAS(cublasSgemm(h1, CUBLAS_OP_N, CUBLAS_OP_N, 16, 16, 16, &alpha, d1, 16, d1, 16, &beta,
                         d1 + 256, 16));
        CHECK(cudaMemcpy(a.data(), d1 + 256, a.size() * 4, cudaMemcpyDeviceToHost));
        int device = -1;
        cudaPointerAttributes attr;
        CHECK(cudaPointerGetAttributes(&attr, d1 + 256));
        device = attr.device;
        std::printf("sgemm on device %d: %s\n", device, a[0] == 32.0f && a[255] == 32.0f ? "ok" : "MISMATCH");
        BLAS(cublasDestroy(h1));
        cudaFree(d1);
        BLAS(cublasDestroy(h));
        return 0;
    }
    if (argc > 1 && std::strcmp(argv[1], "isolation") == 0) {
        int rc = isolation(h);
        BLAS(cublasDestroy(h));
        return rc;
    }
    int version = 0;
    BLAS(cublasGetVersion(h, &version));
    std::printf("cublas version >= 13.0: %d\n", version >= 130000);
    cublasMath_t mode;
    BLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    BLAS(cublasGetMathMode(h, &mode));
    std::printf("math mode: %d\n", (int)mode);
    float one = 1.0f;
    std::printf("sgemm lda < m: %s\n", cublasGetStatusName(cublasSgemm(
                                          h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, nullptr, 4,
                                          nullptr, 8, &one, nullptr, 8)));
    std::fflush(stdout);
    float h1 = 1.0f;
    std::printf("gemmEx ldc < m: %s\n", cublasGetStatusName(cublasGemmEx(
                                           h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &h1, nullptr,
                                           CUDA_R_32F, 8, nullptr, CUDA_R_32F, 8, &h1, nullptr,
                                           CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)));
    std::printf("sgemm strided batch < 0: %s\n", cublasGetStatusName(cublasSgemmStridedBatched(
                                                    h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &h1,
                                                    nullptr, 8, 64, nullptr, 8, 64, &h1, nullptr,
                                                    8, 64, -1)));
    std::printf("dgemm transa 7: %s\n", cublasGetStatusName(cublasDgemm(
                                           h, (cublasOperation_t)7, CUBLAS_OP_N, 8, 8, 8, nullptr,
                                           nullptr, 8, nullptr, 8, nullptr, nullptr, 8)));
    std::printf("sgemm on no handle: %s\n", cublasGetStatusName(cublasSgemm(
                                              nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one,
                                              nullptr, 8, nullptr, 8, &one, nullptr, 8)));
    std::printf("sgemm m = 0 (nothing to do): %s\n", cublasGetStatusName(cublasSgemm(
                                                       h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 8, 8, &one,
                                                       nullptr, 8, nullptr, 8, &one, nullptr, 8)));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (sgemm_cases(h) || dgemm_device_scalars(h, stream) || gemm_ex_half(h) || strided_batched(h) ||
        batched_and_complex(h) || vectors())
        return 1;
    cublasLtHandle_t lt;
    BLAS(cublasLtCreate(&lt));
    if (lt_matmul(lt))
        return 1;
    BLAS(cublasLtDestroy(lt));
    CHECK(cudaStreamDestroy(stream));
    BLAS(cublasDestroy(h));
    CHECK(cudaDeviceSynchronize());
    std::printf("done\n");
    return 0;
}
