/* libpilot-cublasLt.so (SONAME libcublasLt.so.13): cuBLASLt handles, matmul descriptors, matrix
 * layouts, preferences, the heuristic query and cublasLtMatmul, forwarded to pilotd (blas.h).
 *
 * Descriptors live in the client, inside the descriptor's own storage (a program may provide it:
 * cublasLt*Init_internal with the semi-opaque sizes), as the values of the attributes pilot
 * supports, each described once in a table below (number, size, default). A matmul or heuristic
 * query sends every attribute that differs from its default (and the create functions'
 * arguments) as records (pilot_lt_attr); pilotd builds the same descriptors on the real library.
 * An attribute pilot does not support is refused when it is set (CUBLAS_STATUS_NOT_SUPPORTED,
 * logged), never silently dropped. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"

#define LT_HANDLE_MAGIC PILOT_CUBLASLT_MAGIC

struct cublasLtContext {
    struct pilot_blas_handle base;
};

/* A cuBLASLt handle, or a cuBLAS handle cast to one (blas.h). */
static struct pilot_blas_handle *live(cublasLtHandle_t h)
{
    const struct pilot_blas_handle *b = (const struct pilot_blas_handle *)h;
    return b && (b->magic == LT_HANDLE_MAGIC || b->magic == PILOT_CUBLAS_MAGIC)
               ? (struct pilot_blas_handle *)b : NULL;
}

/* ---- descriptors: one table of attributes per kind ---- */

struct attr {
    uint16_t id;
    uint16_t size;
    int64_t dflt; /* the library's default (as the attribute's integer; 0.0f for floats) */
};

enum kind { KIND_DESC = 0, KIND_LAYOUT = 1, KIND_PREF = 2, KINDS };

static const struct attr g_desc_attrs[] = {
    {0, 4, -1},  /* COMPUTE_TYPE (from create) */
    {1, 4, -1},  /* SCALE_TYPE (from create) */
    {2, 4, 0},   /* POINTER_MODE */
    {3, 4, 0},   /* TRANSA */
    {4, 4, 0},   /* TRANSB */
    {5, 4, 0},   /* TRANSC */
    {6, 4, 2},   /* FILL_MODE: CUBLAS_FILL_MODE_FULL */
    {7, 4, 1},   /* EPILOGUE: CUBLASLT_EPILOGUE_DEFAULT */
    {8, 8, 0},   /* BIAS_POINTER */
    {10, 8, 0},  /* BIAS_BATCH_STRIDE */
    {11, 8, 0},  /* EPILOGUE_AUX_POINTER */
    {12, 8, 0},  /* EPILOGUE_AUX_LD */
    {13, 8, 0},  /* EPILOGUE_AUX_BATCH_STRIDE */
    {14, 8, 0},  /* ALPHA_VECTOR_BATCH_STRIDE */
    {15, 4, 0},  /* SM_COUNT_TARGET */
    {17, 8, 0},  /* A_SCALE_POINTER */
    {18, 8, 0},  /* B_SCALE_POINTER */
    {19, 8, 0},  /* C_SCALE_POINTER */
    {20, 8, 0},  /* D_SCALE_POINTER */
    {21, 8, 0},  /* AMAX_D_POINTER */
    {22, 4, -1}, /* EPILOGUE_AUX_DATA_TYPE */
    {23, 8, 0},  /* EPILOGUE_AUX_SCALE_POINTER */
    {24, 8, 0},  /* EPILOGUE_AUX_AMAX_POINTER */
    {25, 1, 0},  /* FAST_ACCUM */
    {26, 4, -1}, /* BIAS_DATA_TYPE */
    {31, 4, 0},  /* A_SCALE_MODE */
    {32, 4, 0},  /* B_SCALE_MODE */
    {33, 4, 0},  /* C_SCALE_MODE */
    {34, 4, 0},  /* D_SCALE_MODE */
    {35, 4, 0},  /* EPILOGUE_AUX_SCALE_MODE */
    {36, 8, 0},  /* D_OUT_SCALE_POINTER */
    {37, 4, 0},  /* D_OUT_SCALE_MODE */
};

