// cuBLAS beyond GEMM, as numerical programs use it (conjugate gradients, least squares): level 1
// (axpy, scal, copy, swap, dot, nrm2, asum, iamax/iamin, with strides and a negative increment),
// level 2 (gemv both ways, ger), geam, trsm and syrk, results to the host and to device memory
// (CUBLAS_POINTER_MODE_DEVICE), and a conjugate-gradient solve built from them. Every result is
// checked against the CPU; only "ok"/"MISMATCH", exact integers and status names are printed.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>

#include "cublas_decls.h"


static std::vector<float> values(size_t n, int seed)
{
    std::vector<float> v(n);
    unsigned x = 88172645u + (unsigned)seed * 7919u;
    for (auto &e : v) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        e = (float)((double)(x % 2001) / 1000.0 - 1.0);
    }
    return v;
}

static void verdict(const char *what, const std::vector<double> &want, const std::vector<double> &got,
                    double tol)
{
    double worst = 0;
    for (size_t i = 0; i < want.size(); i++)
        worst = std::fmax(worst, std::fabs(want[i] - got[i]) / (1.0 + std::fabs(want[i])));
    std::printf("%s: %s\n", what, worst <= tol ? "ok" : "MISMATCH");
    if (worst > tol)
        std::fprintf(stderr, "%s: worst %g\n", what, worst);
}

static float *upload(const std::vector<float> &v)
{
    float *d = nullptr;
    if (cudaMalloc(&d, v.size() * 4) == cudaSuccess)
        cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    return d;
}

static std::vector<double> download(const float *d, size_t n)
{
    std::vector<float> f(n);
    cudaMemcpy(f.data(), d, n * 4, cudaMemcpyDeviceToHost);
    return std::vector<double>(f.begin(), f.end());
}

