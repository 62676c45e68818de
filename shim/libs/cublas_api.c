/* libpilot-cublas.so (SONAME libcublas.so.13): cuBLAS handles, their settings, host-device
 * vector and matrix copies, and the GEMM family, forwarded to pilotd (blas.h).
 *
 * A handle lives in the client: the device it was created on, pilotd's handle of the real
 * library there (one per program handle, so the library's default workspace and state are the
 * program's own, as natively), and the settings (stream, workspace, math, pointer and atomics
 * modes) each GEMM carries; pilotd applies those that changed before it calls the same cuBLAS
 * function the program called. GEMMs are posted like launches: argument errors cuBLAS reports
 * at once are checked here, pointer checks are pilotd's and fail the session's next
 * synchronizing call, as a kernel's bad access would. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"

#define HANDLE_MAGIC PILOT_CUBLAS_MAGIC

struct cublasContext {
    struct pilot_blas_handle base; /* first: the cuBLASLt functions read it (blas.h) */
    uint64_t version;
    cudaStream_t stream;
    void *workspace;
    size_t workspace_size;
    int workspace_set;
    int math_mode, pointer_mode, atomics_mode, sm_count_target;
};

static struct cublasContext *live(cublasHandle_t h)
{
    return h && h->base.magic == HANDLE_MAGIC ? h : NULL;
}

/* ---- handles and their settings ---- */

PILOT_BLAS_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st;
    uint64_t version = 0;
    struct cublasContext *h = pilot_blas_open(PILOT_LIB_CUBLAS, sizeof *h, &version, &st);
    if (h) {
        h->version = version;
        *handle = h;
    }
    return st;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    struct cublasContext *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    pilot_req_handle req = {.handle = h->base.remote};
    cudaError_t err = ops->call_on(h->base.device, PILOT_OP_LIB_DESTROY, &req, sizeof req, NULL, 0, NULL,
                                   0, NULL, 0, NULL);
    h->base.magic = 0;
    free(h);
    return err ? pilot_blas_transport_error("cublasDestroy", err) : CUBLAS_STATUS_SUCCESS;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle,
                                         int *version)
{
    struct cublasContext *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = (int)h->version;
    return CUBLAS_STATUS_SUCCESS;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value)
{
    return pilot_blas_property(PILOT_LIB_CUBLAS, type, value);
}

PILOT_BLAS_EXPORT size_t cublasGetCudartVersion(void)
{
    return CUDART_VERSION;
}

PILOT_BLAS_EXPORT const char *cublasGetStatusName(cublasStatus_t status)
{
    return pilot_blas_status_name(status);
}

PILOT_BLAS_EXPORT const char *cublasGetStatusString(cublasStatus_t status)
{
    return pilot_blas_status_string(status);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t handle,
                                         cudaStream_t stream)
{
    struct cublasContext *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    /* As cuBLAS does: a new stream takes the handle back to its default workspace. */
    h->stream = stream;
    h->workspace = NULL;
    h->workspace_size = 0;
    h->workspace_set = 0;
    return CUBLAS_STATUS_SUCCESS;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetStream_v2(cublasHandle_t handle,
                                         cudaStream_t *stream)
{
    struct cublasContext *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream)
        return CUBLAS_STATUS_INVALID_VALUE;
    *stream = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle,
                                         void *workspace,
                                                       size_t size)
{
    struct cublasContext *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (size && !workspace)
        return CUBLAS_STATUS_INVALID_VALUE;
    h->workspace = workspace;
    h->workspace_size = workspace ? size : 0;
    h->workspace_set = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* The handle's integer settings: a getter and a setter each, with cuBLAS's checks. */
static cublasStatus_t get_setting(cublasHandle_t handle, int *field_of_h, int *out)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    *out = *field_of_h;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t set_setting(cublasHandle_t handle, int *field_of_h, int value, int valid)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!valid)
        return CUBLAS_STATUS_INVALID_VALUE;
    *field_of_h = value;
    return CUBLAS_STATUS_SUCCESS;
}

/* The field of a handle that may be invalid (read only after live() said it is one). */
#define FIELD(handle, field) ((handle) ? &(handle)->field : NULL)

