// cuDNN 9 as a framework uses it (issue 13): a 2-D convolution forward, backward data and
// backward filter through the backend API (tensors, operation graph, heuristics, the first
// engine configuration that finalizes, a plan, a variant pack), then batch normalization's
// legacy calls (training forward and backward, inference). Every result is checked against the
// CPU; the inputs are small integers, so the GPU's sums are exact whatever its math mode.
//
//   cudnn_conv              the checks above, one line each
//   cudnn_conv isolation    (under pilot only) a variant pack whose output lies past the end of
//                           its buffer: refused, the next synchronize fails, the program goes on
//   cudnn_conv hold         a plan executed once, then "holding" and a wait to be killed
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudnn_decls.h"

#define CHECK_CUDA(x)                                                                          \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                                    \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define CHECK(x)                                                                               \
    do {                                                                                       \
        cudnnStatus_t s_ = (x);                                                                \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                      \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudnnGetErrorString(s_));         \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static cudnnHandle_t g_handle;

static cudnnBackendDescriptor_t make(int type)
{
    cudnnBackendDescriptor_t d;
    CHECK(cudnnBackendCreateDescriptor(type, &d));
    return d;
}

static void set(cudnnBackendDescriptor_t d, int name, int type, int64_t count, const void *v)
{
    cudnnStatus_t s = cudnnBackendSetAttribute(d, name, type, count, v);
    if (s != CUDNN_STATUS_SUCCESS) {
        printf("set attribute %d: %s\n", name, cudnnGetErrorString(s));
        exit(1);
    }
}

// A packed NCHW float tensor of four dimensions.
static cudnnBackendDescriptor_t tensor(int64_t uid, const int64_t dims[4])
{
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t strides[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    int dtype = CUDNN_DATA_FLOAT;
    int64_t alignment = 4;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    CHECK(cudnnBackendFinalize(t));
    return t;
}

enum { N = 2, C = 4, H = 9, W = 9, K = 6, R = 3, S = 3, PAD = 1, STRIDE = 2 };
enum { P = (H + 2 * PAD - R) / STRIDE + 1, Q = (W + 2 * PAD - S) / STRIDE + 1 };
enum { UID_X = 'x', UID_W = 'w', UID_Y = 'y' };

struct plan {
    cudnnBackendDescriptor_t plan, graph, op, conv, tensors[3];
    int64_t workspace;
};

// One convolution operation (`op_type`: forward, backward data or filter) as a finalized plan:
// the first engine configuration of the instant heuristics that finalizes.
static struct plan conv_plan(int op_type, int attr_base)
{
    struct plan p;
    const int64_t xd[4] = {N, C, H, W}, wd[4] = {K, C, R, S}, yd[4] = {N, K, P, Q};
    p.tensors[0] = tensor(UID_X, xd);
    p.tensors[1] = tensor(UID_W, wd);
    p.tensors[2] = tensor(UID_Y, yd);
    p.conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    int comp = CUDNN_DATA_FLOAT, mode = CUDNN_CROSS_CORRELATION;
    int64_t dims = 2, pad[2] = {PAD, PAD}, stride[2] = {STRIDE, STRIDE}, dilation[2] = {1, 1};
    set(p.conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    set(p.conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    set(p.conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
    set(p.conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    set(p.conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    set(p.conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
    set(p.conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation);
    CHECK(cudnnBackendFinalize(p.conv));

    p.op = make(op_type);
    float alpha = 1.0f, beta = 0.0f;
    set(p.op, attr_base + 0, CUDNN_TYPE_FLOAT, 1, &alpha);
    set(p.op, attr_base + 1, CUDNN_TYPE_FLOAT, 1, &beta);
    set(p.op, attr_base + 2, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p.conv);
    // forward: W X Y; backward data: W DX DY; backward filter: DW X DY
    set(p.op, attr_base + 3, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p.tensors[1]);
    set(p.op, attr_base + 4, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p.tensors[0]);
    set(p.op, attr_base + 5, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p.tensors[2]);
    CHECK(cudnnBackendFinalize(p.op));

    p.graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(p.graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g_handle);
    set(p.graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p.op);
    CHECK(cudnnBackendFinalize(p.graph));

    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    int heur_mode = CUDNN_HEUR_MODE_INSTANT;
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p.graph);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
    CHECK(cudnnBackendFinalize(heur));
    // How many: no array is a count query whatever is requested (cudnn-frontend asks so)
    int64_t count = 0;
    CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 8, &count, NULL));
    if (count < 1) {
        printf("no engine configurations\n");
        exit(1);
    }
    cudnnBackendDescriptor_t *configs =
        (cudnnBackendDescriptor_t *)calloc((size_t)count, sizeof *configs);
    for (int64_t i = 0; i < count; i++)
        configs[i] = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, configs));
    p.plan = NULL;
    for (int64_t i = 0; i < got && !p.plan; i++) {
        cudnnBackendDescriptor_t plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &g_handle);
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
            &configs[i]);
        if (cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS)
            p.plan = plan;
        else
            cudnnBackendDestroyDescriptor(plan);
    }
    if (!p.plan) {
        printf("no engine configuration finalizes\n");
        exit(1);
    }
    // The heuristics and the configurations may go: the plan keeps what it needs.
    for (int64_t i = 0; i < count; i++)
        CHECK(cudnnBackendDestroyDescriptor(configs[i]));
    free(configs);
    CHECK(cudnnBackendDestroyDescriptor(heur));
    int64_t n = 0;
    CHECK(cudnnBackendGetAttribute(p.plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                   CUDNN_TYPE_INT64, 1, &n, &p.workspace));
    return p;
}