static int level1(cublasHandle_t h)
{
    const int n = 100;
    auto x = values(2 * n, 1), y = values(3 * n, 2);
    float *dx = upload(x), *dy = upload(y);
    float alpha = 0.75f;
    BLAS(cublasSaxpy(h, n, &alpha, dx, 2, dy, 3)); // y[3i] += a x[2i]
    std::vector<double> want(y.begin(), y.end());
    for (int i = 0; i < n; i++)
        want[3 * i] += alpha * x[2 * i];
    verdict("saxpy strided", want, download(dy, y.size()), 1e-6);
    BLAS(cublasSaxpy(h, n, &alpha, dx, -2, dy, 3)); // negative increment: x read backwards
    for (int i = 0; i < n; i++)
        want[3 * i] += alpha * x[2 * (n - 1 - i)];
    verdict("saxpy negative incx", want, download(dy, y.size()), 1e-6);
    float dot = 0, nrm = 0, asum = 0;
    BLAS(cublasSdot(h, n, dx, 2, dy, 3, &dot));
    double wdot = 0, wnrm = 0, wasum = 0;
    for (int i = 0; i < n; i++) {
        wdot += x[2 * i] * want[3 * i];
        wnrm += (double)x[2 * i] * x[2 * i];
        wasum += std::fabs(x[2 * i]);
    }
    BLAS(cublasSnrm2(h, n, dx, 2, &nrm));
    BLAS(cublasSasum(h, n, dx, 2, &asum));
    verdict("sdot, snrm2, sasum to the host", {wdot, std::sqrt(wnrm), wasum}, {dot, nrm, asum}, 1e-5);
    std::vector<float> peaks(50, 0.5f);
    peaks[17] = -3, peaks[31] = 3, peaks[5] = 0.01f, peaks[40] = -0.01f;
    float *dp = upload(peaks);
    int imax = 0, imin = 0;
    BLAS(cublasIsamax(h, 50, dp, 1, &imax));
    BLAS(cublasIsamin(h, 50, dp, 1, &imin));
    std::printf("isamax %d isamin %d (1-based, first of equals)\n", imax, imin);
    float scale = -2;
    BLAS(cublasSscal(h, 50, &scale, dp, 1));
    BLAS(cublasScopy(h, 25, dp, 2, dx, 1));
    BLAS(cublasSswap(h, 10, dx, 1, dp, 5));
    std::vector<double> wp(peaks.begin(), peaks.end()), wx(x.begin(), x.end());
    for (auto &v : wp)
        v *= -2;
    for (int i = 0; i < 25; i++)
        wx[i] = wp[2 * i];
    for (int i = 0; i < 10; i++)
        std::swap(wx[i], wp[5 * i]);
    verdict("sscal, scopy, sswap", wp, download(dp, 50), 0);
    verdict("scopy, sswap into x", wx, download(dx, x.size()), 0);
    // results in device memory
    BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
    float *dres;
    CHECK(cudaMalloc(&dres, 8));
    BLAS(cublasSdot(h, n, dx, 2, dy, 3, dres));
    BLAS(cublasIsamax(h, 50, dp, 1, (int *)(dres + 1)));
    BLAS(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    float on_device[2];
    CHECK(cudaMemcpy(on_device, dres, 8, cudaMemcpyDeviceToHost));
    float host_dot = 0;
    int host_max = 0;
    BLAS(cublasSdot(h, n, dx, 2, dy, 3, &host_dot));
    BLAS(cublasIsamax(h, 50, dp, 1, &host_max));
    int dev_max;
    std::memcpy(&dev_max, &on_device[1], 4);
    std::printf("results in device memory equal the host's: %d %d\n", on_device[0] == host_dot,
                dev_max == host_max);
    dot = 5;
    cublasStatus_t st = cublasSdot(h, -1, dx, 1, dy, 1, &dot);
    std::printf("sdot n = -1: %s, result %g\n", cublasGetStatusName(st), dot);
    cudaFree(dx), cudaFree(dy), cudaFree(dp), cudaFree(dres);
    return 0;
}

static int level23(cublasHandle_t h)
{
    const int m = 30, n = 20, lda = 33;
    auto A = values((size_t)lda * n, 3), x = values(m, 4), y = values(m, 5);
    float *dA = upload(A), *dx = upload(x), *dy = upload(y);
    float one = 1, beta = 0.5f;
    BLAS(cublasSgemv(h, CUBLAS_OP_T, m, n, &one, dA, lda, dx, 1, &beta, dy, 1)); // y[:n] = A^T x + b y
    std::vector<double> want(y.begin(), y.end());
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int i = 0; i < m; i++)
            s += (double)A[i + (size_t)j * lda] * x[i];
        want[j] = s + 0.5 * y[j];
    }
    verdict("sgemv transposed", want, download(dy, y.size()), 1e-5);
    BLAS(cublasSger(h, m, n, &beta, dx, 1, dy, 1, dA, lda)); // A += 0.5 x y^T
    std::vector<double> wA(A.begin(), A.end());
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            wA[i + (size_t)j * lda] += 0.5 * x[i] * want[j];
    verdict("sger", wA, download(dA, A.size()), 1e-5);
    // geam: C = 2 A^T(part) - B, 20 x 30
    auto B = values((size_t)n * m, 6);
    float *dB = upload(B), *dC;
    CHECK(cudaMalloc(&dC, (size_t)n * m * 4));
    float two = 2, minus = -1;
    BLAS(cublasSgeam(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, &two, dA, lda, &minus, dB, n, dC, n));
    std::vector<double> wC((size_t)n * m);
    for (int j = 0; j < m; j++)
        for (int i = 0; i < n; i++)
            wC[i + (size_t)j * n] = 2 * wA[j + (size_t)i * lda] - B[i + (size_t)j * n];
    verdict("sgeam", wC, download(dC, wC.size()), 1e-5);
    // trsm: solve L X = 3 B for lower-triangular L (diagonal 4), B 8 x 5
    const int k = 8, r = 5;
    std::vector<float> L((size_t)k * k, 0), Bt = values((size_t)k * r, 7);
    for (int j = 0; j < k; j++)
        for (int i = j; i < k; i++)
            L[i + (size_t)j * k] = i == j ? 4.0f : 0.25f * (float)((i + 2 * j) % 5 - 2);
    float *dL = upload(L), *dBt = upload(Bt);
    float three = 3;
    BLAS(cublasStrsm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT,
                     k, r, &three, dL, k, dBt, k));
    auto X = download(dBt, Bt.size());
    std::vector<double> back((size_t)k * r, 0), wB((size_t)k * r);
    for (int c = 0; c < r; c++)
        for (int i = 0; i < k; i++) {
            for (int p = 0; p <= i; p++)
                back[i + (size_t)c * k] += L[i + (size_t)p * k] * X[p + (size_t)c * k];
            wB[i + (size_t)c * k] = 3.0 * Bt[i + (size_t)c * k];
        }
    verdict("strsm (L X = 3 B)", wB, back, 1e-5);
    // syrk: upper triangle of C = A A^T, A 6 x 4
    auto S = values(24, 8);
    float *dS = upload(S), *dSC;
    std::vector<float> sc(36, 7.0f);
    dSC = upload(sc);
    float zero = 0;
    BLAS(cublasSsyrk(h, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, 6, 4, &one, dS, 6, &zero, dSC, 6));
    auto got = download(dSC, 36);
    std::vector<double> ws(36);
    for (int j = 0; j < 6; j++)
        for (int i = 0; i < 6; i++) {
            double s = 0;
            for (int p = 0; p < 4; p++)
                s += (double)S[i + 6 * p] * S[j + 6 * p];
            ws[i + 6 * j] = i <= j ? s : 7.0; // the lower triangle is left alone
        }
    verdict("ssyrk upper", ws, got, 1e-5);
    std::printf("sgemv lda < m: %s\n", cublasGetStatusName(cublasSgemv(h, CUBLAS_OP_N, m, n, &one, dA, 2, dx, 1, &beta, dy, 1)));
    CHECK(cudaDeviceSynchronize());
    cudaFree(dA), cudaFree(dx), cudaFree(dy), cudaFree(dB), cudaFree(dC), cudaFree(dL);
    cudaFree(dBt), cudaFree(dS), cudaFree(dSC);
    return 0;
}

