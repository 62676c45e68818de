/* libpilot-cudnn.so (SONAME libcudnn.so.9): cuDNN 9 forwarded to pilotd.
 *
 * NVIDIA's libcudnn.so.9 is a dispatcher that loads sub-libraries carrying a static CUDA runtime,
 * which pilot cannot carry (docs/design/frameworks.md, section 12). This stand-in has its SONAME
 * and version node; pilotd runs the real library in its own context (daemon/ops/dnn.py).
 *
 * - Handles: pilotd's handle of the real library (LIB_CREATE), the device it is on, and the
 *   program's stream (cudnnSetStream stays here and travels with each execution).
 * - The backend API (cudnnBackend*): descriptors live in pilotd, which gives out their numbers;
 *   every create, set, get, finalize and destroy is a call (a framework builds its plans once
 *   per shape and caches them). Descriptor and handle values travel as pilotd's numbers. Variant
 *   packs are the exception: frameworks build one per execution, so the stand-in keeps them and
 *   sends their tensors with cudnnBackendExecute, which is posted like a launch. pilotd checks
 *   each pointer against the extent of the plan's tensor with that unique id.
 * - The legacy calls PyTorch makes: tensor descriptors (kept here, sent by value) and batch
 *   normalization (posted; its size queries are calls, answered once per shape).
 * Every other export is a generated stub (shim/tables/cudnn_exports.tsv) that logs its name once and
 * returns CUDNN_STATUS_NOT_SUPPORTED. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <library_types.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_ops.h"
#include "ops_lookup.h"
#include "pilot_proto.h"

#define EXPORT __attribute__((visibility("default")))

/* cuDNN's public ABI (cudnn_graph.h, cudnn_ops.h of cuDNN 9), declared here because the
 * stand-in must build where cuDNN is not installed. */
typedef int cudnnStatus_t;
#define CUDNN_STATUS_SUCCESS 0
#define CUDNN_STATUS_NOT_INITIALIZED 1001
#define CUDNN_STATUS_BAD_PARAM 2000
#define CUDNN_STATUS_BAD_PARAM_NULL_POINTER 2002
#define CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED 2004
#define CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE 2010
#define CUDNN_STATUS_NOT_SUPPORTED 3000
#define CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED 4003
#define CUDNN_STATUS_EXECUTION_FAILED 5000

enum {
    TYPE_HANDLE = 0, TYPE_BOOLEAN = 2, TYPE_INT64 = 3, TYPE_FLOAT = 4, TYPE_DOUBLE = 5,
    TYPE_VOID_PTR = 6, TYPE_BACKEND_DESCRIPTOR = 15, TYPE_INT32 = 23, TYPE_CHAR = 24,
    TYPE_FRACTION = 26, TYPE_LAST = 33
};
enum { DESC_VARIANT_PACK = 16, DESC_TYPE_LAST = 50 };
enum {
    ATTR_VARIANT_PACK_UNIQUE_IDS = 1000, ATTR_VARIANT_PACK_DATA_POINTERS = 1001,
    ATTR_VARIANT_PACK_WORKSPACE = 1003
};
enum { DATA_FLOAT = 0, DATA_DOUBLE = 1, DATA_HALF = 2, DATA_BFLOAT16 = 9 };
enum { TENSOR_NCHW = 0, TENSOR_NHWC = 1 };
enum { BN_PER_ACTIVATION = 0, BN_SPATIAL = 1, BN_SPATIAL_PERSISTENT = 2 };
typedef enum { MAJOR_VERSION_ = 0, MINOR_VERSION_ = 1, PATCH_LEVEL_ = 2 } property_t;

#define HANDLE_MAGIC 0x6e644370u /* "pCdn" */
#define DESC_MAGIC 0x73644370u   /* "pCds" */
#define TENSOR_MAGIC 0x74644370u /* "pCdt" */
#define VARIANT_MAX 64           /* tensors in one variant pack */

struct cudnnContext {
    uint32_t magic;
    int device;
    uint64_t remote;
    cudaStream_t stream;
};
typedef struct cudnnContext *cudnnHandle_t;

struct pilot_dnn_desc {
    uint32_t magic;
    int type;
    int device;
    uint64_t remote;          /* pilotd's number; 0 for a variant pack */
    /* a variant pack (kept here) */
    int finalized, nuids, nptrs;
    int64_t uids[VARIANT_MAX];
    uint64_t ptrs[VARIANT_MAX];
    uint64_t workspace;
};
typedef void *cudnnBackendDescriptor_t;

struct cudnnTensorStruct {
    uint32_t magic;
    pilot_dnn_tensor t;
};
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;
typedef void *cudnnActivationDescriptor_t;

EXPORT const char *cudnnGetErrorString(cudnnStatus_t status);

/* ---- the session table, logging, the last error ---- */

static const struct pilot_driver_ops *g_ops;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static __thread char t_last_error[256];

static void find_ops(void)
{
    g_ops = pilot_ops_find("the cuDNN stand-in",
                           "every cuDNN call fails with CUDNN_STATUS_NOT_INITIALIZED");
}

static const struct pilot_driver_ops *ops(void)
{
    pthread_once(&g_once, find_ops);
    return g_ops;
}

enum { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 }; /* the shim's levels */

/* One line in the shim's log; every line also becomes this thread's last error
 * (cudnnGetLastErrorString), as cuDNN keeps the message of its last failure. */
static void dnn_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void dnn_log(int level, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(t_last_error, sizeof t_last_error, "%s", msg);
    const struct pilot_driver_ops *o = ops();
    if (o)
        o->log(level, msg);
    else
        fprintf(stderr, "pilot: %s\n", msg);
}

/* Called by the generated stubs (cudnn_stubs.c). */
void pilot_dnn_log_unsupported(const char *name);
void pilot_dnn_log_unsupported(const char *name)
{
    dnn_log(LOG_WARN, "%s is not supported by pilot yet; returning CUDNN_STATUS_NOT_SUPPORTED",
            name);
}