static void free_plan(struct plan *p)
{
    CHECK(cudnnBackendDestroyDescriptor(p->plan));
    CHECK(cudnnBackendDestroyDescriptor(p->graph));
    CHECK(cudnnBackendDestroyDescriptor(p->op));
    CHECK(cudnnBackendDestroyDescriptor(p->conv));
    for (int i = 0; i < 3; i++)
        CHECK(cudnnBackendDestroyDescriptor(p->tensors[i]));
}

// Execute with x, w, y at these device addresses.
static cudnnStatus_t execute(const struct plan *p, void *x, void *w, void *y)
{
    void *workspace = NULL;
    if (p->workspace)
        CHECK_CUDA(cudaMalloc(&workspace, (size_t)p->workspace));
    cudnnBackendDescriptor_t pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    int64_t uids[3] = {UID_X, UID_W, UID_Y};
    void *ptrs[3] = {x, w, y};
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    CHECK(cudnnBackendFinalize(pack));
    cudnnStatus_t s = cudnnBackendExecute(g_handle, p->plan, pack);
    CHECK(cudnnBackendDestroyDescriptor(pack));
    cudaError_t e = cudaDeviceSynchronize();
    if (workspace)
        cudaFree(workspace);
    if (s == CUDNN_STATUS_SUCCESS && e != cudaSuccess) {
        printf("synchronize after the execution: %s\n", cudaGetErrorName(e));
        return -1;
    }
    return s;
}

static float hx[N * C * H * W], hw[K * C * R * S], hy[N * K * P * Q];

static float x_at(int n, int c, int h, int w)
{
    return h < 0 || h >= H || w < 0 || w >= W ? 0.0f : hx[((n * C + c) * H + h) * W + w];
}

static void reference_forward(float *y)
{
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    float sum = 0;
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++)
                            for (int s = 0; s < S; s++)
                                sum += x_at(n, c, p * STRIDE - PAD + r, q * STRIDE - PAD + s) *
                                       hw[((k * C + c) * R + r) * S + s];
                    y[((n * K + k) * P + p) * Q + q] = sum;
                }
}

// dX[n,c,h,w] = sum over k,p,q,r,s with h = p*STRIDE-PAD+r of dY[n,k,p,q] W[k,c,r,s]
static void reference_backward_data(float *dx)
{
    memset(dx, 0, sizeof hx);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++)
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++)
                            for (int s = 0; s < S; s++) {
                                int h = p * STRIDE - PAD + r, w = q * STRIDE - PAD + s;
                                if (h >= 0 && h < H && w >= 0 && w < W)
                                    dx[((n * C + c) * H + h) * W + w] +=
                                        hy[((n * K + k) * P + p) * Q + q] *
                                        hw[((k * C + c) * R + r) * S + s];
                            }
}