// symm, trmm, dgmm (level 3 and extensions), symv, trsv, rot (levels 2 and 1) on small matrices.
static int more(cublasHandle_t h)
{
    const int m = 5, n = 4;
    auto S = values((size_t)m * m, 60), B = values((size_t)m * n, 61), x = values(m, 62);
    float *dS = upload(S), *dB = upload(B), *dx = upload(x), *dC;
    CHECK(cudaMalloc(&dC, (size_t)m * n * 4));
    auto full = [&](int i, int j) { return (double)(i <= j ? S[i + (size_t)j * m] : S[j + (size_t)i * m]); };
    float one = 1, half = 0.5f, zero = 0;
    BLAS(cublasSsymm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, m, n, &one, dS, m, dB, m, &zero, dC, m));
    std::vector<double> want((size_t)m * n);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < m; p++)
                s += full(i, p) * B[p + (size_t)j * m];
            want[i + (size_t)j * m] = s;
        }
    verdict("ssymm (upper, left)", want, download(dC, want.size()), 1e-5);
    BLAS(cublasStrmm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, CUBLAS_DIAG_UNIT, m, n,
                     &half, dS, m, dB, m, dC, m)); // C = 0.5 L^T B, unit diagonal
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = B[i + (size_t)j * m]; // the unit diagonal
            for (int p = i + 1; p < m; p++)
                s += S[p + (size_t)i * m] * B[p + (size_t)j * m];
            want[i + (size_t)j * m] = 0.5 * s;
        }
    verdict("strmm (lower, transposed, unit)", want, download(dC, want.size()), 1e-5);
    BLAS(cublasSdgmm(h, CUBLAS_SIDE_LEFT, m, n, dB, m, dx, 1, dC, m)); // C = diag(x) B
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            want[i + (size_t)j * m] = x[i] * B[i + (size_t)j * m];
    verdict("sdgmm", want, download(dC, want.size()), 1e-6);
    auto y = values(m, 63);
    float *dy = upload(y);
    BLAS(cublasSsymv(h, CUBLAS_FILL_MODE_LOWER, m, &one, dS, m, dx, 1, &half, dy, 1));
    std::vector<double> wy(m);
    for (int i = 0; i < m; i++) {
        double s = 0;
        for (int p = 0; p < m; p++)
            s += (i >= p ? S[i + (size_t)p * m] : S[p + (size_t)i * m]) * x[p];
        wy[i] = s + 0.5 * y[i];
    }
    verdict("ssymv (lower)", wy, download(dy, m), 1e-5);
    std::vector<float> U((size_t)m * m, 0.0f);
    for (int j = 0; j < m; j++)
        for (int i = 0; i <= j; i++)
            U[i + (size_t)j * m] = i == j ? 3.0f : 0.5f * S[i + (size_t)j * m];
    float *dU = upload(U), *dr = upload(x);
    BLAS(cublasStrsv(h, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, m, dU, m, dr, 1));
    auto r = download(dr, m);
    std::vector<double> back(m, 0.0), wx(x.begin(), x.end());
    for (int i = 0; i < m; i++)
        for (int p = i; p < m; p++)
            back[i] += U[i + (size_t)p * m] * r[p];
    verdict("strsv (U x = b)", wx, back, 1e-5);
    float c = 0.6f, s = 0.8f;
    BLAS(cublasSrot(h, m, dx, 1, dy, 1, &c, &s));
    auto gx = download(dx, m), gy = download(dy, m);
    std::vector<double> wrx(m), wry(m);
    for (int i = 0; i < m; i++)
        wrx[i] = c * x[i] + s * wy[i], wry[i] = c * wy[i] - s * x[i];
    verdict("srot", wrx, gx, 1e-5);
    verdict("srot (y)", wry, gy, 1e-5);
    cudaFree(dS), cudaFree(dB), cudaFree(dx), cudaFree(dC), cudaFree(dy), cudaFree(dU), cudaFree(dr);
    return 0;
}