static const struct attr g_layout_attrs[] = {
    {0, 4, -1}, /* TYPE (from create) */
    {1, 4, 0},  /* ORDER: CUBLASLT_ORDER_COL */
    {2, 8, -1}, /* ROWS (from create) */
    {3, 8, -1}, /* COLS (from create) */
    {4, 8, -1}, /* LD (from create) */
    {5, 4, 1},  /* BATCH_COUNT */
    {6, 8, 0},  /* STRIDED_BATCH_OFFSET */
    {7, 8, 0},  /* PLANE_OFFSET */
    {8, 4, 0},  /* BATCH_MODE: strided */
};

static const struct attr g_pref_attrs[] = {
    {0, 4, 0},    /* SEARCH_MODE: CUBLASLT_SEARCH_BEST_FIT */
    {1, 8, 0},    /* MAX_WORKSPACE_BYTES */
    {3, 4, 7},    /* REDUCTION_SCHEME_MASK: all */
    {5, 4, 256},  /* MIN_ALIGNMENT_A_BYTES */
    {6, 4, 256},  /* MIN_ALIGNMENT_B_BYTES */
    {7, 4, 256},  /* MIN_ALIGNMENT_C_BYTES */
    {8, 4, 256},  /* MIN_ALIGNMENT_D_BYTES */
    {9, 4, 0},    /* MAX_WAVES_COUNT (float) */
    {12, 8, -1},  /* IMPL_MASK: all */
};

static const struct {
    const struct attr *attrs;
    size_t count, storage;
    const char *what;
} g_kinds[KINDS] = {
    {g_desc_attrs, sizeof g_desc_attrs / sizeof g_desc_attrs[0],
     sizeof(cublasLtMatmulDescOpaque_t), "matmul descriptor"},
    {g_layout_attrs, sizeof g_layout_attrs / sizeof g_layout_attrs[0],
     sizeof(cublasLtMatrixLayoutOpaque_t), "matrix layout"},
    {g_pref_attrs, sizeof g_pref_attrs / sizeof g_pref_attrs[0],
     sizeof(cublasLtMatmulPreferenceOpaque_t), "matmul preference"},
};

/* A descriptor's storage: a tag, then the attributes' values packed in table order. */
#define DESC_MAGIC 0x704c7400u /* low byte: the kind */

static size_t values_size(enum kind kind)
{
    size_t total = 0;
    for (size_t i = 0; i < g_kinds[kind].count; i++)
        total += g_kinds[kind].attrs[i].size;
    return total;
}

static uint8_t *values(void *desc)
{
    return (uint8_t *)desc + sizeof(uint32_t);
}

static int is_kind(const void *desc, enum kind kind)
{
    uint32_t tag;
    if (!desc)
        return 0;
    memcpy(&tag, desc, sizeof tag);
    return tag == (DESC_MAGIC | (uint32_t)kind);
}

/* The attribute `id` of `kind`: its table entry and the offset of its value; NULL if unknown. */
static const struct attr *find_attr(enum kind kind, unsigned id, size_t *offset)
{
    size_t at = 0;
    for (size_t i = 0; i < g_kinds[kind].count; i++) {
        const struct attr *a = &g_kinds[kind].attrs[i];
        if (a->id == id) {
            *offset = at;
            return a;
        }
        at += a->size;
    }
    return NULL;
}

static void store(void *desc, enum kind kind, unsigned id, int64_t value)
{
    size_t off;
    const struct attr *a = find_attr(kind, id, &off);
    memcpy(values(desc) + off, &value, a->size); /* little-endian: the low bytes */
}

