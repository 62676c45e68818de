/* What libpilot-cublas.so and libpilot-cublasLt.so share (blas.h): the session table, element
 * sizes, status names, logging. Compiled into each; hidden there. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "blas.h"
#include "ops_lookup.h"

static const struct pilot_driver_ops *g_ops;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void find(void)
{
    g_ops = pilot_ops_find("the cuBLAS stand-in",
                           "every cuBLAS call fails with CUBLAS_STATUS_NOT_INITIALIZED");
}

const struct pilot_driver_ops *pilot_blas_ops(void)
{
    pthread_once(&g_once, find);
    return g_ops;
}

size_t pilot_blas_type_size(int type)
{
    switch (type) {
    case CUDA_R_8I: case CUDA_R_8U: case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2:
        return 1;
    case CUDA_R_16F: case CUDA_R_16BF: case CUDA_C_8I: case CUDA_C_8U: case CUDA_R_16I:
    case CUDA_R_16U:
        return 2;
    case CUDA_R_32F: case CUDA_C_16F: case CUDA_C_16BF: case CUDA_R_32I: case CUDA_R_32U:
        return 4;
    case CUDA_R_64F: case CUDA_C_32F: case CUDA_C_32I: case CUDA_R_64I: case CUDA_R_64U:
        return 8;
    case CUDA_C_64F:
        return 16;
    default:
        return 0;
    }
}

void pilot_blas_log(int level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    if (ops)
        ops->log(level, msg);
    else
        fprintf(stderr, "pilot: %s\n", msg);
}

void pilot_blas_log_unsupported(const char *name)
{
    pilot_blas_log(1, "%s is not supported by pilot yet; returning CUBLAS_STATUS_NOT_SUPPORTED",
                   name);
}

cublasStatus_t pilot_blas_transport_error(const char *what, cudaError_t err)
{
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    pilot_blas_log(0, "%s: %s", what, ops ? ops->cudaGetErrorString(err) : "no session");
    if (err == cudaErrorMemoryAllocation)
        return CUBLAS_STATUS_ALLOC_FAILED;
    if (err == cudaErrorInvalidValue)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (err == cudaErrorNotSupported)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_NOT_INITIALIZED;
}

static const struct {
    int status;
    const char *name, *text;
} g_statuses[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED", "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE", "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH", "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR", "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED", "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED", "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR", "error detected trying to check the license"},
};

const char *pilot_blas_status_name(int status)
{
    for (size_t i = 0; i < sizeof g_statuses / sizeof g_statuses[0]; i++)
        if (g_statuses[i].status == status)
            return g_statuses[i].name;
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *pilot_blas_status_string(int status)
{
    for (size_t i = 0; i < sizeof g_statuses / sizeof g_statuses[0]; i++)
        if (g_statuses[i].status == status)
            return g_statuses[i].text;
    return "unknown error";
}

/* A handle of the real library in pilotd (LIB_CREATE) on `device`, or with version_only just
 * the library's version. Returns the library status. */
cublasStatus_t pilot_blas_create(int library, int device, int version_only, uint64_t *handle,
                                 uint64_t *version)
{
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    if (!ops)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    pilot_req_lib_create req = {.library = (uint32_t)library, .version_only = (uint32_t)version_only};
    pilot_rep_lib rep = {0};
    cudaError_t err = ops->call_on(device, PILOT_OP_LIB_CREATE, &req, sizeof req, NULL, 0, &rep,
                                   sizeof rep, NULL, 0, NULL);
    if (err)
        return pilot_blas_transport_error(
            library == PILOT_LIB_CUBLAS ? "cuBLAS in pilotd" : "cuBLASLt in pilotd", err);
    if (rep.status == CUBLAS_STATUS_SUCCESS) {
        if (handle)
            *handle = rep.value;
        if (version)
            *version = rep.version;
    } else {
        pilot_blas_log(0, "%s cannot be created in pilotd: %s (pilotd's log says why)",
                       library == PILOT_LIB_CUBLAS ? "a cuBLAS handle" : "a cuBLASLt handle",
                       pilot_blas_status_name(rep.status));
    }
    return (cublasStatus_t)rep.status;
}

/* The library's version, asked once (0 if pilotd cannot tell). */
uint64_t pilot_blas_version(int library)
{
    static uint64_t cached[PILOT_LIB_CUBLASLT + 1];
    int i = library == PILOT_LIB_CUBLAS ? PILOT_LIB_CUBLAS : PILOT_LIB_CUBLASLT;
    if (!__atomic_load_n(&cached[i], __ATOMIC_ACQUIRE)) {
        const struct pilot_driver_ops *ops = pilot_blas_ops();
        int device = 0;
        uint64_t version = 0;
        if (ops) {
            cudaError_t saved = ops->driver_begin();
            if (ops->cudaGetDevice(&device))
                device = 0;
            ops->driver_end(saved);
        }
        if (pilot_blas_create(library, device, 1, NULL, &version) == CUBLAS_STATUS_SUCCESS)
            __atomic_store_n(&cached[i], version, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&cached[i], __ATOMIC_ACQUIRE);
}

/* cublasGetProperty/cublasLtGetProperty from a version number major*10000 + minor*100 + patch. */
cublasStatus_t pilot_blas_property(int library, int type, int *value)
{
    if (!value)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t v = pilot_blas_version(library);
    if (!v)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    switch (type) {
    case MAJOR_VERSION: *value = (int)(v / 10000); return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = (int)(v / 100 % 100); return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = (int)(v % 100); return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

/* A new handle of `size` bytes whose start is a pilot_blas_handle of `library` on the calling
 * thread's current device (LIB_CREATE in pilotd), or NULL with *status saying why. */
void *pilot_blas_open(int library, size_t size, uint64_t *version, cublasStatus_t *status)
{
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    if (!ops) {
        *status = CUBLAS_STATUS_NOT_INITIALIZED;
        return NULL;
    }
    int device = 0;
    cudaError_t saved = ops->driver_begin();
    cudaError_t err = ops->cudaGetDevice(&device);
    ops->driver_end(saved);
    if (err) {
        *status = pilot_blas_transport_error("creating a cuBLAS handle", err);
        return NULL;
    }
    struct pilot_blas_handle *h = calloc(1, size);
    if (!h) {
        *status = CUBLAS_STATUS_ALLOC_FAILED;
        return NULL;
    }
    *status = pilot_blas_create(library, device, 0, &h->remote, version);
    if (*status != CUBLAS_STATUS_SUCCESS) {
        free(h);
        return NULL;
    }
    h->magic = library == PILOT_LIB_CUBLAS ? PILOT_CUBLAS_MAGIC : PILOT_CUBLASLT_MAGIC;
    h->device = device;
    return h;
}
