/* The cuBLAS and cuBLASLt stand-ins (libpilot-cublas.so, libpilot-cublasLt.so): what they share.
 *
 * NVIDIA's cuBLAS links a static CUDA runtime, which pilot cannot carry (docs/design/
 * frameworks.md, section 6a), so a program's cuBLAS calls are forwarded instead: the stand-ins
 * have the real libraries' SONAMEs and symbol versions (libcublas.so.13, libcublasLt.so.13), keep
 * handles and descriptors in the client, and send each GEMM to pilotd, which runs NVIDIA's
 * library in its own context on the session's stream after checking every pointer against the
 * session's memory. Every export the stand-ins do not implement is a generated stub (shim/
 * cublas_exports.tsv, cublasLt_exports.tsv) that logs its name once and returns
 * CUBLAS_STATUS_NOT_SUPPORTED.
 *
 * The types below are cuBLAS's public ABI (cublas_api.h, cublasLt.h of CUDA 13), declared here
 * because the stand-ins must build where cuBLAS is not installed. */
#ifndef PILOT_BLAS_H
#define PILOT_BLAS_H

#include <cuda_runtime_api.h>
#include <library_types.h>
#include <stddef.h>
#include <stdint.h>

#include "driver_ops.h"
#include "pilot_proto.h"

#define PILOT_BLAS_EXPORT __attribute__((visibility("default")))

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;
typedef enum { CUBLAS_ATOMICS_NOT_ALLOWED = 0, CUBLAS_ATOMICS_ALLOWED = 1 } cublasAtomicsMode_t;
typedef int cublasMath_t;          /* CUBLAS_DEFAULT_MATH 0 .. TF32 3, | 16 */
typedef int cublasComputeType_t;   /* CUBLAS_COMPUTE_16F 64 .. */
typedef int cublasGemmAlgo_t;      /* CUBLAS_GEMM_DEFAULT -1 .. */

struct cublasContext;
typedef struct cublasContext *cublasHandle_t;
struct cublasLtContext;
typedef struct cublasLtContext *cublasLtHandle_t;

/* The semi-opaque descriptors: a program may keep them in its own storage of these sizes
 * (cublasLt*Init), so pilot's state must fit in them. */
typedef struct { uint64_t data[8]; } cublasLtMatrixLayoutOpaque_t;
typedef struct { uint64_t data[32]; } cublasLtMatmulDescOpaque_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulPreferenceOpaque_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef cublasLtMatrixLayoutOpaque_t *cublasLtMatrixLayout_t;
typedef cublasLtMatmulDescOpaque_t *cublasLtMatmulDesc_t;
typedef cublasLtMatmulPreferenceOpaque_t *cublasLtMatmulPreference_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

/* The start of both libraries' handles. A cublasHandle_t may be passed where a cublasLtHandle_t
 * is expected (cuBLAS documents the cast, and PyTorch relies on it: it never creates a cuBLASLt
 * handle), so the cuBLASLt functions accept either kind; pilotd's cuBLAS handle is a valid
 * cuBLASLt handle of the real library too. */
#define PILOT_CUBLAS_MAGIC 0x70634268u   /* "hBcp" */
#define PILOT_CUBLASLT_MAGIC 0x70744c68u /* "hLtp" */
struct pilot_blas_handle {
    uint32_t magic;
    int device;
    uint64_t remote; /* pilotd's handle number */
};

/* The library's session table (libpilot.so's), or NULL (reported once) when it cannot be had. */
const struct pilot_driver_ops *pilot_blas_ops(void);
/* Bytes of one element of a cudaDataType, 0 for types pilot does not size (refused). */
size_t pilot_blas_type_size(int type);
/* The status a failed transport or session call becomes, logged once per kind with `what`. */
cublasStatus_t pilot_blas_transport_error(const char *what, cudaError_t err);
/* One line in the shim's log, printf-style. */
void pilot_blas_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Called by the generated stubs. */
void pilot_blas_log_unsupported(const char *name);
/* LIB_CREATE: a handle of the real library in pilotd on `device` (or only its version). */
cublasStatus_t pilot_blas_create(int library, int device, int version_only, uint64_t *handle,
                                 uint64_t *version);
uint64_t pilot_blas_version(int library); /* major*10000 + minor*100 + patch; 0 unknown */
/* A new handle (calloc'ed, `size` bytes starting with a pilot_blas_handle) on the current
 * device, or NULL with *status set. */
void *pilot_blas_open(int library, size_t size, uint64_t *version, cublasStatus_t *status);
cublasStatus_t pilot_blas_property(int library, int type, int *value);
/* A function of the generic path (shim/tables/cublas_calls.tsv), called by its generated export. */
cublasStatus_t pilot_blas_call(cublasHandle_t handle, const char *name, const char *kinds,
                               size_t elem, const uint64_t *args, int nargs);
cublasStatus_t pilot_blas_bad_argument(cublasHandle_t handle, const char *xerbla, int number);
/* One GEMM of libcublas: the typed functions' (generated from shim/tables/cublas_gemms.tsv) and
 * the Ex functions' (shim/libs/cublas_api.c), sent by pilot_blas_gemm. */
struct pilot_blas_gemm {
    const char *name;
    const char *xerbla; /* the name cuBLAS's argument-error line gives the function, printed
                         * "%-6s " as cuBLAS does ("GEMM_EX " has its own space on the H100) */
    int fn;             /* PILOT_GEMM_* */
    cublasOperation_t transa, transb;
    int m, n, k;
    const void *alpha, *a, *b, *beta;
    void *c;
    int atype, btype, ctype, lda, ldb, ldc, compute, algo, batch;
    long long stride_a, stride_b, stride_c;
};
cublasStatus_t pilot_blas_gemm(cublasHandle_t handle, const struct pilot_blas_gemm *g);
/* cublasGetStatusName/String for both libraries. */
const char *pilot_blas_status_name(int status);
const char *pilot_blas_status_string(int status);

#endif