static cublasStatus_t init(void *desc, size_t size, enum kind kind)
{
    if (!desc || size < g_kinds[kind].storage)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (sizeof(uint32_t) + values_size(kind) > g_kinds[kind].storage)
        return CUBLAS_STATUS_INTERNAL_ERROR;
    memset(desc, 0, g_kinds[kind].storage);
    uint32_t tag = DESC_MAGIC | (uint32_t)kind;
    memcpy(desc, &tag, sizeof tag);
    for (size_t i = 0; i < g_kinds[kind].count; i++)
        store(desc, kind, g_kinds[kind].attrs[i].id, g_kinds[kind].attrs[i].dflt);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t create(void **out, enum kind kind)
{
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    void *desc = malloc(g_kinds[kind].storage);
    if (!desc)
        return CUBLAS_STATUS_ALLOC_FAILED;
    cublasStatus_t st = init(desc, g_kinds[kind].storage, kind);
    if (st) {
        free(desc);
        return st;
    }
    *out = desc;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t destroy(void *desc, enum kind kind)
{
    if (!desc)
        return CUBLAS_STATUS_SUCCESS;
    if (!is_kind(desc, kind))
        return CUBLAS_STATUS_INVALID_VALUE;
    memset(desc, 0, sizeof(uint32_t));
    free(desc);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t set_attr(void *desc, enum kind kind, unsigned id, const void *buf,
                               size_t size)
{
    if (!is_kind(desc, kind))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    size_t off;
    const struct attr *a = find_attr(kind, id, &off);
    if (!a) {
        pilot_blas_log(1, "cuBLASLt %s attribute %u is not supported by pilot yet; returning "
                          "CUBLAS_STATUS_NOT_SUPPORTED", g_kinds[kind].what, id);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!buf || size != a->size)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(values(desc) + off, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t get_attr(const void *desc, enum kind kind, unsigned id, void *buf,
                               size_t size, size_t *written)
{
    if (!is_kind(desc, kind))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    size_t off;
    const struct attr *a = find_attr(kind, id, &off);
    if (!a)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size == 0 && written) { /* the size query */
        *written = a->size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size < a->size)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, values((void *)desc) + off, a->size);
    if (written)
        *written = a->size;
    return CUBLAS_STATUS_SUCCESS;
}

/* The create functions' arguments: always sent (they have no default). */
static int create_arg(enum kind kind, unsigned id)
{
    return (kind == KIND_DESC && id <= 1) || (kind == KIND_LAYOUT && id != 1 && id <= 4);
}

/* Appends the records of one descriptor (the values that differ from the library's defaults,
 * and the create arguments) to buf; returns the new length. */
static size_t records(uint8_t *buf, size_t len, const void *desc, enum kind kind, uint16_t object)
{
    size_t off = 0;
    for (size_t i = 0; i < g_kinds[kind].count; i++) {
        const struct attr *a = &g_kinds[kind].attrs[i];
        const uint8_t *v = values((void *)desc) + off;
        off += a->size;
        if (!create_arg(kind, a->id) && !memcmp(v, &a->dflt, a->size))
            continue;
        pilot_lt_attr rec = {.object = object, .attr = a->id, .size = a->size};
        memcpy(buf + len, &rec, sizeof rec);
        memset(buf + len + sizeof rec, 0, 8);
        memcpy(buf + len + sizeof rec, v, a->size);
        len += sizeof rec + 8;
    }
    return len;
}

/* Room for every record of a matmul's five descriptors. */
#define RECORDS_MAX ((sizeof g_desc_attrs / sizeof g_desc_attrs[0] +                   \
                      4 * (sizeof g_layout_attrs / sizeof g_layout_attrs[0]) +          \
                      sizeof g_pref_attrs / sizeof g_pref_attrs[0]) * (sizeof(pilot_lt_attr) + 8))

/* ---- handles ---- */

PILOT_BLAS_EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st;
    struct cublasLtContext *h = pilot_blas_open(PILOT_LIB_CUBLASLT, sizeof *h, NULL, &st);
    if (h)
        *handle = h;
    return st;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    struct pilot_blas_handle *h = live(handle);
    if (!h || h->magic != LT_HANDLE_MAGIC) /* a cuBLAS handle is cublasDestroy's */
        return CUBLAS_STATUS_NOT_INITIALIZED;
    pilot_req_handle req = {.handle = h->remote};
    cudaError_t err = pilot_blas_ops()->call_on(h->device, PILOT_OP_LIB_DESTROY, &req, sizeof req,
                                                NULL, 0, NULL, 0, NULL, 0, NULL);
    h->magic = 0;
    free(h);
    return err ? pilot_blas_transport_error("cublasLtDestroy", err) : CUBLAS_STATUS_SUCCESS;
}

PILOT_BLAS_EXPORT size_t cublasLtGetVersion(void)
{
    return (size_t)pilot_blas_version(PILOT_LIB_CUBLASLT);
}