/* A failed transport or session call as a cuDNN status, logged. */
static cudnnStatus_t transport_error(const char *what, cudaError_t err)
{
    const struct pilot_driver_ops *o = ops();
    dnn_log(LOG_ERROR, "%s: %s", what, o ? o->cudaGetErrorString(err) : "no session");
    if (err == cudaErrorInvalidValue || err == cudaErrorInvalidResourceHandle)
        return CUDNN_STATUS_BAD_PARAM;
    if (err == cudaErrorNotSupported)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (err == cudaErrorMemoryAllocation)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    return CUDNN_STATUS_EXECUTION_FAILED;
}

/* A call to `device`'s part that issues no device work; the library status of its reply. */
static cudnnStatus_t call(int device, const char *what, uint16_t op, const void *req, size_t len,
                          const void *payload, size_t payload_len, pilot_rep_lib *rep, void *out,
                          size_t out_cap, size_t *out_len)
{
    const struct pilot_driver_ops *o = ops();
    if (!o)
        return CUDNN_STATUS_NOT_INITIALIZED;
    cudaError_t err = o->call_on(device, op, req, len, payload, payload_len, rep, sizeof *rep, out,
                                 out_cap, out_len);
    if (err)
        return transport_error(what, err);
    if (rep->status != CUDNN_STATUS_SUCCESS) /* routine: frameworks try engines that fail */
        dnn_log(LOG_DEBUG, "%s: %s in pilotd (its log says why)", what,
                cudnnGetErrorString(rep->status));
    return rep->status;
}

static int current_device(int *device)
{
    const struct pilot_driver_ops *o = ops();
    if (!o)
        return -1;
    cudaError_t saved = o->driver_begin();
    cudaError_t err = o->cudaGetDevice(device);
    o->driver_end(saved);
    return err ? -1 : 0;
}

/* ---- versions, errors ---- */

static uint64_t g_version, g_cudart_version;
static pthread_once_t g_version_once = PTHREAD_ONCE_INIT;

static void ask_version(void)
{
    int device = 0;
    if (current_device(&device))
        device = 0;
    pilot_req_lib_create req = {.library = PILOT_LIB_CUDNN, .version_only = 1};
    pilot_rep_lib rep = {0};
    if (call(device, "cudnnGetVersion", PILOT_OP_LIB_CREATE, &req, sizeof req, NULL, 0, &rep,
             NULL, 0, NULL) == CUDNN_STATUS_SUCCESS) {
        g_version = rep.version;
        g_cudart_version = rep.value;
    }
}

/* 0 when pilotd cannot run cuDNN (its log says why): frameworks then refuse to use it. */
EXPORT size_t cudnnGetVersion(void)
{
    pthread_once(&g_version_once, ask_version);
    return g_version;
}

EXPORT size_t cudnnGetCudartVersion(void)
{
    pthread_once(&g_version_once, ask_version);
    return g_cudart_version;
}

EXPORT cudnnStatus_t cudnnGetProperty(property_t type, int *value)
{
    size_t v = cudnnGetVersion();
    if (!value)
        return CUDNN_STATUS_BAD_PARAM;
    if (!v)
        return CUDNN_STATUS_NOT_INITIALIZED;
    switch (type) {
    case MAJOR_VERSION_: *value = (int)(v / 10000); return CUDNN_STATUS_SUCCESS;
    case MINOR_VERSION_: *value = (int)(v / 100 % 100); return CUDNN_STATUS_SUCCESS;
    case PATCH_LEVEL_: *value = (int)(v % 100); return CUDNN_STATUS_SUCCESS;
    default: return CUDNN_STATUS_BAD_PARAM;
    }
}

/* The sub-libraries' version checks: the stand-in is one library, consistent with itself. */
EXPORT cudnnStatus_t cudnnGraphVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
EXPORT cudnnStatus_t cudnnOpsVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
EXPORT cudnnStatus_t cudnnCnnVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
EXPORT cudnnStatus_t cudnnAdvVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }

static const struct {
    int status;
    const char *name;
} g_statuses[] = {
    {0, "CUDNN_STATUS_SUCCESS"},
    {1001, "CUDNN_STATUS_NOT_INITIALIZED"},
    {1002, "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH"},
    {1003, "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH"},
    {1004, "CUDNN_STATUS_DEPRECATED"},
    {1005, "CUDNN_STATUS_LICENSE_ERROR"},
    {1006, "CUDNN_STATUS_RUNTIME_IN_PROGRESS"},
    {1007, "CUDNN_STATUS_RUNTIME_FP_OVERFLOW"},
    {1008, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"},
    {2000, "CUDNN_STATUS_BAD_PARAM"},
    {2002, "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"},
    {2003, "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"},
    {2004, "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED"},
    {2005, "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND"},
    {2006, "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT"},
    {2007, "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH"},
    {2008, "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH"},
    {2009, "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES"},
    {2010, "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE"},
    {2011, "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH"},
    {2012, "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE"},
    {3000, "CUDNN_STATUS_NOT_SUPPORTED"},
    {3001, "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN"},
    {3002, "CUDNN_STATUS_NOT_SUPPORTED_SHAPE"},
    {3003, "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE"},
    {3004, "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT"},
    {3005, "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER"},
    {3006, "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART"},
    {3007, "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH"},
    {3008, "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING"},
    {3009, "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE"},
    {3010, "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT"},
    {3011, "CUDNN_STATUS_NOT_SUPPORTED_PADDING"},
    {3012, "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM"},
    {3013, "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API"},
    {3014, "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE"},
    {4000, "CUDNN_STATUS_INTERNAL_ERROR"},
    {4001, "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED"},
    {4002, "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE"},
    {4003, "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"},
    {4004, "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"},
    {4005, "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM"},
    {4006, "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED"},
    {5000, "CUDNN_STATUS_EXECUTION_FAILED"},
    {5001, "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER"},
    {5002, "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS"},
    {5003, "CUDNN_STATUS_EXECUTION_FAILED_CUDART"},
    {5004, "CUDNN_STATUS_EXECUTION_FAILED_CURAND"},
};

EXPORT const char *cudnnGetErrorString(cudnnStatus_t status)
{
    for (size_t i = 0; i < sizeof g_statuses / sizeof g_statuses[0]; i++)
        if (g_statuses[i].status == status)
            return g_statuses[i].name;
    return "CUDNN_UNKNOWN_STATUS_FOUND";
}

/* The last error this thread's cuDNN calls logged (cleared once read, as cuDNN's). */
EXPORT void cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (!message || !max_size)
        return;
    snprintf(message, max_size, "%s", t_last_error);
    t_last_error[0] = '\0';
}