PILOT_BLAS_EXPORT cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle,
                                         cublasPointerMode_t *out)
{
    _Static_assert(sizeof(cublasPointerMode_t) == sizeof(int), "an int-sized setting");
    return get_setting(handle, FIELD(handle, pointer_mode), (int *)out);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle,
                                         cublasPointerMode_t value)
{
    int v = (int)value;
    return set_setting(handle, FIELD(handle, pointer_mode), v,
                       v == CUBLAS_POINTER_MODE_HOST || v == CUBLAS_POINTER_MODE_DEVICE);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetAtomicsMode(cublasHandle_t handle,
                                         cublasAtomicsMode_t *out)
{
    _Static_assert(sizeof(cublasAtomicsMode_t) == sizeof(int), "an int-sized setting");
    return get_setting(handle, FIELD(handle, atomics_mode), (int *)out);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle,
                                         cublasAtomicsMode_t value)
{
    int v = (int)value;
    return set_setting(handle, FIELD(handle, atomics_mode), v,
                       v == CUBLAS_ATOMICS_NOT_ALLOWED || v == CUBLAS_ATOMICS_ALLOWED);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetMathMode(cublasHandle_t handle,
                                         cublasMath_t *out)
{
    _Static_assert(sizeof(cublasMath_t) == sizeof(int), "an int-sized setting");
    return get_setting(handle, FIELD(handle, math_mode), (int *)out);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetMathMode(cublasHandle_t handle,
                                         cublasMath_t value)
{
    int v = (int)value; /* modes 0..3, | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (16) */
    return set_setting(handle, FIELD(handle, math_mode), v,
                       (v & ~16) >= 0 && (v & ~16) <= 3);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetSmCountTarget(cublasHandle_t handle,
                                         int *out)
{
    _Static_assert(sizeof(int) == sizeof(int), "an int-sized setting");
    return get_setting(handle, FIELD(handle, sm_count_target), (int *)out);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetSmCountTarget(cublasHandle_t handle,
                                         int value)
{
    int v = (int)value;
    return set_setting(handle, FIELD(handle, sm_count_target), v,
                       v >= 0);
}

/* ---- vectors and matrices between host and device (the runtime's 2D copies) ---- */

static cublasStatus_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream, int async)
{
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    if (!ops)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!width || !height)
        return CUBLAS_STATUS_SUCCESS;
    cudaError_t saved = ops->driver_begin();
    cudaError_t err = async ? ops->cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind,
                                                     stream)
                            : ops->cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind);
    ops->driver_end(saved);
    if (err) {
        pilot_blas_log(2, "cuBLAS vector/matrix copy: %s", ops->cudaGetErrorString(err));
        return CUBLAS_STATUS_MAPPING_ERROR;
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t vector(int n, int elem, const void *x, int incx, void *y, int incy,
                             enum cudaMemcpyKind kind, cudaStream_t stream, int async)
{
    if (n < 0 || elem <= 0 || incx <= 0 || incy <= 0 || !x || !y)
        return CUBLAS_STATUS_INVALID_VALUE;
    return copy_2d(y, (size_t)incy * (size_t)elem, x, (size_t)incx * (size_t)elem, (size_t)elem,
                   (size_t)n, kind, stream, async);
}

static cublasStatus_t matrix(int rows, int cols, int elem, const void *a, int lda, void *b,
                             int ldb, enum cudaMemcpyKind kind, cudaStream_t stream, int async)
{
    /* As cuBLAS: a leading dimension below the rows is not an argument error, the copy fails
     * (CUBLAS_STATUS_MAPPING_ERROR). */
    if (rows < 0 || cols < 0 || elem <= 0 || lda <= 0 || ldb <= 0 || !a || !b)
        return CUBLAS_STATUS_INVALID_VALUE;
    return copy_2d(b, (size_t)ldb * (size_t)elem, a, (size_t)lda * (size_t)elem,
                   (size_t)rows * (size_t)elem, (size_t)cols, kind, stream, async);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetVector(int n, int elem, const void *x, int incx, void *y,
                                                 int incy)
{
    return vector(n, elem, x, incx, y, incy, cudaMemcpyHostToDevice, 0, 0);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetVector(int n, int elem, const void *x, int incx, void *y,
                                                 int incy)
{
    return vector(n, elem, x, incx, y, incy, cudaMemcpyDeviceToHost, 0, 0);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetVectorAsync(int n, int elem, const void *x, int incx,
                                                      void *y, int incy, cudaStream_t stream)
{
    return vector(n, elem, x, incx, y, incy, cudaMemcpyHostToDevice, stream, 1);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetVectorAsync(int n, int elem, const void *x, int incx,
                                                      void *y, int incy, cudaStream_t stream)
{
    return vector(n, elem, x, incx, y, incy, cudaMemcpyDeviceToHost, stream, 1);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetMatrix(int rows, int cols, int elem, const void *a,
                                                 int lda, void *b, int ldb)
{
    return matrix(rows, cols, elem, a, lda, b, ldb, cudaMemcpyHostToDevice, 0, 0);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetMatrix(int rows, int cols, int elem, const void *a,
                                                 int lda, void *b, int ldb)
{
    return matrix(rows, cols, elem, a, lda, b, ldb, cudaMemcpyDeviceToHost, 0, 0);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasSetMatrixAsync(int rows, int cols, int elem, const void *a,
                                                      int lda, void *b, int ldb,
                                                      cudaStream_t stream)
{
    return matrix(rows, cols, elem, a, lda, b, ldb, cudaMemcpyHostToDevice, stream, 1);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGetMatrixAsync(int rows, int cols, int elem, const void *a,
                                                      int lda, void *b, int ldb,
                                                      cudaStream_t stream)
{
    return matrix(rows, cols, elem, a, lda, b, ldb, cudaMemcpyDeviceToHost, stream, 1);
}

/* ---- the GEMM family: one request each (the typed functions are generated from
 * shim/tables/cublas_gemms.tsv, the Ex functions below take their types as arguments) ---- */

/* Bytes of alpha and beta: the scale type of a GEMM of compute type `compute` writing `ctype`. */
static size_t scalar_size(int compute, int ctype)
{
    switch (compute) {
    case 64: case 65:                                  /* CUBLAS_COMPUTE_16F(_PEDANTIC) */
        return ctype == CUDA_C_16F ? 4 : 2;
    case 70: case 71: case 79:                         /* CUBLAS_COMPUTE_64F... */
        return ctype == CUDA_C_64F ? 16 : 8;
    case 72: case 73:                                  /* CUBLAS_COMPUTE_32I... */
        return 4;
    default:                                           /* CUBLAS_COMPUTE_32F... */
        return ctype == CUDA_C_32F ? 8 : 4;
    }
}

static int op_valid(int op)
{
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

/* The number cuBLAS gives the first argument it refuses (its xerbla line; from 1, the handle not
 * counted), 0 if none, -1 for a refusal it does not print. The numbers of lda, ldb, ldc and
 * batch per function are the H100's (tests/gpu/cublas/xerbla_probe.cu, bench/RESULTS.md): the
 * strided-batched typed functions number as if they had no strides, GemmStridedBatchedEx counts
 * them and prints nothing for a negative batch. */
static int bad_argument(const struct pilot_blas_gemm *g)
{
    static const int places[][4] = {
        [PILOT_GEMM_S] = {8, 10, 13, 0},          [PILOT_GEMM_D] = {8, 10, 13, 0},
        [PILOT_GEMM_H] = {8, 10, 13, 0},          [PILOT_GEMM_EX] = {9, 12, 16, 0},
        [PILOT_GEMM_S_STRIDED] = {8, 10, 13, 14}, [PILOT_GEMM_D_STRIDED] = {8, 10, 13, 14},
        [PILOT_GEMM_H_STRIDED] = {8, 10, 13, 14}, [PILOT_GEMM_EX_STRIDED] = {9, 13, 18, -1},
        [PILOT_GEMM_C] = {8, 10, 13, 0},          [PILOT_GEMM_Z] = {8, 10, 13, 0},
        [PILOT_GEMM_C_STRIDED] = {8, 10, 13, 14}, [PILOT_GEMM_Z_STRIDED] = {8, 10, 13, 14},
        [PILOT_GEMM_S_BATCHED] = {8, 10, 13, 14}, [PILOT_GEMM_D_BATCHED] = {8, 10, 13, 14},
        [PILOT_GEMM_C_BATCHED] = {8, 10, 13, 14}, [PILOT_GEMM_Z_BATCHED] = {8, 10, 13, 14},
        [PILOT_GEMM_EX_BATCHED] = {9, 12, 16, -1},
    };
    const int *at = places[g->fn];
    int rows_a = g->transa == CUBLAS_OP_N ? g->m : g->k;
    int rows_b = g->transb == CUBLAS_OP_N ? g->k : g->n;
    if (!op_valid(g->transa))
        return 1;
    if (!op_valid(g->transb))
        return 2;
    if (g->m < 0)
        return 3;
    if (g->n < 0)
        return 4;
    if (g->k < 0)
        return 5;
    if (g->lda < (rows_a > 1 ? rows_a : 1))
        return at[0];
    if (g->ldb < (rows_b > 1 ? rows_b : 1))
        return at[1];
    if (g->ldc < (g->m > 1 ? g->m : 1))
        return at[2];
    if (g->batch < 0)
        return at[3];
    return 0;
}

/* One GEMM (blas.h): cuBLAS's argument checks here, then posted to pilotd like a launch. */
cublasStatus_t pilot_blas_gemm(cublasHandle_t handle, const struct pilot_blas_gemm *g)
{
    struct cublasContext *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int bad = bad_argument(g);
    if (bad)
        return pilot_blas_bad_argument(handle, bad > 0 ? g->xerbla : NULL, bad);
    if (!g->m || !g->n || !g->batch)
        return CUBLAS_STATUS_SUCCESS; /* nothing to compute, as cuBLAS */
    if (!g->alpha || !g->beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!pilot_blas_type_size(g->atype) || !pilot_blas_type_size(g->btype) ||
        !pilot_blas_type_size(g->ctype)) {
        pilot_blas_log(1, "%s: data types %d/%d/%d are not supported by pilot", g->name, g->atype,
                       g->btype, g->ctype);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    uint64_t stream = ops->stream_handle(h->stream);
    if (stream && ops->handle_device(stream) != h->base.device)
        return CUBLAS_STATUS_INVALID_VALUE; /* a stream of another device than the handle's */
    pilot_req_blas_gemm req = {
        .handle = h->base.remote, .stream = stream,
        .workspace = (uintptr_t)h->workspace, .workspace_size = h->workspace_size,
        .workspace_set = h->workspace_set,
        .a = (uintptr_t)g->a, .b = (uintptr_t)g->b, .c = (uintptr_t)g->c,
        .stride_a = g->stride_a, .stride_b = g->stride_b, .stride_c = g->stride_c,
        .fn = g->fn, .transa = g->transa, .transb = g->transb, .m = g->m, .n = g->n, .k = g->k,
        .lda = g->lda, .ldb = g->ldb, .ldc = g->ldc, .batch = g->batch,
        .atype = g->atype, .btype = g->btype, .ctype = g->ctype, .compute_type = g->compute,
        .algo = g->algo, .math_mode = h->math_mode, .pointer_mode = h->pointer_mode,
        .atomics_mode = h->atomics_mode, .sm_count_target = h->sm_count_target,
    };
    if (h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE) {
        req.alpha_ptr = (uintptr_t)g->alpha;
        req.beta_ptr = (uintptr_t)g->beta;
    } else {
        size_t size = scalar_size(g->compute, g->ctype);
        memcpy(req.alpha, g->alpha, size);
        memcpy(req.beta, g->beta, size);
    }
    cudaError_t err = ops->library_call(h->base.device, stream, g->name, PILOT_OP_BLAS_GEMM, &req,
                                        sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
    return err ? pilot_blas_transport_error(g->name, err) : CUBLAS_STATUS_SUCCESS;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGemmBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *const A[], cudaDataType Atype, int lda, const void *const B[],
    cudaDataType Btype, int ldb, const void *beta, void *const C[], cudaDataType Ctype, int ldc,
    int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    struct pilot_blas_gemm g = {"cublasGemmBatchedEx", "GEMM_EX ", PILOT_GEMM_EX_BATCHED, transa,
                                transb, m, n, k, alpha, A, B, beta, (void *)C, Atype, Btype, Ctype,
                                lda, ldb, ldc, compute, algo, batch, 0, 0, 0};
    return pilot_blas_gemm(handle, &g);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle,
                                         cublasOperation_t transa,
                                              cublasOperation_t transb, int m, int n, int k,
                                              const void *alpha, const void *A, cudaDataType Atype,
                                              int lda, const void *B, cudaDataType Btype, int ldb,
                                              const void *beta, void *C, cudaDataType Ctype,
                                              int ldc, cublasComputeType_t compute,
                                              cublasGemmAlgo_t algo)
{
    struct pilot_blas_gemm g = {"cublasGemmEx", "GEMM_EX ", PILOT_GEMM_EX,
                                transa, transb, m, n, k, alpha, A, B, beta, C,
                                Atype, Btype, Ctype, lda, ldb, ldc, compute, algo, 1, 0, 0, 0};
    return pilot_blas_gemm(handle, &g);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long stride_a,
    const void *B, cudaDataType Btype, int ldb, long long stride_b, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long stride_c, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo)
{
    struct pilot_blas_gemm g = {"cublasGemmStridedBatchedEx", "GEMM_EX ",
                                PILOT_GEMM_EX_STRIDED, transa, transb, m, n, k,
                                alpha, A, B, beta, C, Atype, Btype, Ctype, lda, ldb, ldc, compute,
                                algo, batch, stride_a, stride_b, stride_c};
    return pilot_blas_gemm(handle, &g);
}

/* ---- the generic path (shim/tables/cublas_calls.tsv; the exported functions are generated) ---- */

/* An argument check failed: cuBLAS's stdout line (its xerbla; where the H100's name for the
 * function is known) and CUBLAS_STATUS_INVALID_VALUE; a bad handle comes first. */
cublasStatus_t pilot_blas_bad_argument(cublasHandle_t handle, const char *xerbla, int number)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (xerbla)
        printf(" ** On entry to %-6s parameter number %d had an illegal value\n", xerbla, number);
    return CUBLAS_STATUS_INVALID_VALUE;
}

/* One call of a generated function: `kinds` names its arguments after the handle (i int, s
 * scalar, p device pointer, r result of the type, x int result; shim/tables/cublas_calls.tsv) and
 * `elem` is the size of its type. Scalars travel by value under the host pointer mode; a result
 * the host waits for makes the call synchronous (as natively), anything else is posted like a
 * launch, and pilotd's argument and range checks then fail the next synchronizing call. */
cublasStatus_t pilot_blas_call(cublasHandle_t handle, const char *name, const char *kinds,
                               size_t elem, const uint64_t *args, int nargs)
{
    struct cublasContext *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    uint64_t stream = ops->stream_handle(h->stream);
    if (stream && ops->handle_device(stream) != h->base.device)
        return CUBLAS_STATUS_INVALID_VALUE;
    pilot_req_blas_call req = {
        .handle = h->base.remote, .stream = stream, .nargs = nargs,
        .workspace = (uintptr_t)h->workspace, .workspace_size = h->workspace_size,
        .workspace_set = h->workspace_set, .pointer_mode = h->pointer_mode,
        .math_mode = h->math_mode, .atomics_mode = h->atomics_mode,
        .sm_count_target = h->sm_count_target,
    };
    int host = h->pointer_mode == CUBLAS_POINTER_MODE_HOST, scalars = 0;
    void *result = NULL;
    size_t result_size = 0;
    for (int i = 0; i < nargs && i < PILOT_BLAS_ARGS_MAX; i++) {
        req.args[i] = args[i];
        if (kinds[2 * i] == 's' && host) {
            if (!args[i] || scalars >= 2)
                return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(req.scalars[scalars++], (const void *)(uintptr_t)args[i], elem);
            req.args[i] = 0;
        } else if ((kinds[2 * i] == 'r' || kinds[2 * i] == 'x') && host) {
            result = (void *)(uintptr_t)args[i];
            result_size = kinds[2 * i] == 'x' ? sizeof(int) : elem;
            if (!result)
                return CUBLAS_STATUS_INVALID_VALUE;
            req.args[i] = 0;
        }
    }
    size_t name_len = strlen(name) + 1;
    if (!result) {
        cudaError_t err = ops->library_call(h->base.device, stream, name, PILOT_OP_BLAS_CALL, &req,
                                            sizeof req, name, name_len, NULL, 0, NULL, 0, NULL);
        return err ? pilot_blas_transport_error(name, err) : CUBLAS_STATUS_SUCCESS;
    }
    pilot_rep_lib rep = {0};
    uint8_t out[16];
    size_t got = 0;
    cudaError_t err = ops->library_call(h->base.device, stream, name, PILOT_OP_BLAS_CALL, &req,
                                        sizeof req, name, name_len, &rep, sizeof rep, out,
                                        sizeof out, &got);
    if (err)
        return pilot_blas_transport_error(name, err);
    if (rep.status == CUBLAS_STATUS_SUCCESS) {
        if (got != result_size)
            return CUBLAS_STATUS_INTERNAL_ERROR;
        memcpy(result, out, result_size);
    }
    return (cublasStatus_t)rep.status;
}