PILOT_BLAS_EXPORT size_t cublasLtGetCudartVersion(void)
{
    return CUDART_VERSION;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtGetProperty(libraryPropertyType type, int *value)
{
    return pilot_blas_property(PILOT_LIB_CUBLASLT, type, value);
}

PILOT_BLAS_EXPORT const char *cublasLtGetStatusName(cublasStatus_t status)
{
    return pilot_blas_status_name(status);
}

PILOT_BLAS_EXPORT const char *cublasLtGetStatusString(cublasStatus_t status)
{
    return pilot_blas_status_string(status);
}

/* ---- the descriptors' functions ---- */

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t desc,
                                                                 size_t size, int compute,
                                                                 cudaDataType scale)
{
    cublasStatus_t st = init(desc, size, KIND_DESC);
    if (st == CUBLAS_STATUS_SUCCESS) {
        store(desc, KIND_DESC, 0, compute);
        store(desc, KIND_DESC, 1, scale);
    }
    return st;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, int compute,
                                                          cudaDataType scale)
{
    cublasStatus_t st = create((void **)desc, KIND_DESC);
    if (st == CUBLAS_STATUS_SUCCESS) {
        store(*desc, KIND_DESC, 0, compute);
        store(*desc, KIND_DESC, 1, scale);
    }
    return st;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    return destroy(desc, KIND_DESC);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, int attr,
                                                                const void *buf, size_t size)
{
    return set_attr(desc, KIND_DESC, (unsigned)attr, buf, size);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, int attr,
                                                                void *buf, size_t size,
                                                                size_t *written)
{
    return get_attr(desc, KIND_DESC, (unsigned)attr, buf, size, written);
}