static void reference_backward_filter(float *dw)
{
    memset(dw, 0, sizeof hw);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++)
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++)
                            for (int s = 0; s < S; s++)
                                dw[((k * C + c) * R + r) * S + s] +=
                                    hy[((n * K + k) * P + p) * Q + q] *
                                    x_at(n, c, p * STRIDE - PAD + r, q * STRIDE - PAD + s);
}

static const char *same(const float *got, const float *want, int n, float tol)
{
    for (int i = 0; i < n; i++)
        if (fabsf(got[i] - want[i]) > tol * (1.0f + fabsf(want[i]))) {
            static char why[96];
            snprintf(why, sizeof why, "MISMATCH at %d: %g, want %g", i, got[i], want[i]);
            return why;
        }
    return "ok";
}

static void batchnorm(void)
{
    enum { BN = 3, BC = 4, BH = 5, BW = 5, COUNT = BN * BC * BH * BW };
    static float x[COUNT], y[COUNT], dy[COUNT], dx[COUNT];
    float scale[BC], bias[BC], rmean[BC], rvar[BC], smean[BC], sinv[BC], dscale[BC], dbias[BC];
    for (int i = 0; i < COUNT; i++) {
        x[i] = (float)((i * 7) % 11) - 5.0f;
        dy[i] = (float)((i * 5) % 7) - 3.0f;
    }
    for (int c = 0; c < BC; c++) {
        scale[c] = 1.0f + 0.5f * (float)c;
        bias[c] = (float)c - 1.0f;
        rmean[c] = 0.0f;
        rvar[c] = 1.0f;
    }
    cudnnTensorDescriptor_t xd, bd;
    CHECK(cudnnCreateTensorDescriptor(&xd));
    CHECK(cudnnCreateTensorDescriptor(&bd));
    CHECK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, BN, BC, BH, BW));
    CHECK(cudnnDeriveBNTensorDescriptor(bd, xd, CUDNN_BATCHNORM_SPATIAL));
    float *d;
    CHECK_CUDA(cudaMalloc(&d, sizeof(float) * (4 * COUNT + 8 * BC)));
    float *gx = d, *gy = d + COUNT, *gdy = d + 2 * COUNT, *gdx = d + 3 * COUNT;
    float *gp = d + 4 * COUNT; // scale bias rmean rvar smean sinv dscale dbias
    CHECK_CUDA(cudaMemcpy(gx, x, sizeof x, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(gdy, dy, sizeof dy, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(gp, scale, sizeof scale, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(gp + BC, bias, sizeof bias, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(gp + 2 * BC, rmean, sizeof rmean, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(gp + 3 * BC, rvar, sizeof rvar, cudaMemcpyHostToDevice));
    size_t ws = 0, reserve = 0, bws = 0;
    // zDesc given with CUDNN_BATCHNORM_OPS_BN, as PyTorch does: cuDNN does not read it
    CHECK(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        g_handle, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN, xd, xd, xd, bd, NULL, &ws));
    CHECK(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
        g_handle, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN, NULL, xd, &reserve));
    CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
        g_handle, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN, xd, NULL, xd, NULL, xd, bd,
        NULL, &bws));
    void *gws = NULL, *greserve = NULL;
    size_t wsmax = ws > bws ? ws : bws;
    if (wsmax)
        CHECK_CUDA(cudaMalloc(&gws, wsmax));
    if (reserve)
        CHECK_CUDA(cudaMalloc(&greserve, reserve));
    const float one = 1.0f, zero = 0.0f;
    const double eps = 1e-5, factor = 0.1;
    // twice, as a training loop does (the running statistics start afresh each round), so
    // under pilot the second round runs on the fast path (daemon/native/fast_library.c)
    for (int round = 0; round < 2; round++) {
        CHECK_CUDA(cudaMemcpy(gp + 2 * BC, rmean, sizeof rmean, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(gp + 3 * BC, rvar, sizeof rvar, cudaMemcpyHostToDevice));
        CHECK(cudnnBatchNormalizationForwardTrainingEx(
            g_handle, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN, &one, &zero, xd, gx, NULL,
            NULL, xd, gy, bd, gp, gp + BC, factor, gp + 2 * BC, gp + 3 * BC, eps, gp + 4 * BC,
            gp + 5 * BC, NULL, gws, ws, greserve, reserve));
        CHECK(cudnnBatchNormalizationBackwardEx(
            g_handle, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one, &zero,
            xd, gx, NULL, NULL, xd, gdy, NULL, NULL, xd, gdx, bd, gp, NULL, gp + 6 * BC,
            gp + 7 * BC, eps, gp + 4 * BC, gp + 5 * BC, NULL, gws, bws, greserve, reserve));
    }
    CHECK_CUDA(cudaMemcpy(y, gy, sizeof y, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(dx, gdx, sizeof dx, cudaMemcpyDeviceToHost));
    float params[8 * BC];
    CHECK_CUDA(cudaMemcpy(params, gp, sizeof params, cudaMemcpyDeviceToHost));
    memcpy(rmean, params + 2 * BC, sizeof rmean);
    memcpy(rvar, params + 3 * BC, sizeof rvar);
    memcpy(smean, params + 4 * BC, sizeof smean);
    memcpy(sinv, params + 5 * BC, sizeof sinv);
    memcpy(dscale, params + 6 * BC, sizeof dscale);
    memcpy(dbias, params + 7 * BC, sizeof dbias);

    // the CPU's answer, in double
    const int m = BN * BH * BW;
    int fwd_ok = 1, stats_ok = 1, bwd_ok = 1;
    for (int c = 0; c < BC; c++) {
        double mean = 0, var = 0, sdy = 0, sdyxh = 0;
        for (int n = 0; n < BN; n++)
            for (int i = 0; i < BH * BW; i++)
                mean += x[(n * BC + c) * BH * BW + i];
        mean /= m;
        for (int n = 0; n < BN; n++)
            for (int i = 0; i < BH * BW; i++) {
                double v = x[(n * BC + c) * BH * BW + i] - mean;
                var += v * v;
            }
        var /= m;
        double inv = 1.0 / sqrt(var + eps);
        for (int n = 0; n < BN; n++)
            for (int i = 0; i < BH * BW; i++) {
                int at = (n * BC + c) * BH * BW + i;
                double xh = (x[at] - mean) * inv;
                if (fabs(y[at] - (xh * scale[c] + bias[c])) > 1e-4)
                    fwd_ok = 0;
                sdy += dy[at];
                sdyxh += dy[at] * xh;
            }
        if (fabs(smean[c] - mean) > 1e-5 || fabs(sinv[c] - inv) > 1e-4 * inv ||
            fabs(rmean[c] - factor * mean) > 1e-5 ||
            fabs(rvar[c] - ((1 - factor) + factor * var * m / (m - 1))) > 1e-4)
            stats_ok = 0;
        if (fabs(dbias[c] - sdy) > 1e-3 || fabs(dscale[c] - sdyxh) > 1e-3)
            bwd_ok = 0;
        for (int n = 0; n < BN; n++)
            for (int i = 0; i < BH * BW; i++) {
                int at = (n * BC + c) * BH * BW + i;
                double xh = (x[at] - mean) * inv;
                double want = scale[c] * inv / m * (m * dy[at] - sdy - xh * sdyxh);
                if (fabs(dx[at] - want) > 1e-4 * (1 + fabs(want)))
                    bwd_ok = 0;
            }
    }
    printf("batchnorm forward training: %s\n", fwd_ok ? "ok" : "MISMATCH");
    printf("batchnorm saved and running statistics: %s\n", stats_ok ? "ok" : "MISMATCH");
    printf("batchnorm backward: %s\n", bwd_ok ? "ok" : "MISMATCH");

    // inference with the running statistics just computed
    CHECK(cudnnBatchNormalizationForwardInference(g_handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                  xd, gx, xd, gy, bd, gp, gp + BC, gp + 2 * BC,
                                                  gp + 3 * BC, eps));
    CHECK_CUDA(cudaMemcpy(y, gy, sizeof y, cudaMemcpyDeviceToHost));
    int inf_ok = 1;
    for (int n = 0; n < BN; n++)
        for (int c = 0; c < BC; c++)
            for (int i = 0; i < BH * BW; i++) {
                int at = (n * BC + c) * BH * BW + i;
                double want = (x[at] - rmean[c]) / sqrt(rvar[c] + eps) * scale[c] + bias[c];
                if (fabs(y[at] - want) > 1e-4 * (1 + fabs(want)))
                    inf_ok = 0;
            }
    printf("batchnorm inference: %s\n", inf_ok ? "ok" : "MISMATCH");
    cudaFree(gws);
    cudaFree(greserve);
    cudaFree(d);
    CHECK(cudnnDestroyTensorDescriptor(xd));
    CHECK(cudnnDestroyTensorDescriptor(bd));
}

int main(int argc, char **argv)
{
    int isolation = argc > 1 && !strcmp(argv[1], "isolation");
    int hold = argc > 1 && !strcmp(argv[1], "hold");
    printf("cudnn 9: %d\n", (int)(cudnnGetVersion() / 10000) == 9);
    CHECK(cudnnCreate(&g_handle));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudnnSetStream(g_handle, stream));
    for (int i = 0; i < N * C * H * W; i++)
        hx[i] = (float)((i * 3) % 7) - 3.0f;
    for (int i = 0; i < K * C * R * S; i++)
        hw[i] = (float)((i * 5) % 5) - 2.0f;
    for (int i = 0; i < N * K * P * Q; i++)
        hy[i] = (float)(i % 5) - 2.0f;
    float *dx, *dw, *dy;
    CHECK_CUDA(cudaMalloc(&dx, sizeof hx));
    CHECK_CUDA(cudaMalloc(&dw, sizeof hw));
    CHECK_CUDA(cudaMalloc(&dy, sizeof hy + 4096));
    CHECK_CUDA(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dw, hw, sizeof hw, cudaMemcpyHostToDevice));

    struct plan fwd = conv_plan(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, 700);
    if (isolation) {
        CHECK(execute(&fwd, dx, dw, dy)); // a plan pilotd knows: its next executions may run in C
        // y 256 floats short of its end: the output would run past the allocation
        float *tail = (float *)((char *)dy + sizeof hy + 4096) - 256;
        cudnnStatus_t s = execute(&fwd, dx, dw, tail);
        printf("variant pack past the end of its buffer: %s\n",
               s == (cudnnStatus_t)-1 ? "refused at the next synchronize"
                                      : cudnnGetErrorString(s));
        float probe[4];
        cudaError_t e = cudaMemcpy(probe, dx, sizeof probe, cudaMemcpyDeviceToHost);
        printf("the program goes on: %s\n", cudaGetErrorName(e));
        printf("done\n");
        return 0;
    }
    if (hold) { // a plan and its descriptors held until the program is killed
        CHECK(execute(&fwd, dx, dw, dy));
        printf("holding\n");
        fflush(stdout);
        for (;;)
            pause();
    }
    float want[N * K * P * Q > N * C * H * W ? N * K * P * Q : N * C * H * W];
    float got[sizeof want / sizeof want[0]];
    CHECK(execute(&fwd, dx, dw, dy));
    // the same plan again on cleared output (a framework runs its plans every step)
    CHECK_CUDA(cudaMemset(dy, 0, sizeof hy));
    CHECK(execute(&fwd, dx, dw, dy));
    CHECK_CUDA(cudaMemcpy(got, dy, sizeof hy, cudaMemcpyDeviceToHost));
    reference_forward(want);
    printf("conv forward: %s\n", same(got, want, N * K * P * Q, 1e-5f));
    free_plan(&fwd);

    CHECK_CUDA(cudaMemcpy(dy, hy, sizeof hy, cudaMemcpyHostToDevice));
    struct plan bwd_data =
        conv_plan(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, 706);
    float *gdx;
    CHECK_CUDA(cudaMalloc(&gdx, sizeof hx));
    CHECK(execute(&bwd_data, gdx, dw, dy));
    CHECK_CUDA(cudaMemcpy(got, gdx, sizeof hx, cudaMemcpyDeviceToHost));
    reference_backward_data(want);
    printf("conv backward data: %s\n", same(got, want, N * C * H * W, 1e-5f));
    free_plan(&bwd_data);

    struct plan bwd_filter =
        conv_plan(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, 712);
    float *gdw;
    CHECK_CUDA(cudaMalloc(&gdw, sizeof hw));
    CHECK(execute(&bwd_filter, dx, gdw, dy));
    CHECK_CUDA(cudaMemcpy(got, gdw, sizeof hw, cudaMemcpyDeviceToHost));
    reference_backward_filter(want);
    printf("conv backward filter: %s\n", same(got, want, K * C * R * S, 1e-5f));
    free_plan(&bwd_filter);

    batchnorm();
    CHECK(cudnnDestroy(g_handle));
    printf("done\n");
    return 0;
}