// LU factorizations of a batch (cublasSgetrfBatched, as the simpleCUBLAS_LU sample): P A = L U
// checked on the host; a singular matrix reports its first zero pivot in info.
static int lu_batched(cublasHandle_t h)
{
    const int n = 6, batch = 3;
    std::vector<std::vector<float>> A(batch);
    std::vector<float *> ptrs(batch);
    for (int b = 0; b < batch; b++) {
        A[b] = values((size_t)n * n, 50 + b);
        if (b == 2)
            for (int i = 0; i < n; i++)
                A[b][i + 2 * n] = 0; // column 2 zero: singular
        ptrs[b] = upload(A[b]);
    }
    float **dptrs;
    int *dpiv, *dinfo;
    CHECK(cudaMalloc(&dptrs, batch * sizeof(float *)));
    CHECK(cudaMalloc(&dpiv, n * batch * sizeof(int)));
    CHECK(cudaMalloc(&dinfo, batch * sizeof(int)));
    CHECK(cudaMemcpy(dptrs, ptrs.data(), batch * sizeof(float *), cudaMemcpyHostToDevice));
    BLAS(cublasSgetrfBatched(h, n, dptrs, n, dpiv, dinfo, batch));
    std::vector<int> piv(n * batch), info(batch);
    CHECK(cudaMemcpy(piv.data(), dpiv, piv.size() * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(info.data(), dinfo, info.size() * sizeof(int), cudaMemcpyDeviceToHost));
    for (int b = 0; b < 2; b++) {
        auto LU = download(ptrs[b], (size_t)n * n);
        std::vector<double> PA(A[b].begin(), A[b].end()), prod((size_t)n * n, 0);
        for (int k = 0; k < n; k++) // apply the row swaps in order
            for (int j = 0; j < n; j++)
                std::swap(PA[k + (size_t)j * n], PA[(piv[b * n + k] - 1) + (size_t)j * n]);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < n; i++)
                for (int p = 0; p <= std::min(i, j); p++)
                    prod[i + (size_t)j * n] += (p == i ? 1.0 : LU[i + (size_t)p * n]) * LU[p + (size_t)j * n];
        char what[48];
        std::snprintf(what, sizeof what, "sgetrfBatched P A = L U (matrix %d)", b);
        verdict(what, PA, prod, 1e-5);
    }
    std::printf("sgetrfBatched info: %d %d %d\n", info[0], info[1], info[2]);
    for (auto p : ptrs)
        cudaFree(p);
    cudaFree(dptrs), cudaFree(dpiv), cudaFree(dinfo);
    return 0;
}