static void layout_args(void *desc, int type, uint64_t rows, uint64_t cols, int64_t ld)
{
    store(desc, KIND_LAYOUT, 0, type);
    store(desc, KIND_LAYOUT, 2, (int64_t)rows);
    store(desc, KIND_LAYOUT, 3, (int64_t)cols);
    store(desc, KIND_LAYOUT, 4, ld);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t desc,
                                                                   size_t size, cudaDataType type,
                                                                   uint64_t rows, uint64_t cols,
                                                                   int64_t ld)
{
    cublasStatus_t st = init(desc, size, KIND_LAYOUT);
    if (st == CUBLAS_STATUS_SUCCESS)
        layout_args(desc, type, rows, cols, ld);
    return st;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *desc,
                                                            cudaDataType type, uint64_t rows,
                                                            uint64_t cols, int64_t ld)
{
    cublasStatus_t st = create((void **)desc, KIND_LAYOUT);
    if (st == CUBLAS_STATUS_SUCCESS)
        layout_args(*desc, type, rows, cols, ld);
    return st;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t desc)
{
    return destroy(desc, KIND_LAYOUT);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t desc,
                                                                  int attr, const void *buf,
                                                                  size_t size)
{
    return set_attr(desc, KIND_LAYOUT, (unsigned)attr, buf, size);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t desc,
                                                                  int attr, void *buf, size_t size,
                                                                  size_t *written)
{
    return get_attr(desc, KIND_LAYOUT, (unsigned)attr, buf, size, written);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulPreferenceInit_internal(
    cublasLtMatmulPreference_t pref, size_t size)
{
    return init(pref, size, KIND_PREF);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    return create((void **)pref, KIND_PREF);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    return destroy(pref, KIND_PREF);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, int attr, const void *buf, size_t size)
{
    return set_attr(pref, KIND_PREF, (unsigned)attr, buf, size);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulPreferenceGetAttribute(
    cublasLtMatmulPreference_t pref, int attr, void *buf, size_t size, size_t *written)
{
    return get_attr(pref, KIND_PREF, (unsigned)attr, buf, size, written);
}

/* ---- the heuristic query and the matmul ---- */

/* The records of a matmul's descriptors (and the preference, when given) into buf. */
static cublasStatus_t describe(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                               cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                               cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref,
                               uint8_t *buf, size_t *len)
{
    if (!is_kind(op, KIND_DESC) || !is_kind(a, KIND_LAYOUT) || !is_kind(b, KIND_LAYOUT) ||
        !is_kind(c, KIND_LAYOUT) || !is_kind(d, KIND_LAYOUT) || (pref && !is_kind(pref, KIND_PREF)))
        return CUBLAS_STATUS_INVALID_VALUE;
    size_t n = records(buf, 0, op, KIND_DESC, PILOT_LT_DESC);
    n = records(buf, n, a, KIND_LAYOUT, PILOT_LT_LAYOUT_A);
    n = records(buf, n, b, KIND_LAYOUT, PILOT_LT_LAYOUT_B);
    n = records(buf, n, c, KIND_LAYOUT, PILOT_LT_LAYOUT_C);
    n = records(buf, n, d, KIND_LAYOUT, PILOT_LT_LAYOUT_D);
    if (pref)
        n = records(buf, n, pref, KIND_PREF, PILOT_LT_PREFERENCE);
    *len = n;
    return CUBLAS_STATUS_SUCCESS;
}

/* A descriptor's int32 attribute (one of the table's). */
static int32_t int_attr(const void *desc, enum kind kind, unsigned id)
{
    size_t off = 0;
    int32_t v = 0;
    if (find_attr(kind, id, &off))
        memcpy(&v, values((void *)desc) + off, sizeof v);
    return v;
}

/* Bytes of alpha and beta: the scale type's (host pointer mode). */
static size_t scale_size(cublasLtMatmulDesc_t op)
{
    size_t size = pilot_blas_type_size(int_attr(op, KIND_DESC, 1));
    return size && size <= 16 ? size : 4;
}

/* Answers of the heuristic query, kept in the process: PyTorch asks before every Linear layer's
 * matmul, and the answer depends only on the descriptors (pointers among their attributes only
 * through their alignment, as the header documents for the bias pointer) and the device, so the
 * same question gets the library's earlier answer without a round trip to pilotd. */
#define HEURISTIC_CACHE 64
#define POINTER_ATTRS_MASK ((uint64_t)PILOT_LT_POINTER_ATTRS)

struct heuristic_answer {
    uint8_t *key;
    size_t key_len;
    int count;
    cublasLtMatmulHeuristicResult_t *results;
};

static struct heuristic_answer g_answers[HEURISTIC_CACHE];
static unsigned g_next_answer;
static pthread_mutex_t g_answers_lock = PTHREAD_MUTEX_INITIALIZER;

/* The question as a key: device, count wanted, and the records with each pointer replaced by its
 * alignment (its lowest set bit, at most 256). */
static size_t heuristic_key(uint8_t *key, int device, int requested, const uint8_t *records,
                            size_t len)
{
    memcpy(key, &device, sizeof device);
    memcpy(key + sizeof device, &requested, sizeof requested);
    size_t n = sizeof device + sizeof requested;
    memcpy(key + n, records, len);
    for (size_t at = 0; at + sizeof(pilot_lt_attr) <= len; at += sizeof(pilot_lt_attr) + 8) {
        pilot_lt_attr rec;
        memcpy(&rec, records + at, sizeof rec);
        if (rec.object == PILOT_LT_DESC && rec.attr < 64 && (POINTER_ATTRS_MASK >> rec.attr & 1)) {
            uint64_t ptr;
            memcpy(&ptr, records + at + sizeof rec, sizeof ptr);
            uint64_t align = ptr ? ptr & (~ptr + 1) : 0;
            align = align > 256 ? 256 : align;
            memcpy(key + n + at + sizeof rec, &align, sizeof align);
        }
    }
    return n + len;
}

static int cached_answer(const uint8_t *key, size_t len, cublasLtMatmulHeuristicResult_t *out,
                         int *count)
{
    int found = 0;
    pthread_mutex_lock(&g_answers_lock);
    for (int i = 0; i < HEURISTIC_CACHE && !found; i++) {
        struct heuristic_answer *a = &g_answers[i];
        if (a->key && a->key_len == len && !memcmp(a->key, key, len)) {
            memcpy(out, a->results, (size_t)a->count * sizeof *out);
            *count = a->count;
            found = 1;
        }
    }
    pthread_mutex_unlock(&g_answers_lock);
    return found;
}

static void keep_answer(const uint8_t *key, size_t len, const cublasLtMatmulHeuristicResult_t *res,
                        int count)
{
    uint8_t *k = malloc(len);
    cublasLtMatmulHeuristicResult_t *r = malloc((size_t)(count ? count : 1) * sizeof *r);
    if (!k || !r) {
        free(k);
        free(r);
        return;
    }
    memcpy(k, key, len);
    memcpy(r, res, (size_t)count * sizeof *r);
    pthread_mutex_lock(&g_answers_lock);
    struct heuristic_answer *a = &g_answers[g_next_answer++ % HEURISTIC_CACHE];
    free(a->key);
    free(a->results);
    *a = (struct heuristic_answer){k, len, count, r};
    pthread_mutex_unlock(&g_answers_lock);
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int *returned)
{
    struct pilot_blas_handle *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requested <= 0 || !results || !returned || !pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    _Static_assert(sizeof(cublasLtMatmulHeuristicResult_t) == PILOT_LT_RESULT_BYTES,
                   "heuristic result layout");
    uint8_t buf[RECORDS_MAX], key[RECORDS_MAX + 8];
    size_t len;
    cublasStatus_t st = describe(op, a, b, c, d, pref, buf, &len);
    if (st)
        return st;
    if (requested > 256)
        requested = 256;
    size_t key_len = heuristic_key(key, h->device, requested, buf, len);
    if (cached_answer(key, key_len, results, returned))
        return CUBLAS_STATUS_SUCCESS;
    pilot_req_blaslt_matmul req = {.handle = h->remote, .requested = requested};
    pilot_rep_lib rep = {0};
    size_t got = 0;
    cudaError_t err = pilot_blas_ops()->call_on(
        h->device, PILOT_OP_BLASLT_HEURISTIC, &req, sizeof req, buf, len, &rep, sizeof rep,
        results, (size_t)requested * sizeof results[0], &got);
    if (err)
        return pilot_blas_transport_error("cublasLtMatmulAlgoGetHeuristic", err);
    if (rep.status == CUBLAS_STATUS_SUCCESS) {
        if (rep.value > (uint64_t)requested || got != rep.value * sizeof results[0])
            return CUBLAS_STATUS_INTERNAL_ERROR;
        *returned = (int)rep.value;
        keep_answer(key, key_len, results, *returned);
    }
    return (cublasStatus_t)rep.status;
}

PILOT_BLAS_EXPORT cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
    cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
    const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
    const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_size, cudaStream_t stream)
{
    struct pilot_blas_handle *h = live(handle);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || (workspace_size && !workspace))
        return CUBLAS_STATUS_INVALID_VALUE;
    uint8_t buf[RECORDS_MAX];
    size_t len;
    cublasStatus_t st = describe(op, a, b, c, d, NULL, buf, &len);
    if (st)
        return st;
    const struct pilot_driver_ops *ops = pilot_blas_ops();
    uint64_t wire_stream = ops->stream_handle(stream);
    if (wire_stream && ops->handle_device(wire_stream) != h->device)
        return CUBLAS_STATUS_INVALID_VALUE;
    pilot_req_blaslt_matmul req = {
        .handle = h->remote, .stream = wire_stream,
        .a = (uintptr_t)A, .b = (uintptr_t)B, .c = (uintptr_t)C, .d = (uintptr_t)D,
        .workspace = (uintptr_t)workspace, .workspace_size = workspace_size,
        .has_algo = algo != NULL,
    };
    if (algo)
        memcpy(req.algo, algo->data, sizeof req.algo);
    int32_t mode = int_attr(op, KIND_DESC, 2); /* CUBLASLT_MATMUL_DESC_POINTER_MODE */
    if (mode == 0) { /* CUBLASLT_POINTER_MODE_HOST */
        size_t size = scale_size(op);
        memcpy(req.alpha, alpha, size);
        memcpy(req.beta, beta, size);
    } else if (mode == 1) { /* CUBLASLT_POINTER_MODE_DEVICE */
        req.alpha_ptr = (uintptr_t)alpha;
        req.beta_ptr = (uintptr_t)beta;
    } else {
        pilot_blas_log(1, "cublasLtMatmul: pointer mode %d is not supported by pilot yet; "
                          "returning CUBLAS_STATUS_NOT_SUPPORTED", mode);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    cudaError_t err = ops->library_call(h->device, wire_stream, "cublasLtMatmul",
                                        PILOT_OP_BLASLT_MATMUL, &req, sizeof req, buf, len, NULL, 0,
                                        NULL, 0, NULL);
    return err ? pilot_blas_transport_error("cublasLtMatmul", err) : CUBLAS_STATUS_SUCCESS;
}