/* ---- handles ---- */

static struct cudnnContext *live_handle(cudnnHandle_t h)
{
    return h && h->magic == HANDLE_MAGIC ? h : NULL;
}

EXPORT cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM;
    int device;
    if (current_device(&device))
        return CUDNN_STATUS_NOT_INITIALIZED;
    struct cudnnContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    pilot_req_lib_create req = {.library = PILOT_LIB_CUDNN};
    pilot_rep_lib rep = {0};
    cudnnStatus_t st = call(device, "cudnnCreate", PILOT_OP_LIB_CREATE, &req, sizeof req, NULL, 0,
                            &rep, NULL, 0, NULL);
    if (st != CUDNN_STATUS_SUCCESS) {
        free(h);
        return st;
    }
    h->magic = HANDLE_MAGIC;
    h->device = device;
    h->remote = rep.value;
    *handle = h;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
    struct cudnnContext *h = live_handle(handle);
    if (!h)
        return CUDNN_STATUS_BAD_PARAM;
    pilot_req_handle req = {.handle = h->remote};
    const struct pilot_driver_ops *o = ops();
    cudaError_t err = o->call_on(h->device, PILOT_OP_LIB_DESTROY, &req, sizeof req, NULL, 0, NULL,
                                 0, NULL, 0, NULL);
    h->magic = 0;
    free(h);
    return err ? transport_error("cudnnDestroy", err) : CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream)
{
    struct cudnnContext *h = live_handle(handle);
    if (!h)
        return CUDNN_STATUS_BAD_PARAM;
    const struct pilot_driver_ops *o = ops();
    uint64_t s = o->stream_handle(stream);
    if (s && o->handle_device(s) != h->device)
        return CUDNN_STATUS_BAD_PARAM; /* a stream of another device than the handle's */
    h->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *stream)
{
    struct cudnnContext *h = live_handle(handle);
    if (!h || !stream)
        return CUDNN_STATUS_BAD_PARAM;
    *stream = h->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the backend API ---- */

static size_t attribute_size(int type)
{
    switch (type) {
    case TYPE_BOOLEAN: case TYPE_CHAR: return 1;
    case TYPE_HANDLE: case TYPE_INT64: case TYPE_DOUBLE: case TYPE_VOID_PTR:
    case TYPE_BACKEND_DESCRIPTOR: return 8;
    case TYPE_FRACTION: return 16;
    default: return type >= 0 && type <= TYPE_LAST ? 4 : 0;
    }
}

static struct pilot_dnn_desc *live_desc(cudnnBackendDescriptor_t d)
{
    struct pilot_dnn_desc *desc = d;
    return desc && desc->magic == DESC_MAGIC ? desc : NULL;
}

EXPORT cudnnStatus_t cudnnBackendCreateDescriptor(int type, cudnnBackendDescriptor_t *out)
{
    if (!out)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (type < 0 || type > DESC_TYPE_LAST)
        return CUDNN_STATUS_BAD_PARAM;
    int device;
    if (current_device(&device))
        return CUDNN_STATUS_NOT_INITIALIZED;
    struct pilot_dnn_desc *d = calloc(1, sizeof *d);
    if (!d)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    d->type = type;
    d->device = device;
    if (type != DESC_VARIANT_PACK) {
        pilot_req_dnn_attr req = {.attr = (uint32_t)type};
        pilot_rep_lib rep = {0};
        cudnnStatus_t st = call(device, "cudnnBackendCreateDescriptor", PILOT_OP_DNN_DESC_CREATE,
                                &req, sizeof req, NULL, 0, &rep, NULL, 0, NULL);
        if (st != CUDNN_STATUS_SUCCESS) {
            free(d);
            return st;
        }
        d->remote = rep.value;
    }
    d->magic = DESC_MAGIC;
    *out = d;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t desc)
{
    struct pilot_dnn_desc *d = live_desc(desc);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (d->remote) {
        pilot_req_handle req = {.handle = d->remote};
        pilot_rep_lib rep = {0};
        st = call(d->device, "cudnnBackendDestroyDescriptor", PILOT_OP_DNN_DESC_DESTROY, &req,
                  sizeof req, NULL, 0, &rep, NULL, 0, NULL);
    }
    d->magic = 0;
    free(d);
    return st;
}

/* Where a variant pack keeps one of its attributes: the element type, the array, its count
 * (NULL: exactly one element, the workspace) and capacity; -1 for attributes pilot does not keep
 * (intermediates, the dynamic-shape overrides). Set and get both go through it. */
struct pack_field {
    int type;
    void *array;
    int *count;
    int max;
    const char *what;
};

static int pack_field(struct pilot_dnn_desc *d, int name, struct pack_field *f)
{
    switch (name) {
    case ATTR_VARIANT_PACK_UNIQUE_IDS:
        *f = (struct pack_field){TYPE_INT64, d->uids, &d->nuids, VARIANT_MAX, "tensors"};
        return 0;
    case ATTR_VARIANT_PACK_DATA_POINTERS:
        *f = (struct pack_field){TYPE_VOID_PTR, d->ptrs, &d->nptrs, VARIANT_MAX, "pointers"};
        return 0;
    case ATTR_VARIANT_PACK_WORKSPACE:
        *f = (struct pack_field){TYPE_VOID_PTR, &d->workspace, NULL, 1, "workspaces"};
        return 0;
    default:
        return -1;
    }
}

static cudnnStatus_t variant_pack_set(struct pilot_dnn_desc *d, int name, int type, int64_t count,
                                      const void *values)
{
    struct pack_field f;
    if (d->finalized)
        return CUDNN_STATUS_BAD_PARAM;
    if (pack_field(d, name, &f)) {
        dnn_log(LOG_WARN, "variant pack attribute %d is not supported by pilot", name);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    if (type != f.type)
        return CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE;
    if (!f.count && count != 1)
        return CUDNN_STATUS_BAD_PARAM;
    if (count > f.max) {
        dnn_log(LOG_WARN, "a variant pack of %lld %s: pilot carries up to %d", (long long)count,
                f.what, f.max);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    memcpy(f.array, values, (size_t)count * 8);
    if (f.count)
        *f.count = (int)count;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc, int name, int type,
                                              int64_t count, const void *values)
{
    struct pilot_dnn_desc *d = live_desc(desc);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    size_t size = attribute_size(type);
    if (!size || count < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (count && !values)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (d->type == DESC_VARIANT_PACK)
        return variant_pack_set(d, name, type, count, values);
    if (type == TYPE_VOID_PTR) {
        /* device pointers belong in variant packs, where pilotd checks them */
        dnn_log(LOG_WARN, "cudnnBackendSetAttribute: a pointer attribute (%d) outside a variant pack is "
                   "not supported by pilot", name);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    if ((size_t)count > (64u << 20) / size)
        return CUDNN_STATUS_BAD_PARAM;
    const void *payload = values;
    uint64_t *numbers = NULL;
    if (type == TYPE_BACKEND_DESCRIPTOR || type == TYPE_HANDLE) {
        numbers = malloc((size_t)count * 8 + 1);
        if (!numbers)
            return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
        for (int64_t i = 0; i < count; i++) {
            void *element = ((void *const *)values)[i];
            if (type == TYPE_HANDLE) {
                struct cudnnContext *h = live_handle(element);
                numbers[i] = h && h->device == d->device ? h->remote : 0;
            } else {
                struct pilot_dnn_desc *e = live_desc(element);
                numbers[i] = e && e->device == d->device ? e->remote : 0;
            }
            if (!numbers[i]) {
                free(numbers);
                dnn_log(LOG_WARN, "cudnnBackendSetAttribute: element %lld of attribute %d is not a live "
                           "%s of this device", (long long)i, name,
                        type == TYPE_HANDLE ? "handle" : "descriptor (or is a variant pack)");
                return CUDNN_STATUS_BAD_PARAM;
            }
        }
        payload = numbers;
    }
    pilot_req_dnn_attr req = {.desc = d->remote, .attr = (uint32_t)name, .type = (uint32_t)type,
                              .count = count};
    pilot_rep_lib rep = {0};
    cudnnStatus_t st = call(d->device, "cudnnBackendSetAttribute", PILOT_OP_DNN_DESC_SET, &req,
                            sizeof req, payload, (size_t)count * size, &rep, NULL, 0, NULL);
    free(numbers);
    return st;
}

static cudnnStatus_t variant_pack_get(struct pilot_dnn_desc *d, int name, int type,
                                      int64_t requested, int64_t *count, void *values)
{
    struct pack_field f;
    if (pack_field(d, name, &f))
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (type != f.type)
        return CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE;
    int64_t have = f.count ? *f.count : 1;
    if (count)
        *count = have;
    if (values && requested > 0)
        memcpy(values, f.array, (size_t)(requested < have ? requested : have) * 8);
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t desc, int name, int type,
                                              int64_t requested, int64_t *count, void *values)
{
    struct pilot_dnn_desc *d = live_desc(desc);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    size_t size = attribute_size(type);
    if (!size || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    /* No array is a count query whatever is requested, as cuDNN takes it (cudnn-frontend asks
     * for the engine's notes that way: requested CUDNN_NUMERICAL_NOTE_TYPE_COUNT, NULL). */
    if (!values)
        requested = 0;
    if (d->type == DESC_VARIANT_PACK)
        return variant_pack_get(d, name, type, requested, count, values);
    if (type == TYPE_VOID_PTR || type == TYPE_HANDLE) {
        dnn_log(LOG_WARN, "cudnnBackendGetAttribute: pointer and handle attributes (%d) are not "
                   "supported by pilot", name);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    if ((size_t)requested > (64u << 20) / size)
        return CUDNN_STATUS_BAD_PARAM;
    uint64_t *numbers = NULL;
    if (type == TYPE_BACKEND_DESCRIPTOR && requested) {
        /* the results fill descriptors the program created */
        numbers = malloc((size_t)requested * 8);
        if (!numbers)
            return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
        for (int64_t i = 0; i < requested; i++) {
            struct pilot_dnn_desc *e = live_desc(((void **)values)[i]);
            numbers[i] = e && e->device == d->device ? e->remote : 0;
            if (!numbers[i]) {
                free(numbers);
                return CUDNN_STATUS_BAD_PARAM;
            }
        }
    }
    pilot_req_dnn_attr req = {.desc = d->remote, .attr = (uint32_t)name, .type = (uint32_t)type,
                              .count = requested};
    pilot_rep_lib rep = {0};
    size_t got = 0;
    int into_values = type != TYPE_BACKEND_DESCRIPTOR && requested;
    cudnnStatus_t st = call(d->device, "cudnnBackendGetAttribute", PILOT_OP_DNN_DESC_GET, &req,
                            sizeof req, numbers, numbers ? (size_t)requested * 8 : 0, &rep,
                            into_values ? values : NULL, into_values ? (size_t)requested * size : 0,
                            &got);
    free(numbers);
    if (st == CUDNN_STATUS_SUCCESS && count)
        *count = (int64_t)rep.value;
    return st;
}

EXPORT cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc)
{
    struct pilot_dnn_desc *d = live_desc(desc);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    if (d->type == DESC_VARIANT_PACK) {
        if (d->finalized || d->nuids != d->nptrs) {
            dnn_log(LOG_WARN, "cudnnBackendFinalize: a variant pack %s",
                    d->finalized ? "finalized twice"
                                 : "whose pointers and unique ids differ in number");
            return CUDNN_STATUS_BAD_PARAM;
        }
        d->finalized = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    pilot_req_handle req = {.handle = d->remote};
    pilot_rep_lib rep = {0};
    return call(d->device, "cudnnBackendFinalize", PILOT_OP_DNN_DESC_FINALIZE, &req, sizeof req,
                NULL, 0, &rep, NULL, 0, NULL);
}

EXPORT cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                         cudnnBackendDescriptor_t variant_pack)
{
    struct cudnnContext *h = live_handle(handle);
    struct pilot_dnn_desc *p = live_desc(plan), *v = live_desc(variant_pack);
    if (!h || !p || !v || v->type != DESC_VARIANT_PACK || p->device != h->device) {
        dnn_log(LOG_WARN, "cudnnBackendExecute: %s", !h ? "not a cuDNN handle"
                : !p ? "not a plan" : !v || v->type != DESC_VARIANT_PACK ? "not a variant pack"
                : "the plan is of another device than the handle");
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (!v->finalized) {
        dnn_log(LOG_WARN, "cudnnBackendExecute: the variant pack is not finalized");
        return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
    }
    const struct pilot_driver_ops *o = ops();
    uint64_t stream = o->stream_handle(h->stream);
    pilot_req_dnn_execute req = {.handle = h->remote, .stream = stream, .plan = p->remote,
                                 .workspace = v->workspace, .count = (uint32_t)v->nuids};
    pilot_dnn_ptr tensors[VARIANT_MAX];
    for (int i = 0; i < v->nuids; i++)
        tensors[i] = (pilot_dnn_ptr){.uid = v->uids[i], .ptr = v->ptrs[i]};
    cudaError_t err = o->library_call(h->device, stream, "cudnnBackendExecute",
                                      PILOT_OP_DNN_EXECUTE, &req, sizeof req, tensors,
                                      sizeof tensors[0] * (size_t)v->nuids, NULL, 0, NULL, 0, NULL);
    return err ? transport_error("cudnnBackendExecute", err) : CUDNN_STATUS_SUCCESS;
}

/* ---- legacy tensor descriptors ---- */

static struct cudnnTensorStruct *live_tensor(cudnnTensorDescriptor_t t)
{
    return t && t->magic == TENSOR_MAGIC ? t : NULL;
}

static int known_data_type(int dtype)
{
    return dtype >= 0 && dtype <= 23;
}

EXPORT cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *out)
{
    if (!out)
        return CUDNN_STATUS_BAD_PARAM;
    struct cudnnTensorStruct *t = calloc(1, sizeof *t);
    if (!t)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    t->magic = TENSOR_MAGIC;
    *out = t;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc)
{
    struct cudnnTensorStruct *t = live_tensor(desc);
    if (!desc)
        return CUDNN_STATUS_SUCCESS; /* as cuDNN: destroying NULL is a no-op */
    if (!t)
        return CUDNN_STATUS_BAD_PARAM;
    t->magic = 0;
    free(t);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t set_nd(struct cudnnTensorStruct *t, int dtype, int nbdims, const int *dims,
                            const int *strides)
{
    if (!known_data_type(dtype))
        return CUDNN_STATUS_BAD_PARAM;
    if (nbdims < 3 || nbdims > PILOT_DNN_DIM_MAX)
        return CUDNN_STATUS_NOT_SUPPORTED;
    long long elements = 1;
    for (int i = 0; i < nbdims; i++) {
        if (dims[i] <= 0 || strides[i] <= 0)
            return CUDNN_STATUS_BAD_PARAM;
        elements *= dims[i];
        if (elements > (2LL << 30))
            return CUDNN_STATUS_NOT_SUPPORTED;
    }
    memset(&t->t, 0, sizeof t->t);
    t->t.dtype = dtype;
    t->t.nbdims = nbdims;
    memcpy(t->t.dims, dims, sizeof(int) * (size_t)nbdims);
    memcpy(t->t.strides, strides, sizeof(int) * (size_t)nbdims);
    return CUDNN_STATUS_SUCCESS;
}

/* Packed strides of `dims` in NCHW order, or NHWC (channels innermost). */
static void packed_strides(int format, int nbdims, const int *dims, int *strides)
{
    if (format == TENSOR_NHWC) {
        strides[1] = 1;
        int s = dims[1];
        for (int i = nbdims - 1; i >= 2; i--) {
            strides[i] = s;
            s *= dims[i];
        }
        strides[0] = s;
    } else {
        int s = 1;
        for (int i = nbdims - 1; i >= 0; i--) {
            strides[i] = s;
            s *= dims[i];
        }
    }
}

EXPORT cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t desc, int dtype,
                                                int nbdims, const int *dims, const int *strides)
{
    struct cudnnTensorStruct *t = live_tensor(desc);
    if (!t || !dims || !strides)
        return CUDNN_STATUS_BAD_PARAM;
    return set_nd(t, dtype, nbdims, dims, strides);
}

EXPORT cudnnStatus_t cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t desc, int format,
                                                  int dtype, int nbdims, const int *dims)
{
    struct cudnnTensorStruct *t = live_tensor(desc);
    if (!t || !dims || (format != TENSOR_NCHW && format != TENSOR_NHWC))
        return format == 2 ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_BAD_PARAM;
    if (nbdims < 3 || nbdims > PILOT_DNN_DIM_MAX)
        return CUDNN_STATUS_NOT_SUPPORTED;
    int strides[PILOT_DNN_DIM_MAX];
    for (int i = 0; i < nbdims; i++)
        if (dims[i] <= 0)
            return CUDNN_STATUS_BAD_PARAM;
    packed_strides(format, nbdims, dims, strides);
    return set_nd(t, dtype, nbdims, dims, strides);
}

EXPORT cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t desc, int dtype, int n,
                                                  int c, int h, int w, int ns, int cs, int hs,
                                                  int ws)
{
    struct cudnnTensorStruct *t = live_tensor(desc);
    if (!t)
        return CUDNN_STATUS_BAD_PARAM;
    const int dims[4] = {n, c, h, w}, strides[4] = {ns, cs, hs, ws};
    return set_nd(t, dtype, 4, dims, strides);
}

EXPORT cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, int format,
                                                int dtype, int n, int c, int h, int w)
{
    const int dims[4] = {n, c, h, w};
    return cudnnSetTensorNdDescriptorEx(desc, format, dtype, 4, dims);
}

EXPORT cudnnStatus_t cudnnGetTensorNdDescriptor(cudnnTensorDescriptor_t desc, int requested,
                                                int *dtype, int *nbdims, int *dims, int *strides)
{
    struct cudnnTensorStruct *t = live_tensor(desc);
    if (!t || !dtype || !nbdims || requested < 0 || (requested && (!dims || !strides)))
        return CUDNN_STATUS_BAD_PARAM;
    *dtype = t->t.dtype;
    *nbdims = t->t.nbdims;
    for (int i = 0; i < requested && i < t->t.nbdims; i++) {
        dims[i] = t->t.dims[i];
        strides[i] = t->t.strides[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetTensor4dDescriptor(cudnnTensorDescriptor_t desc, int *dtype, int *n,
                                                int *c, int *h, int *w, int *ns, int *cs,
                                                int *hs, int *ws)
{
    struct cudnnTensorStruct *t = live_tensor(desc);
    if (!t || t->t.nbdims != 4 || !dtype || !n || !c || !h || !w || !ns || !cs || !hs || !ws)
        return CUDNN_STATUS_BAD_PARAM;
    *dtype = t->t.dtype;
    *n = t->t.dims[0], *c = t->t.dims[1], *h = t->t.dims[2], *w = t->t.dims[3];
    *ns = t->t.strides[0], *cs = t->t.strides[1], *hs = t->t.strides[2], *ws = t->t.strides[3];
    return CUDNN_STATUS_SUCCESS;
}

static size_t data_type_size(int dtype)
{
    switch (dtype) {
    case 0: case 4: case 5: case 7: case 19: return 4;
    case 1: case 10: case 20: return 8;
    case 2: case 9: return 2;
    case 21: return 16;
    case 3: case 6: case 12: case 13: case 14: case 15: case 22: case 23: return 1;
    default: return 0;
    }
}

EXPORT cudnnStatus_t cudnnGetTensorSizeInBytes(cudnnTensorDescriptor_t desc, size_t *size)
{
    struct cudnnTensorStruct *t = live_tensor(desc);
    if (!t || !size || !t->t.nbdims)
        return CUDNN_STATUS_BAD_PARAM;
    size_t elem = data_type_size(t->t.dtype);
    if (!elem)
        return CUDNN_STATUS_NOT_SUPPORTED;
    size_t span = 1;
    for (int i = 0; i < t->t.nbdims; i++)
        span += (size_t)(t->t.dims[i] - 1) * (size_t)t->t.strides[i];
    *size = span * elem;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derived,
                                                   cudnnTensorDescriptor_t x, int mode)
{
    struct cudnnTensorStruct *d = live_tensor(derived), *t = live_tensor(x);
    if (!d || !t || !t->t.nbdims ||
        (mode != BN_PER_ACTIVATION && mode != BN_SPATIAL && mode != BN_SPATIAL_PERSISTENT))
        return CUDNN_STATUS_BAD_PARAM;
    int dims[PILOT_DNN_DIM_MAX], strides[PILOT_DNN_DIM_MAX];
    int nb = t->t.nbdims;
    for (int i = 0; i < nb; i++)
        dims[i] = i == 1 || (mode == BN_PER_ACTIVATION && i > 1) ? t->t.dims[i] : 1;
    packed_strides(TENSOR_NCHW, nb, dims, strides);
    int dtype = t->t.dtype == DATA_DOUBLE ? DATA_DOUBLE : DATA_FLOAT;
    return set_nd(d, dtype, nb, dims, strides);
}

/* ---- batch normalization ---- */

/* A descriptor by value; a NULL one is allowed where `optional`. */
static int tensor_arg(cudnnTensorDescriptor_t desc, int optional, pilot_dnn_tensor *out)
{
    if (!desc) {
        memset(out, 0, sizeof *out);
        return optional ? 0 : -1;
    }
    struct cudnnTensorStruct *t = live_tensor(desc);
    if (!t || !t->t.nbdims)
        return -1;
    *out = t->t;
    return 0;
}

static double host_scalar(const void *p, int dtype)
{
    if (dtype == DATA_DOUBLE)
        return *(const double *)p;
    return *(const float *)p;
}

/* Checks common to every batch normalization call: the handle, the operations and the
 * descriptors; fills the request's handle, stream and tensors. */
static cudnnStatus_t bn_begin(cudnnHandle_t handle, int fn, int mode, int bn_ops,
                              cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y,
                              cudnnTensorDescriptor_t dx, cudnnTensorDescriptor_t bn,
                              struct cudnnContext **hp, pilot_req_dnn_bn *req)
{
    struct cudnnContext *h = live_handle(handle);
    if (!h)
        return CUDNN_STATUS_BAD_PARAM;
    /* With CUDNN_BATCHNORM_OPS_BN cuDNN reads no added tensor and no activation (PyTorch
     * passes its input's descriptor as zDesc to the size query), so pilot ignores them too. */
    if (bn_ops != 0) {
        dnn_log(LOG_WARN, "batch normalization fused with an activation or an addition (bnOps "
                          "%d) is not supported by pilot", bn_ops);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    memset(req, 0, sizeof *req);
    if (tensor_arg(x, 0, &req->x) || tensor_arg(y, 1, &req->y) || tensor_arg(dx, 1, &req->dx) ||
        tensor_arg(bn, 1, &req->bn))
        return CUDNN_STATUS_BAD_PARAM;
    const struct pilot_driver_ops *o = ops();
    req->handle = h->remote;
    req->stream = o->stream_handle(h->stream);
    req->fn = fn;
    req->mode = mode;
    req->bn_ops = bn_ops;
    *hp = h;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t bn_post(struct cudnnContext *h, pilot_req_dnn_bn *req, const char *name)
{
    const struct pilot_driver_ops *o = ops();
    cudaError_t err = o->library_call(h->device, req->stream, name, PILOT_OP_DNN_BATCHNORM, req,
                                      sizeof *req, NULL, 0, NULL, 0, NULL, 0, NULL);
    return err ? transport_error(name, err) : CUDNN_STATUS_SUCCESS;
}

/* The size queries: asked once per distinct question (PyTorch asks before every call). */
#define SIZE_CACHE 64
static struct {
    pilot_req_dnn_bn req;
    size_t size;
    int used;
} g_sizes[SIZE_CACHE];
static unsigned g_sizes_next;
static pthread_mutex_t g_sizes_lock = PTHREAD_MUTEX_INITIALIZER;

static cudnnStatus_t bn_size(struct cudnnContext *h, pilot_req_dnn_bn *req, size_t *size,
                             const char *name)
{
    if (!size)
        return CUDNN_STATUS_BAD_PARAM;
    req->stream = 0; /* the answer does not depend on the stream */
    pthread_mutex_lock(&g_sizes_lock);
    for (int i = 0; i < SIZE_CACHE; i++)
        if (g_sizes[i].used && !memcmp(&g_sizes[i].req, req, sizeof *req)) {
            *size = g_sizes[i].size;
            pthread_mutex_unlock(&g_sizes_lock);
            return CUDNN_STATUS_SUCCESS;
        }
    pthread_mutex_unlock(&g_sizes_lock);
    pilot_rep_lib rep = {0};
    cudnnStatus_t st = call(h->device, name, PILOT_OP_DNN_BATCHNORM, req, sizeof *req, NULL, 0,
                            &rep, NULL, 0, NULL);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    *size = rep.value;
    pthread_mutex_lock(&g_sizes_lock);
    unsigned slot = g_sizes_next++ % SIZE_CACHE;
    g_sizes[slot].req = *req;
    g_sizes[slot].size = *size;
    g_sizes[slot].used = 1;
    pthread_mutex_unlock(&g_sizes_lock);
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t handle, int mode, int bn_ops, cudnnTensorDescriptor_t x,
    cudnnTensorDescriptor_t z, cudnnTensorDescriptor_t y, cudnnTensorDescriptor_t bn,
    cudnnActivationDescriptor_t activation, size_t *size)
{
    struct cudnnContext *h;
    pilot_req_dnn_bn req;
    /* the added tensor and the activation: read only with fused bnOps, refused (bn_begin) */
    (void)z, (void)activation;
    cudnnStatus_t st = bn_begin(handle, PILOT_BN_SIZE_FORWARD_WORKSPACE, mode, bn_ops, x, y,
                                NULL, bn, &h, &req);
    return st ? st : bn_size(h, &req, size, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize");
}

EXPORT cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t handle, int mode, int bn_ops, cudnnActivationDescriptor_t activation,
    cudnnTensorDescriptor_t x, size_t *size)
{
    struct cudnnContext *h;
    pilot_req_dnn_bn req;
    (void)activation; /* read only with fused bnOps, refused (bn_begin) */
    cudnnStatus_t st = bn_begin(handle, PILOT_BN_SIZE_RESERVE, mode, bn_ops, x, NULL, NULL,
                                NULL, &h, &req);
    return st ? st : bn_size(h, &req, size, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize");
}

EXPORT cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t handle, int mode, int bn_ops, cudnnTensorDescriptor_t x,
    cudnnTensorDescriptor_t y, cudnnTensorDescriptor_t dy, cudnnTensorDescriptor_t dz,
    cudnnTensorDescriptor_t dx, cudnnTensorDescriptor_t bn, cudnnActivationDescriptor_t activation,
    size_t *size)
{
    struct cudnnContext *h;
    pilot_req_dnn_bn req;
    /* y, dz and the activation: read only with fused bnOps, refused (bn_begin) */
    (void)y, (void)dz, (void)activation;
    cudnnStatus_t st = bn_begin(handle, PILOT_BN_SIZE_BACKWARD_WORKSPACE, mode, bn_ops, x, dy,
                                dx, bn, &h, &req);
    return st ? st : bn_size(h, &req, size, "cudnnGetBatchNormalizationBackwardExWorkspaceSize");
}

static cudnnStatus_t bn_forward(
    int fn, cudnnHandle_t handle, int mode, int bn_ops, const void *alpha, const void *beta,
    cudnnTensorDescriptor_t x_desc, const void *x, cudnnTensorDescriptor_t z_desc, const void *z,
    cudnnTensorDescriptor_t y_desc, void *y, cudnnTensorDescriptor_t bn_desc, const void *scale,
    const void *bias, double factor, void *running_mean, void *running_var, double epsilon,
    void *saved_mean, void *saved_inv_var, cudnnActivationDescriptor_t activation,
    void *workspace, size_t workspace_size, void *reserve, size_t reserve_size, const char *name)
{
    struct cudnnContext *h;
    pilot_req_dnn_bn req;
    /* the added tensor and the activation: read only with fused bnOps, refused (bn_begin) */
    (void)z_desc, (void)z, (void)activation;
    cudnnStatus_t st = bn_begin(handle, fn, mode, bn_ops, x_desc, y_desc, NULL, bn_desc, &h,
                                &req);
    if (st)
        return st;
    if (!alpha || !beta || !y_desc || !bn_desc)
        return CUDNN_STATUS_BAD_PARAM;
    req.alpha = host_scalar(alpha, req.x.dtype);
    req.beta = host_scalar(beta, req.x.dtype);
    req.x_ptr = (uintptr_t)x, req.y_ptr = (uintptr_t)y;
    req.scale = (uintptr_t)scale, req.bias = (uintptr_t)bias;
    req.running_mean = (uintptr_t)running_mean, req.running_var = (uintptr_t)running_var;
    req.saved_mean = (uintptr_t)saved_mean, req.saved_inv_var = (uintptr_t)saved_inv_var;
    req.workspace = (uintptr_t)workspace, req.workspace_size = workspace_size;
    req.reserve = (uintptr_t)reserve, req.reserve_size = reserve_size;
    req.factor = factor, req.epsilon = epsilon;
    return bn_post(h, &req, name);
}

EXPORT cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t handle, int mode, int bn_ops, const void *alpha, const void *beta,
    cudnnTensorDescriptor_t x_desc, const void *x, cudnnTensorDescriptor_t z_desc, const void *z,
    cudnnTensorDescriptor_t y_desc, void *y, cudnnTensorDescriptor_t bn_desc, const void *scale,
    const void *bias, double factor, void *running_mean, void *running_var, double epsilon,
    void *saved_mean, void *saved_inv_var, cudnnActivationDescriptor_t activation,
    void *workspace, size_t workspace_size, void *reserve, size_t reserve_size)
{
    return bn_forward(PILOT_BN_FORWARD_TRAINING_EX, handle, mode, bn_ops, alpha, beta,
                               x_desc, x, z_desc, z, y_desc, y, bn_desc, scale, bias, factor,
                               running_mean, running_var, epsilon, saved_mean, saved_inv_var,
                               activation, workspace, workspace_size, reserve, reserve_size,
                               "cudnnBatchNormalizationForwardTrainingEx");
}

EXPORT cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, int mode, const void *alpha, const void *beta,
    cudnnTensorDescriptor_t x_desc, const void *x, cudnnTensorDescriptor_t y_desc, void *y,
    cudnnTensorDescriptor_t bn_desc, const void *scale, const void *bias, double factor,
    void *running_mean, void *running_var, double epsilon, void *saved_mean, void *saved_inv_var)
{
    return bn_forward(PILOT_BN_FORWARD_TRAINING, handle, mode, 0, alpha, beta, x_desc, x,
                               NULL, NULL, y_desc, y, bn_desc, scale, bias, factor, running_mean,
                               running_var, epsilon, saved_mean, saved_inv_var, NULL, NULL, 0,
                               NULL, 0, "cudnnBatchNormalizationForwardTraining");
}

EXPORT cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, int mode, const void *alpha, const void *beta,
    cudnnTensorDescriptor_t x_desc, const void *x, cudnnTensorDescriptor_t y_desc, void *y,
    cudnnTensorDescriptor_t bn_desc, const void *scale, const void *bias, const void *mean,
    const void *variance, double epsilon)
{
    /* the request carries the estimated mean and variance where training's running ones go */
    return bn_forward(PILOT_BN_FORWARD_INFERENCE, handle, mode, 0, alpha, beta, x_desc,
                               x, NULL, NULL, y_desc, y, bn_desc, scale, bias, 0.0, (void *)mean,
                               (void *)variance, epsilon, NULL, NULL, NULL, NULL, 0, NULL, 0,
                               "cudnnBatchNormalizationForwardInference");
}

static cudnnStatus_t bn_backward(
    int fn, cudnnHandle_t handle, int mode, int bn_ops, const void *alpha_data,
    const void *beta_data, const void *alpha_param, const void *beta_param,
    cudnnTensorDescriptor_t x_desc, const void *x, cudnnTensorDescriptor_t dy_desc,
    const void *dy, cudnnTensorDescriptor_t dx_desc, void *dx, cudnnTensorDescriptor_t bn_desc,
    const void *scale, const void *bias, void *dscale, void *dbias, double epsilon,
    const void *saved_mean, const void *saved_inv_var, void *workspace, size_t workspace_size,
    void *reserve, size_t reserve_size, const char *name)
{
    struct cudnnContext *h;
    pilot_req_dnn_bn req;
    cudnnStatus_t st = bn_begin(handle, fn, mode, bn_ops, x_desc, dy_desc, dx_desc, bn_desc, &h,
                                &req);
    if (st)
        return st;
    if (!alpha_data || !beta_data || !alpha_param || !beta_param || !dy_desc || !dx_desc ||
        !bn_desc)
        return CUDNN_STATUS_BAD_PARAM;
    req.alpha = host_scalar(alpha_data, req.x.dtype);
    req.beta = host_scalar(beta_data, req.x.dtype);
    req.alpha_param = host_scalar(alpha_param, req.x.dtype);
    req.beta_param = host_scalar(beta_param, req.x.dtype);
    req.x_ptr = (uintptr_t)x, req.y_ptr = (uintptr_t)dy, req.dx_ptr = (uintptr_t)dx;
    req.scale = (uintptr_t)scale, req.bias = (uintptr_t)bias;
    req.dscale = (uintptr_t)dscale, req.dbias = (uintptr_t)dbias;
    req.saved_mean = (uintptr_t)saved_mean, req.saved_inv_var = (uintptr_t)saved_inv_var;
    req.workspace = (uintptr_t)workspace, req.workspace_size = workspace_size;
    req.reserve = (uintptr_t)reserve, req.reserve_size = reserve_size;
    req.epsilon = epsilon;
    return bn_post(h, &req, name);
}

EXPORT cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t handle, int mode, int bn_ops, const void *alpha_data, const void *beta_data,
    const void *alpha_param, const void *beta_param, cudnnTensorDescriptor_t x_desc,
    const void *x, cudnnTensorDescriptor_t y_desc, const void *y, cudnnTensorDescriptor_t dy_desc,
    const void *dy, cudnnTensorDescriptor_t dz_desc, void *dz, cudnnTensorDescriptor_t dx_desc,
    void *dx, cudnnTensorDescriptor_t bn_desc, const void *scale, const void *bias, void *dscale,
    void *dbias, double epsilon, const void *saved_mean, const void *saved_inv_var,
    cudnnActivationDescriptor_t activation, void *workspace, size_t workspace_size,
    void *reserve, size_t reserve_size)
{
    /* y, dz and the activation are read by cuDNN only with fused operations (bnOps other than
     * CUDNN_BATCHNORM_OPS_BN), which bn_begin refuses */
    (void)y_desc, (void)y, (void)dz_desc, (void)dz, (void)activation;
    return bn_backward(PILOT_BN_BACKWARD_EX, handle, mode, bn_ops, alpha_data, beta_data,
                       alpha_param, beta_param, x_desc, x, dy_desc, dy, dx_desc, dx, bn_desc,
                       scale, bias, dscale, dbias, epsilon, saved_mean, saved_inv_var, workspace,
                       workspace_size, reserve, reserve_size, "cudnnBatchNormalizationBackwardEx");
}

EXPORT cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, int mode, const void *alpha_data, const void *beta_data,
    const void *alpha_param, const void *beta_param, cudnnTensorDescriptor_t x_desc,
    const void *x, cudnnTensorDescriptor_t dy_desc, const void *dy,
    cudnnTensorDescriptor_t dx_desc, void *dx, cudnnTensorDescriptor_t bn_desc, const void *scale,
    void *dscale, void *dbias, double epsilon, const void *saved_mean, const void *saved_inv_var)
{
    return bn_backward(PILOT_BN_BACKWARD, handle, mode, 0, alpha_data, beta_data, alpha_param,
                       beta_param, x_desc, x, dy_desc, dy, dx_desc, dx, bn_desc, scale, NULL,
                       dscale, dbias, epsilon, saved_mean, saved_inv_var, NULL, 0, NULL, 0,
                       "cudnnBatchNormalizationBackward");
}