// Conjugate gradients on a symmetric positive definite tridiagonal system, in double precision,
// from dgemv, ddot and daxpy alone (the shape of the CUDA samples' conjugateGradient).
static int conjugate_gradients(cublasHandle_t h)
{
    const int n = 64;
    std::vector<double> A((size_t)n * n, 0), b(n, 1.0);
    for (int i = 0; i < n; i++) {
        A[i + (size_t)i * n] = 4;
        if (i > 0)
            A[i + (size_t)(i - 1) * n] = A[(i - 1) + (size_t)i * n] = -1;
    }
    double *dA, *dx, *dr, *dp, *dAp;
    CHECK(cudaMalloc(&dA, A.size() * 8));
    CHECK(cudaMalloc(&dx, n * 8));
    CHECK(cudaMalloc(&dr, n * 8));
    CHECK(cudaMalloc(&dp, n * 8));
    CHECK(cudaMalloc(&dAp, n * 8));
    CHECK(cudaMemcpy(dA, A.data(), A.size() * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dx, 0, n * 8));
    CHECK(cudaMemcpy(dr, b.data(), n * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dp, b.data(), n * 8, cudaMemcpyHostToDevice));
    double rr = 0, one = 1, zero = 0;
    BLAS(cublasDdot(h, n, dr, 1, dr, 1, &rr));
    int it = 0;
    for (; it < 200 && rr > 1e-20; it++) {
        double pAp = 0, rr_new = 0;
        BLAS(cublasDgemv(h, CUBLAS_OP_N, n, n, &one, dA, n, dp, 1, &zero, dAp, 1));
        BLAS(cublasDdot(h, n, dp, 1, dAp, 1, &pAp));
        double a = rr / pAp, na = -a;
        BLAS(cublasDaxpy(h, n, &a, dp, 1, dx, 1));
        BLAS(cublasDaxpy(h, n, &na, dAp, 1, dr, 1));
        BLAS(cublasDdot(h, n, dr, 1, dr, 1, &rr_new));
        double beta = rr_new / rr;
        rr = rr_new;
        // p = r + beta p: scale p by beta, then add r
        std::vector<double> hp(n), hr(n);
        CHECK(cudaMemcpy(hp.data(), dp, n * 8, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hr.data(), dr, n * 8, cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++)
            hp[i] = hr[i] + beta * hp[i];
        CHECK(cudaMemcpy(dp, hp.data(), n * 8, cudaMemcpyHostToDevice));
    }
    std::vector<double> x(n);
    CHECK(cudaMemcpy(x.data(), dx, n * 8, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double ax = 4 * x[i] - (i > 0 ? x[i - 1] : 0) - (i + 1 < n ? x[i + 1] : 0);
        worst = std::fmax(worst, std::fabs(ax - 1.0));
    }
    std::printf("conjugate gradients: residual below 1e-9: %d, iterations <= %d: %d\n", worst < 1e-9,
                n, it <= n);
    cudaFree(dA), cudaFree(dx), cudaFree(dr), cudaFree(dp), cudaFree(dAp);
    return 0;
}

int main()
{
    cublasHandle_t h;
    BLAS(cublasCreate(&h));
    if (level1(h) || level23(h) || more(h) || lu_batched(h) || conjugate_gradients(h))
        return 1;
    BLAS(cublasDestroy(h));
    std::printf("done\n");
    return 0;
}
