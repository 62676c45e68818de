/* The fast path's library calls (see fast_launch.h): cuBLAS GEMMs, cuBLASLt matmuls and
 * cudaMemset of the session's device memory, checked and put on their stream on the vGPU thread
 * without the GIL, as launches are. The checks are those of daemon/ops/libraries.py and
 * daemon/ops/memory.py (every range the call touches inside one of the session's device
 * allocations); whatever this file is not sure of goes to Python, which checks again and
 * reports the error the program must see. */
#include <stdlib.h>
#include <string.h>

#include "fast_internal.h"
#include "pilot_proto.h"

/* A library handle of the session, and the settings C last applied to it (Python may use the
 * same handle: it registers it again after each use, which clears `applied`). */
struct fhandle {
    uint64_t handle;
    int kind; /* enum pilot_fast_handle_kind */
    int applied;
    uint64_t stream;
    int ws_default; /* the workspace is the stream's default (no cublasSetWorkspace) */
    uint64_t workspace, workspace_size;
    int32_t math, atomics, sm_count, pointer_mode;
};

/* A cuBLASLt descriptor set Python made for one handle and one set of attribute records. */
struct lt_plan {
    uint64_t token;
    uint32_t len;
    uint64_t descs[5];   /* matmul, A, B, C, D */
    uint64_t spans[4];   /* A, B, C, D */
    uint32_t nfixed;
    uint64_t *fixed;     /* (attribute, span): the pointer attributes the records hold */
    uint8_t records[];   /* `len` bytes, pointer values blanked (lt_blank) */
};

typedef int (*dnn_set_stream_fn)(uint64_t handle, uint64_t stream);
typedef int (*dnn_create_fn)(int type, uint64_t *desc); /* enums are ints in cuDNN's ABI */
typedef int (*dnn_set_fn)(uint64_t desc, int attr, int type, int64_t count, const void *values);
typedef int (*dnn_desc_fn)(uint64_t desc);
typedef int (*dnn_execute_fn)(uint64_t handle, uint64_t plan, uint64_t pack);
typedef int (*memset_fn)(uint64_t ptr, unsigned char value, size_t count, uint64_t stream);
typedef int (*set_u64_fn)(uint64_t handle, uint64_t value);
typedef int (*set_i32_fn)(uint64_t handle, int32_t value);
typedef int (*set_ws_fn)(uint64_t handle, uint64_t workspace, size_t size);
typedef int (*gemm_plain_fn)(uint64_t h, int ta, int tb, int m, int n, int k, const void *alpha,
                             uint64_t a, int lda, uint64_t b, int ldb, const void *beta, uint64_t c,
                             int ldc);
typedef int (*gemm_strided_fn)(uint64_t h, int ta, int tb, int m, int n, int k, const void *alpha,
                               uint64_t a, int lda, long long sa, uint64_t b, int ldb, long long sb,
                               const void *beta, uint64_t c, int ldc, long long sc, int batch);
typedef int (*gemm_ex_fn)(uint64_t h, int ta, int tb, int m, int n, int k, const void *alpha,
                          uint64_t a, int atype, int lda, uint64_t b, int btype, int ldb,
                          const void *beta, uint64_t c, int ctype, int ldc, int compute, int algo);
typedef int (*gemm_ex_strided_fn)(uint64_t h, int ta, int tb, int m, int n, int k,
                                  const void *alpha, uint64_t a, int atype, int lda, long long sa,
                                  uint64_t b, int btype, int ldb, long long sb, const void *beta,
                                  uint64_t c, int ctype, int ldc, long long sc, int batch,
                                  int compute, int algo);
typedef int (*lt_desc_set_fn)(uint64_t desc, int attr, const void *value, size_t size);
typedef int (*lt_matmul_fn)(uint64_t h, uint64_t desc, const void *alpha, uint64_t a, uint64_t adesc,
                            uint64_t b, uint64_t bdesc, const void *beta, uint64_t c, uint64_t cdesc,
                            uint64_t d, uint64_t ddesc, const void *algo, uint64_t workspace,
                            size_t workspace_size, uint64_t stream);

int pilot_fast_libraries(pilot_fast *f, void *const *fns, int nfns, const uint8_t *type_sizes,
                         int ntypes, pilot_fast_call_fn generic)
{
    if ((!fns) == (!generic) || nfns < 0 || nfns > PILOT_FAST_LIBFNS || ntypes < 0)
        return -1;
    memset(f->libfns, 0, sizeof f->libfns);
    for (int i = 0; fns && i < nfns; i++)
        f->libfns[i] = fns[i];
    f->generic_call = generic;
    memset(f->type_sizes, 0, sizeof f->type_sizes);
    for (int i = 0; i < ntypes && i < (int)sizeof f->type_sizes; i++)
        f->type_sizes[i] = type_sizes[i];
    return 0;
}

static uint64_t hash_bytes(uint64_t seed, const uint8_t *p, uint32_t n)
{
    uint64_t h = 1469598103934665603ULL ^ seed;
    for (uint32_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h ? h : 1; /* 0 marks a free slot */
}

static void free_plans_of(struct fconn *c, uint64_t token) /* token 0: every plan */
{
    for (uint32_t i = 0; i < c->lt_plans.cap; i++) {
        struct entry *e = &c->lt_plans.slots[i];
        struct lt_plan *p = (struct lt_plan *)(uintptr_t)e->value;
        if (e->key && p && (!token || p->token == token)) {
            free(p->fixed);
            free(p);
            e->value = 0; /* a tombstone */
        }
    }
}

/* What one session may make C keep: a client sending ever new descriptor records or shapes
 * must not grow pilotd. Past it the table starts afresh (Python teaches what is still used). */
#define TABLE_MAX 256
/* cuBLASLt descriptor sets: as many as Python keeps (backends/cublas.py LT_CACHE_MAX) and more,
 * since their records hold pointers and a training step uses hundreds. */
#define LT_TABLE_MAX 2048

static uint32_t live_entries(const struct map *m)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->cap; i++)
        n += m->slots[i].key && m->slots[i].value;
    return n;
}

/* A cuDNN execution plan of the session and the tensors its executions name. */
struct dnn_plan {
    uint64_t plan;
    uint64_t workspace_size;
    int python_only;
    uint32_t n;
    int64_t *uids;
    uint64_t *spans;
};

static void free_dnn_plan(struct dnn_plan *p)
{
    if (p) {
        free(p->uids);
        free(p->spans);
        free(p);
    }
}

/* A batch normalization shape and the tensor descriptors C made for it (native mode). */
struct bn_shape {
    int32_t fn, mode, bn_ops, reserved;
    pilot_dnn_tensor x, y, dx, bn;
};

struct dnn_bn {
    struct bn_shape shape;
    uint64_t spans[4];  /* x, y, dx, bn */
    uint64_t descs[4];  /* cudnnTensorDescriptor_t, 0 for a tensor the call has none of */
};

typedef int (*dnn_tensor_create_fn)(uint64_t *desc);
typedef int (*dnn_tensor_set_fn)(uint64_t desc, int dtype, int nbdims, const int32_t *dims,
                                 const int32_t *strides);

static void free_dnn_bn(const pilot_fast *f, struct dnn_bn *b)
{
    if (!b)
        return;
    for (int i = 0; i < 4; i++)
        if (b->descs[i] && f && f->libfns[PILOT_FAST_DNN_TENSOR_DESTROY])
            ((dnn_desc_fn)f->libfns[PILOT_FAST_DNN_TENSOR_DESTROY])(b->descs[i]);
    free(b);
}

void fast_library_free_conn(struct fconn *c)
{
    free_plans_of(c, 0);
    for (uint32_t i = 0; i < c->dnn_plans.cap; i++)
        free_dnn_plan((struct dnn_plan *)(uintptr_t)c->dnn_plans.slots[i].value);
    free(c->dnn_plans.slots);
    memset(&c->dnn_plans, 0, sizeof c->dnn_plans);
    for (uint32_t i = 0; i < c->dnn_bns.cap; i++)
        free_dnn_bn(c->owner, (struct dnn_bn *)(uintptr_t)c->dnn_bns.slots[i].value);
    free(c->dnn_bns.slots);
    memset(&c->dnn_bns, 0, sizeof c->dnn_bns);
    for (uint32_t i = 0; i < c->handles.cap; i++)
        free((void *)(uintptr_t)c->handles.slots[i].value);
    free(c->handles.slots);
    free(c->lt_plans.slots);
    memset(&c->handles, 0, sizeof c->handles);
    memset(&c->lt_plans, 0, sizeof c->lt_plans);
}

int pilot_fast_library_handle(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t handle,
                              int kind)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c)
        return -1;
    struct entry *e = map_find(&c->handles, token);
    struct fhandle *h = e ? (struct fhandle *)(uintptr_t)e->value : NULL;
    if (!handle) {
        if (h) {
            free_plans_of(c, token);
            free(h);
            map_put(&c->handles, token, 0, 0);
        }
        return 0;
    }
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h || map_put(&c->handles, token, (uint64_t)(uintptr_t)h, 0) != 0) {
            free(h);
            return -1;
        }
    } else if (h->handle != handle) {
        free_plans_of(c, token);
    }
    h->handle = handle;
    h->kind = kind;
    h->applied = 0;
    return 0;
}

static uint64_t plan_key(uint64_t token, const uint8_t *records, uint32_t len)
{
    return hash_bytes(token * 0x9e3779b97f4a7c15ULL, records, len);
}

/* Records of at most this many bytes are looked up here (a matmul's five descriptors hold far
 * fewer); longer ones go to Python. */
#define LT_RECORDS_MAX 4096

static int is_pointer_attr(const pilot_lt_attr *rec)
{
    return rec->object == PILOT_LT_DESC && rec->attr < 64 &&
           ((uint64_t)PILOT_LT_POINTER_ATTRS >> rec->attr & 1);
}

/* Copies `len` bytes of records into `out` with the values of pointer attributes blanked (how
 * Python keys the set: ops/libraries.py lt_set_key) and each of those values into `ptrs` by
 * attribute number (0 where absent); -1 for records that do not parse (Python reports them). */
static int lt_blank(const uint8_t *records, uint32_t len, uint8_t *out, uint64_t ptrs[64])
{
    memcpy(out, records, len);
    memset(ptrs, 0, 64 * sizeof *ptrs);
    for (uint32_t at = 0; at < len;) {
        pilot_lt_attr rec;
        if (len - at < sizeof rec)
            return -1;
        memcpy(&rec, records + at, sizeof rec);
        uint64_t padded = ((uint64_t)rec.size + 7) & ~(uint64_t)7;
        if (!rec.size || padded > len - at - sizeof rec)
            return -1;
        if (is_pointer_attr(&rec)) {
            if (rec.size != sizeof(uint64_t))
                return -1;
            memcpy(&ptrs[rec.attr], records + at + sizeof rec, sizeof(uint64_t));
            memset(out + at + sizeof rec, 0, (size_t)padded);
        }
        at += (uint32_t)(sizeof rec + padded);
    }
    return 0;
}

static struct lt_plan *find_plan(const struct fconn *c, uint64_t token, const uint8_t *records,
                                 uint32_t len)
{
    const struct entry *e = map_find(&c->lt_plans, plan_key(token, records, len));
    const struct lt_plan *p = e ? (const struct lt_plan *)(uintptr_t)e->value : NULL;
    if (!p || p->token != token || p->len != len || memcmp(p->records, records, len) != 0)
        return NULL; /* a hash collision is simply not known here */
    return (struct lt_plan *)p;
}

int pilot_fast_lt_plan(pilot_fast *f, uint32_t conn, uint64_t token, const uint8_t *records,
                       uint32_t len, const uint64_t *descs, const uint64_t *spans,
                       const uint64_t *fixed, uint32_t nfixed)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c || (len && !records))
        return -1;
    uint64_t key = plan_key(token, records, len);
    struct entry *e = map_find(&c->lt_plans, key);
    if (e) { /* replaced (or forgotten) */
        struct lt_plan *old = (struct lt_plan *)(uintptr_t)e->value;
        free(old->fixed);
        free(old);
        map_put(&c->lt_plans, key, 0, 0);
    }
    if (!descs)
        return 0;
    if (live_entries(&c->lt_plans) >= LT_TABLE_MAX) {
        free_plans_of(c, 0);
        free(c->lt_plans.slots);
        memset(&c->lt_plans, 0, sizeof c->lt_plans);
    }
    struct lt_plan *p = calloc(1, sizeof *p + len);
    if (!p)
        return -1;
    p->token = token;
    p->len = len;
    memcpy(p->records, records, len);
    memcpy(p->descs, descs, sizeof p->descs);
    memcpy(p->spans, spans, sizeof p->spans);
    if (nfixed) {
        p->fixed = malloc(2 * nfixed * sizeof *p->fixed);
        if (!p->fixed) {
            free(p);
            return -1;
        }
        memcpy(p->fixed, fixed, 2 * nfixed * sizeof *p->fixed);
        p->nfixed = nfixed;
    }
    if (map_put(&c->lt_plans, key, (uint64_t)(uintptr_t)p, 0) != 0) {
        free(p->fixed);
        free(p);
        return -1;
    }
    return 0;
}

/* The session's handle `token` as Python registered it, or NULL. */
static struct fhandle *handle_of(const struct fconn *c, uint64_t token)
{
    const struct entry *e = map_find(&c->handles, token);
    return e ? (struct fhandle *)(uintptr_t)e->value : NULL;
}

/* ---- the checks ---- */

/* libraries.py's matrix_span: bytes from a column-major matrix's first element to just past its
 * last (batch matrices `stride` elements apart); 0 for an empty one; -1 on overflow. */
static int64_t matrix_span(int64_t rows, int64_t cols, int64_t ld, int64_t elem, int64_t batch,
                           int64_t stride)
{
    if (rows <= 0 || cols <= 0 || batch <= 0)
        return 0;
    __int128 n = ((__int128)(cols - 1) * ld + rows + (__int128)(batch - 1) * stride) * elem;
    return n < 0 || n > INT64_MAX ? -1 : (int64_t)n;
}

static int type_size(const pilot_fast *f, int32_t dtype)
{
    return dtype >= 0 && dtype < (int32_t)sizeof f->type_sizes ? f->type_sizes[dtype] : 0;
}

/* The range [ptr, ptr+span) is the session's (span 0: nothing to check; span < 0: unsized). */
static int in_session(const struct fconn *c, uint64_t ptr, int64_t span)
{
    return span == 0 || (span > 0 && fast_owns(c, ptr, (uint64_t)span));
}

enum { GEMM_PLAIN, GEMM_STRIDED, GEMM_EX, GEMM_EX_STRIDED };

static int gemm_shape(int32_t fn)
{
    switch (fn) {
    case PILOT_GEMM_EX: return GEMM_EX;
    case PILOT_GEMM_EX_STRIDED: return GEMM_EX_STRIDED;
    case PILOT_GEMM_S_STRIDED: case PILOT_GEMM_D_STRIDED: case PILOT_GEMM_H_STRIDED:
    case PILOT_GEMM_C_STRIDED: case PILOT_GEMM_Z_STRIDED: return GEMM_STRIDED;
    default: return GEMM_PLAIN;
    }
}

/* ops/libraries.py's gemm_call and check_gemm, for the functions C runs: 1 when every argument
 * cuBLAS checks is valid and every range the GEMM touches is the session's; 0 sends it to
 * Python (which reports what is wrong, or runs what C does not: empty GEMMs, device scalars). */
static int gemm_checked(const pilot_fast *f, const struct fconn *c, const pilot_req_blas_gemm *r)
{
    if (r->fn < 1 || r->fn >= PILOT_FAST_GEMM_FNS || r->pointer_mode != 0)
        return 0;
    int strided = gemm_shape(r->fn) == GEMM_STRIDED || gemm_shape(r->fn) == GEMM_EX_STRIDED;
    int64_t batch = strided ? r->batch : 1;
    if (r->transa < 0 || r->transa > 2 || r->transb < 0 || r->transb > 2 || r->m <= 0 ||
        r->n <= 0 || r->k < 0 || batch <= 0 ||
        (strided && (r->stride_a < 0 || r->stride_b < 0 || r->stride_c < 0)))
        return 0;
    int64_t rows_a = r->transa == 0 ? r->m : r->k, cols_a = r->transa == 0 ? r->k : r->m;
    int64_t rows_b = r->transb == 0 ? r->k : r->n, cols_b = r->transb == 0 ? r->n : r->k;
    if (r->lda < (rows_a > 1 ? rows_a : 1) || r->ldb < (rows_b > 1 ? rows_b : 1) ||
        r->ldc < (r->m > 1 ? r->m : 1))
        return 0;
    int ea = type_size(f, r->atype), eb = type_size(f, r->btype), ec = type_size(f, r->ctype);
    if (!ea || !eb || !ec)
        return 0;
    int64_t sa = strided ? r->stride_a : 0, sb = strided ? r->stride_b : 0;
    int64_t sc = strided ? r->stride_c : 0;
    if (r->k > 0 && (!in_session(c, r->a, matrix_span(rows_a, cols_a, r->lda, ea, batch, sa)) ||
                     !in_session(c, r->b, matrix_span(rows_b, cols_b, r->ldb, eb, batch, sb))))
        return 0;
    int64_t span_c = matrix_span(r->m, r->n, r->ldc, ec, batch, sc);
    if (span_c <= 0 || !fast_owns(c, r->c, (uint64_t)span_c))
        return 0;
    if (r->workspace_set && r->workspace_size && !fast_owns(c, r->workspace, r->workspace_size))
        return 0;
    return 1;
}

/* backends/cublas.py's _apply: the settings that changed since C's last call onto the handle. */
static int apply_settings(const pilot_fast *f, struct fhandle *h, const pilot_req_blas_gemm *r,
                          uint64_t stream)
{
    void *const *fn = f->libfns;
    int err;
    if (!h->applied || h->stream != stream) {
        if ((err = ((set_u64_fn)fn[PILOT_FAST_BLAS_SET_STREAM])(h->handle, stream)) != 0)
            return err;
        h->stream = stream;
        h->ws_default = 1; /* cublasSetStream resets the workspace */
    }
    if (r->workspace_set) {
        if (h->ws_default || h->workspace != r->workspace || h->workspace_size != r->workspace_size) {
            err = ((set_ws_fn)fn[PILOT_FAST_BLAS_SET_WORKSPACE])(h->handle, r->workspace,
                                                                  (size_t)r->workspace_size);
            if (err)
                return err;
            h->ws_default = 0;
            h->workspace = r->workspace;
            h->workspace_size = r->workspace_size;
        }
    } else if (!h->ws_default) { /* back to the default workspace */
        if ((err = ((set_u64_fn)fn[PILOT_FAST_BLAS_SET_STREAM])(h->handle, stream)) != 0)
            return err;
        h->ws_default = 1;
    }
    if (!h->applied || h->math != r->math_mode || h->atomics != r->atomics_mode ||
        h->sm_count != r->sm_count_target || h->pointer_mode != r->pointer_mode) {
        if ((err = ((set_i32_fn)fn[PILOT_FAST_BLAS_SET_MATH_MODE])(h->handle, r->math_mode)) ||
            (err = ((set_i32_fn)fn[PILOT_FAST_BLAS_SET_ATOMICS_MODE])(h->handle, r->atomics_mode)) ||
            (err = ((set_i32_fn)fn[PILOT_FAST_BLAS_SET_SM_COUNT_TARGET])(h->handle,
                                                                         r->sm_count_target)) ||
            (err = ((set_i32_fn)fn[PILOT_FAST_BLAS_SET_POINTER_MODE])(h->handle, r->pointer_mode)))
            return err;
        h->math = r->math_mode;
        h->atomics = r->atomics_mode;
        h->sm_count = r->sm_count_target;
        h->pointer_mode = r->pointer_mode;
    }
    h->applied = 1;
    return 0;
}

static int native_gemm(const pilot_fast *f, struct fhandle *h, const pilot_req_blas_gemm *r,
                       uint64_t stream)
{
    void *call = f->libfns[PILOT_FAST_GEMM_BASE + r->fn];
    if (!call || !f->libfns[PILOT_FAST_BLAS_SET_STREAM] || !f->libfns[PILOT_FAST_BLAS_SET_WORKSPACE] ||
        !f->libfns[PILOT_FAST_BLAS_SET_MATH_MODE] || !f->libfns[PILOT_FAST_BLAS_SET_ATOMICS_MODE] ||
        !f->libfns[PILOT_FAST_BLAS_SET_SM_COUNT_TARGET] || !f->libfns[PILOT_FAST_BLAS_SET_POINTER_MODE])
        return -1;
    int err = apply_settings(f, h, r, stream);
    if (err) {
        h->applied = 0;
        return err;
    }
    uint64_t alpha[2], beta[2]; /* host scalars, aligned */
    memcpy(alpha, r->alpha, sizeof alpha);
    memcpy(beta, r->beta, sizeof beta);
    switch (gemm_shape(r->fn)) {
    case GEMM_EX:
        return ((gemm_ex_fn)call)(h->handle, r->transa, r->transb, r->m, r->n, r->k, alpha, r->a,
                                  r->atype, r->lda, r->b, r->btype, r->ldb, beta, r->c, r->ctype,
                                  r->ldc, r->compute_type, r->algo);
    case GEMM_EX_STRIDED:
        return ((gemm_ex_strided_fn)call)(h->handle, r->transa, r->transb, r->m, r->n, r->k, alpha,
                                          r->a, r->atype, r->lda, r->stride_a, r->b, r->btype,
                                          r->ldb, r->stride_b, beta, r->c, r->ctype, r->ldc,
                                          r->stride_c, r->batch, r->compute_type, r->algo);
    case GEMM_STRIDED:
        return ((gemm_strided_fn)call)(h->handle, r->transa, r->transb, r->m, r->n, r->k, alpha,
                                       r->a, r->lda, r->stride_a, r->b, r->ldb, r->stride_b, beta,
                                       r->c, r->ldc, r->stride_c, r->batch);
    default:
        return ((gemm_plain_fn)call)(h->handle, r->transa, r->transb, r->m, r->n, r->k, alpha,
                                     r->a, r->lda, r->b, r->ldb, beta, r->c, r->ldc);
    }
}

static int try_gemm(pilot_fast *f, struct fconn *c, const pilot_srv_msg *m, int *legacy)
{
    pilot_req_blas_gemm r;
    if (m->len[1] < sizeof r)
        return FAST_PYTHON;
    memcpy(&r, m->frame[1], sizeof r);
    struct fhandle *h = handle_of(c, r.handle);
    if (!h)
        return FAST_LEARN; /* Python registers the handle as it runs this call */
    uint64_t stream;
    if (h->kind != PILOT_FAST_CUBLAS || !gemm_checked(f, c, &r) || !(stream = fast_stream(c, r.stream)))
        return FAST_PYTHON;
    int err = f->generic_call ? f->generic_call(m->conn, PILOT_OP_BLAS_GEMM, stream, &r, sizeof r,
                                                NULL, 0)
                              : native_gemm(f, h, &r, stream);
    if (err) {
        h->applied = 0;
        return FAST_PYTHON; /* Python makes the same call again and reports its error */
    }
    c->count.gemms[r.fn]++;
    *legacy = !r.stream;
    return FAST_DONE;
}

static int try_lt(pilot_fast *f, struct fconn *c, const pilot_srv_msg *m, int *legacy)
{
    pilot_req_blaslt_matmul r;
    if (m->len[1] < sizeof r || m->nframes != 3)
        return FAST_PYTHON;
    memcpy(&r, m->frame[1], sizeof r);
    const struct fhandle *h = handle_of(c, r.handle);
    if (!h)
        return FAST_LEARN;
    if (h->kind == PILOT_FAST_CUDNN)
        return FAST_PYTHON;
    /* the set without the buffers its pointer attributes name: a step's matmuls name new bias
     * copies each time (autocast) and are still the same descriptors */
    uint8_t blank[LT_RECORDS_MAX];
    uint64_t named[64];
    if (m->len[2] > sizeof blank || lt_blank(m->frame[2], m->len[2], blank, named) != 0)
        return FAST_PYTHON;
    const struct lt_plan *p = find_plan(c, r.handle, blank, m->len[2]);
    if (!p)
        return FAST_LEARN; /* Python builds the descriptors and registers them */
    if (!p->descs[0] || !p->spans[3])
        return FAST_PYTHON; /* a set only Python runs (device scalars, ...) */
    const uint64_t ptrs[4] = {r.a, r.b, r.c, r.d};
    for (int i = 0; i < 4; i++)
        if ((ptrs[i] || i == 3) && !in_session(c, ptrs[i], (int64_t)p->spans[i]))
            return FAST_PYTHON;
    uint64_t checked = 0;
    for (uint32_t i = 0; i < p->nfixed; i++) {
        uint64_t attr = p->fixed[2 * i];
        if (attr >= 64 || !named[attr] || !in_session(c, named[attr], (int64_t)p->fixed[2 * i + 1]))
            return FAST_PYTHON;
        checked |= 1ull << attr;
    }
    for (unsigned attr = 0; attr < 64; attr++)
        if (named[attr] && !(checked >> attr & 1))
            return FAST_PYTHON; /* a pointer Python did not size for this set */
    if (r.workspace_size && !fast_owns(c, r.workspace, r.workspace_size))
        return FAST_PYTHON;
    uint64_t stream = fast_stream(c, r.stream);
    if (!stream)
        return FAST_PYTHON;
    int err;
    if (f->generic_call) {
        err = f->generic_call(m->conn, PILOT_OP_BLASLT_MATMUL, stream, &r, sizeof r, m->frame[2],
                              m->len[2]);
    } else {
        lt_matmul_fn call = (lt_matmul_fn)f->libfns[PILOT_FAST_LT_MATMUL];
        lt_desc_set_fn set = (lt_desc_set_fn)f->libfns[PILOT_FAST_LT_DESC_SET];
        if (p->nfixed && !set)
            return FAST_PYTHON;
        for (uint32_t i = 0; i < p->nfixed; i++) /* this call's buffers onto the descriptor */
            if (set(p->descs[0], (int)p->fixed[2 * i], &named[p->fixed[2 * i]], sizeof(uint64_t)))
                return FAST_PYTHON;
        uint64_t alpha[2], beta[2], algo[8];
        memcpy(alpha, r.alpha, sizeof alpha);
        memcpy(beta, r.beta, sizeof beta);
        memcpy(algo, r.algo, sizeof algo);
        err = !call ? -1
                    : call(h->handle, p->descs[0], alpha, r.a, p->descs[1], r.b, p->descs[2], beta,
                           r.c, p->descs[3], r.d, p->descs[4], r.has_algo ? algo : NULL,
                           r.workspace_size ? r.workspace : 0, (size_t)r.workspace_size, stream);
    }
    if (err)
        return FAST_PYTHON;
    c->count.lt_matmuls++;
    *legacy = !r.stream;
    return FAST_DONE;
}

static int try_memset(pilot_fast *f, struct fconn *c, const pilot_srv_msg *m, int *legacy)
{
    pilot_req_memset r;
    if (m->len[1] < sizeof r || (m->nframes > 2 && m->len[2]))
        return FAST_PYTHON;
    memcpy(&r, m->frame[1], sizeof r);
    uint64_t stream;
    if (!r.count || !fast_owns(c, r.ptr, r.count) || !(stream = fast_stream(c, r.stream)))
        return FAST_PYTHON;
    int err;
    if (f->generic_call)
        err = f->generic_call(m->conn, PILOT_OP_MEMSET, stream, &r, sizeof r, NULL, 0);
    else if (f->libfns[PILOT_FAST_MEMSET_D8])
        err = ((memset_fn)f->libfns[PILOT_FAST_MEMSET_D8])(r.ptr, (unsigned char)(r.value & 0xff),
                                                            (size_t)r.count, stream);
    else
        err = -1;
    if (err)
        return FAST_PYTHON;
    c->count.memsets++;
    *legacy = !r.stream;
    return FAST_DONE;
}

void pilot_fast_dnn_constants(pilot_fast *f, int64_t variant_pack, int64_t attr_uids,
                              int64_t attr_pointers, int64_t attr_workspace, int64_t type_int64,
                              int64_t type_void_ptr)
{
    const int v[6] = {(int)variant_pack, (int)attr_uids, (int)attr_pointers, (int)attr_workspace,
                      (int)type_int64, (int)type_void_ptr};
    memcpy(f->dnn_constants, v, sizeof v);
}

int pilot_fast_dnn_plan(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t plan,
                        uint64_t workspace_size, const int64_t *uids, const uint64_t *spans,
                        uint32_t n, int python_only)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c || (n && (!uids || !spans)))
        return -1;
    struct entry *e = map_find(&c->dnn_plans, token);
    if (e) {
        free_dnn_plan((struct dnn_plan *)(uintptr_t)e->value);
        map_put(&c->dnn_plans, token, 0, 0);
    }
    if (!plan && !python_only)
        return 0;
    struct dnn_plan *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    p->plan = plan;
    p->workspace_size = workspace_size;
    p->python_only = python_only;
    p->n = n;
    if (n) {
        p->uids = malloc(n * sizeof *p->uids);
        p->spans = malloc(n * sizeof *p->spans);
        if (!p->uids || !p->spans) {
            free_dnn_plan(p);
            return -1;
        }
        memcpy(p->uids, uids, n * sizeof *uids);
        memcpy(p->spans, spans, n * sizeof *spans);
    }
    if (map_put(&c->dnn_plans, token, (uint64_t)(uintptr_t)p, 0) != 0) {
        free_dnn_plan(p);
        return -1;
    }
    return 0;
}


/* cudnnSetStream on the real handle when it is not on `stream` already (as backends/cudnn.py's
 * _on_stream; after Python used the handle, `applied` is clear and it is set again). */
static int dnn_on_stream(const pilot_fast *f, struct fhandle *h, uint64_t stream)
{
    if (h->applied && h->stream == stream)
        return 0;
    int err = ((dnn_set_stream_fn)f->libfns[PILOT_FAST_DNN_SET_STREAM])(h->handle, stream);
    if (!err) {
        h->stream = stream;
        h->applied = 1;
    }
    return err;
}

/* The variant pack C builds for one execution (cuDNN copies what it needs at finalize: the pack
 * is destroyed after the execution is queued, as backends/cudnn.py does with evicted ones). */
static int native_dnn_execute(const pilot_fast *f, struct fhandle *h, const struct dnn_plan *p,
                              const int64_t *uids, const uint64_t *ptrs, uint32_t n,
                              uint64_t workspace, uint64_t stream)
{
    void *const *fn = f->libfns;
    for (int i = PILOT_FAST_DNN_SET_STREAM; i <= PILOT_FAST_DNN_DESTROY; i++)
        if (!fn[i])
            return -1;
    const int *k = f->dnn_constants;
    int err = dnn_on_stream(f, h, stream);
    if (err)
        return err;
    uint64_t pack = 0;
    if ((err = ((dnn_create_fn)fn[PILOT_FAST_DNN_CREATE])(k[0], &pack)) != 0)
        return err;
    dnn_set_fn set = (dnn_set_fn)fn[PILOT_FAST_DNN_SET];
    if (!(err = set(pack, k[1], k[4], n, uids)) && !(err = set(pack, k[2], k[5], n, ptrs)) &&
        !(err = set(pack, k[3], k[5], 1, &workspace)) &&
        !(err = ((dnn_desc_fn)fn[PILOT_FAST_DNN_FINALIZE])(pack)))
        err = ((dnn_execute_fn)fn[PILOT_FAST_DNN_EXECUTE])(h->handle, p->plan, pack);
    ((dnn_desc_fn)fn[PILOT_FAST_DNN_DESTROY])(pack);
    return err;
}

#define DNN_PACK_MAX 64 /* tensors of one execution C takes (more: Python) */

/* ops/dnn.py's check_execution and its range checks: the pack names each of the plan's tensors
 * once and nothing else, every tensor's range and the workspace are the session's. */
static int try_dnn(pilot_fast *f, struct fconn *c, const pilot_srv_msg *m, int *legacy)
{
    pilot_req_dnn_execute r;
    if (m->len[1] < sizeof r || m->nframes != 3)
        return FAST_PYTHON;
    memcpy(&r, m->frame[1], sizeof r);
    struct fhandle *h = handle_of(c, r.handle);
    if (!h)
        return FAST_LEARN;
    const struct entry *pe = map_find(&c->dnn_plans, r.plan);
    if (!pe)
        return FAST_LEARN;
    const struct dnn_plan *p = (const struct dnn_plan *)(uintptr_t)pe->value;
    if (h->kind != PILOT_FAST_CUDNN || p->python_only || r.count != p->n ||
        r.count > DNN_PACK_MAX || m->len[2] != (uint64_t)r.count * sizeof(pilot_dnn_ptr))
        return FAST_PYTHON;
    int64_t uids[DNN_PACK_MAX];
    uint64_t ptrs[DNN_PACK_MAX];
    uint64_t seen = 0; /* which of the plan's tensors the pack named (n <= 64) */
    for (uint32_t i = 0; i < r.count; i++) {
        pilot_dnn_ptr d;
        memcpy(&d, m->frame[2] + i * sizeof d, sizeof d);
        uint32_t j = 0;
        while (j < p->n && p->uids[j] != d.uid)
            j++;
        if (j == p->n || (seen >> j & 1) || !in_session(c, d.ptr, (int64_t)p->spans[j]))
            return FAST_PYTHON; /* not the plan's, named twice, or not the session's memory */
        seen |= 1ull << j;
        uids[i] = d.uid;
        ptrs[i] = d.ptr;
    }
    if (p->workspace_size && !fast_owns(c, r.workspace, p->workspace_size))
        return FAST_PYTHON;
    uint64_t stream = fast_stream(c, r.stream);
    if (!stream)
        return FAST_PYTHON;
    int err = f->generic_call ? f->generic_call(m->conn, PILOT_OP_DNN_EXECUTE, stream, &r,
                                                sizeof r, m->frame[2], m->len[2])
                              : native_dnn_execute(f, h, p, uids, ptrs, r.count, r.workspace,
                                                   stream);
    if (err) {
        h->applied = 0;
        return FAST_PYTHON;
    }
    c->count.dnn_executes++;
    *legacy = !r.stream;
    return FAST_DONE;
}

static struct bn_shape shape_of(const pilot_req_dnn_bn *r)
{
    struct bn_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.fn = r->fn;
    sh.mode = r->mode;
    sh.bn_ops = r->bn_ops;
    sh.x = r->x;
    sh.y = r->y;
    sh.dx = r->dx;
    sh.bn = r->bn;
    return sh;
}

static uint64_t shape_key(const struct bn_shape *sh)
{
    return hash_bytes(0xb7, (const uint8_t *)sh, sizeof *sh);
}

int pilot_fast_dnn_bn(pilot_fast *f, uint32_t conn, const pilot_req_dnn_bn *req,
                      const uint64_t *spans)
{
    struct fconn *c = fast_find_conn(f, conn);
    if (!c || (req->fn != PILOT_BN_FORWARD_TRAINING_EX && req->fn != PILOT_BN_BACKWARD_EX))
        return -1;
    struct dnn_bn *b = calloc(1, sizeof *b);
    if (!b)
        return -1;
    b->shape = shape_of(req);
    memcpy(b->spans, spans, sizeof b->spans);
    if (!f->generic_call) { /* C's own descriptors: the backend's cache may evict its own */
        const pilot_dnn_tensor *t[4] = {&req->x, &req->y, &req->dx, &req->bn};
        void *const *fn = f->libfns;
        if (!fn[PILOT_FAST_DNN_TENSOR_CREATE] || !fn[PILOT_FAST_DNN_TENSOR_SET] ||
            !fn[PILOT_FAST_DNN_TENSOR_DESTROY]) {
            free(b);
            return -1;
        }
        for (int i = 0; i < 4; i++) {
            if (!t[i]->nbdims || t[i]->nbdims > PILOT_DNN_DIM_MAX)
                continue;
            if (((dnn_tensor_create_fn)fn[PILOT_FAST_DNN_TENSOR_CREATE])(&b->descs[i]) != 0 ||
                ((dnn_tensor_set_fn)fn[PILOT_FAST_DNN_TENSOR_SET])(
                    b->descs[i], t[i]->dtype, t[i]->nbdims, t[i]->dims, t[i]->strides) != 0) {
                free_dnn_bn(f, b);
                return -1;
            }
        }
    }
    if (live_entries(&c->dnn_bns) >= TABLE_MAX) {
        for (uint32_t i = 0; i < c->dnn_bns.cap; i++)
            free_dnn_bn(f, (struct dnn_bn *)(uintptr_t)c->dnn_bns.slots[i].value);
        free(c->dnn_bns.slots);
        memset(&c->dnn_bns, 0, sizeof c->dnn_bns);
    }
    uint64_t key = shape_key(&b->shape);
    struct entry *e = map_find(&c->dnn_bns, key);
    if (e) {
        free_dnn_bn(f, (struct dnn_bn *)(uintptr_t)e->value);
        map_put(&c->dnn_bns, key, 0, 0);
    }
    if (map_put(&c->dnn_bns, key, (uint64_t)(uintptr_t)b, 0) != 0) {
        free_dnn_bn(f, b);
        return -1;
    }
    return 0;
}

typedef int (*bn_forward_fn)(uint64_t h, int mode, int ops, const void *alpha, const void *beta,
                             uint64_t xd, uint64_t x, uint64_t zd, uint64_t z, uint64_t yd,
                             uint64_t y, uint64_t bnd, uint64_t scale, uint64_t bias,
                             double factor, uint64_t running_mean, uint64_t running_var,
                             double epsilon, uint64_t saved_mean, uint64_t saved_inv_var,
                             uint64_t activation, uint64_t workspace, size_t workspace_size,
                             uint64_t reserve, size_t reserve_size);
typedef int (*bn_backward_fn)(uint64_t h, int mode, int ops, const void *alpha, const void *beta,
                              const void *alpha_param, const void *beta_param, uint64_t xd,
                              uint64_t x, uint64_t yd, uint64_t y, uint64_t dyd, uint64_t dy,
                              uint64_t dzd, uint64_t dz, uint64_t dxd, uint64_t dx, uint64_t bnd,
                              uint64_t scale, uint64_t bias, uint64_t dscale, uint64_t dbias,
                              double epsilon, uint64_t saved_mean, uint64_t saved_inv_var,
                              uint64_t activation, uint64_t workspace, size_t workspace_size,
                              uint64_t reserve, size_t reserve_size);

/* Host scalars as cuDNN reads them: double for double data, else float. */
union bn_value {
    float f;
    double d;
};

static const void *bn_scalar(int dtype, double value, union bn_value *out)
{
    if (dtype == 1) /* CUDNN_DATA_DOUBLE */
        out->d = value;
    else
        out->f = (float)value;
    return out;
}

/* ops/dnn.py's batchnorm_ranges for the two Ex functions: required ranges, optional ones when
 * not NULL, the workspace and reserve when sized. */
static int bn_ranges_ok(const struct fconn *c, const pilot_req_dnn_bn *r, const struct dnn_bn *b)
{
    int backward = r->fn == PILOT_BN_BACKWARD_EX;
    int64_t x = (int64_t)b->spans[0], y = (int64_t)b->spans[1], dx = (int64_t)b->spans[2];
    int64_t p = (int64_t)b->spans[3];
    if (!x || !y || !p || (backward && !dx))
        return 0;
    if (!in_session(c, r->x_ptr, x) || !in_session(c, r->y_ptr, y) || !in_session(c, r->scale, p))
        return 0;
    const uint64_t *optional, *required;
    uint64_t req_b[3] = {r->dx_ptr, r->dscale, r->dbias}, opt_b[3] = {r->bias, r->saved_mean,
                                                                      r->saved_inv_var};
    uint64_t req_f[1] = {r->bias}, opt_f[4] = {r->running_mean, r->running_var, r->saved_mean,
                                               r->saved_inv_var};
    int nreq = backward ? 3 : 1, nopt = backward ? 3 : 4;
    required = backward ? req_b : req_f;
    optional = backward ? opt_b : opt_f;
    for (int i = 0; i < nreq; i++)
        if (!in_session(c, required[i], backward && i == 0 ? dx : p))
            return 0;
    for (int i = 0; i < nopt; i++)
        if (optional[i] && !in_session(c, optional[i], p))
            return 0;
    if (r->workspace_size && !fast_owns(c, r->workspace, r->workspace_size))
        return 0;
    if (r->reserve_size && !fast_owns(c, r->reserve, r->reserve_size))
        return 0;
    return 1;
}

static int native_bn(const pilot_fast *f, struct fhandle *h, const pilot_req_dnn_bn *r,
                     const struct dnn_bn *b, uint64_t stream)
{
    void *const *fn = f->libfns;
    void *call = fn[r->fn == PILOT_BN_BACKWARD_EX ? PILOT_FAST_DNN_BN_BACKWARD
                                                  : PILOT_FAST_DNN_BN_FORWARD];
    if (!call || !fn[PILOT_FAST_DNN_SET_STREAM])
        return -1;
    int err = dnn_on_stream(f, h, stream);
    if (err)
        return err;
    union bn_value a, be, ap, bp;
    int dt = r->x.dtype;
    const void *alpha = bn_scalar(dt, r->alpha, &a), *beta = bn_scalar(dt, r->beta, &be);
    const uint64_t *d = b->descs;
    if (r->fn == PILOT_BN_FORWARD_TRAINING_EX)
        return ((bn_forward_fn)call)(h->handle, r->mode, r->bn_ops, alpha, beta, d[0], r->x_ptr, 0,
                                     0, d[1], r->y_ptr, d[3], r->scale, r->bias, r->factor,
                                     r->running_mean, r->running_var, r->epsilon, r->saved_mean,
                                     r->saved_inv_var, 0, r->workspace, (size_t)r->workspace_size,
                                     r->reserve, (size_t)r->reserve_size);
    return ((bn_backward_fn)call)(h->handle, r->mode, r->bn_ops, alpha, beta,
                                  bn_scalar(dt, r->alpha_param, &ap),
                                  bn_scalar(dt, r->beta_param, &bp), d[0], r->x_ptr, 0, 0, d[1],
                                  r->y_ptr, 0, 0, d[2], r->dx_ptr, d[3], r->scale, r->bias,
                                  r->dscale, r->dbias, r->epsilon, r->saved_mean, r->saved_inv_var,
                                  0, r->workspace, (size_t)r->workspace_size, r->reserve,
                                  (size_t)r->reserve_size);
}

static int try_bn(pilot_fast *f, struct fconn *c, const pilot_srv_msg *m,
                  const pilot_envelope *env, int *legacy)
{
    pilot_req_dnn_bn r;
    if (m->len[1] < sizeof r || (m->nframes > 2 && m->len[2]) || !(env->flags & PILOT_F_NO_REPLY))
        return FAST_PYTHON; /* the size queries are answered by Python */
    memcpy(&r, m->frame[1], sizeof r);
    if ((r.fn != PILOT_BN_FORWARD_TRAINING_EX && r.fn != PILOT_BN_BACKWARD_EX) ||
        (!f->generic_call && !f->libfns[PILOT_FAST_DNN_TENSOR_SET]))
        return FAST_PYTHON; /* nothing to learn: C could not run it */
    struct fhandle *h = handle_of(c, r.handle);
    if (!h)
        return FAST_LEARN;
    if (h->kind != PILOT_FAST_CUDNN)
        return FAST_PYTHON;
    struct bn_shape sh = shape_of(&r);
    const struct entry *e = map_find(&c->dnn_bns, shape_key(&sh));
    const struct dnn_bn *b = e ? (const struct dnn_bn *)(uintptr_t)e->value : NULL;
    if (!b)
        return FAST_LEARN;
    if (memcmp(&b->shape, &sh, sizeof sh) != 0 || !bn_ranges_ok(c, &r, b))
        return FAST_PYTHON;
    uint64_t stream = fast_stream(c, r.stream);
    if (!stream)
        return FAST_PYTHON;
    int err = f->generic_call ? f->generic_call(m->conn, PILOT_OP_DNN_BATCHNORM, stream, &r,
                                                sizeof r, NULL, 0)
                              : native_bn(f, h, &r, b, stream);
    if (err) {
        h->applied = 0;
        return FAST_PYTHON;
    }
    c->count.dnn_bn[r.fn == PILOT_BN_BACKWARD_EX]++;
    *legacy = !r.stream;
    return FAST_DONE;
}

int fast_try_library(pilot_fast *f, struct fconn *c, const pilot_srv_msg *m,
                     const pilot_envelope *env)
{
    if (c->deferred && !(env->flags & PILOT_F_NO_REPLY))
        return FAST_PYTHON; /* an error waits to be reported with the reply */

    int legacy = 0;
    int r = env->opcode == PILOT_OP_BLAS_GEMM       ? try_gemm(f, c, m, &legacy)
            : env->opcode == PILOT_OP_BLASLT_MATMUL ? try_lt(f, c, m, &legacy)
            : env->opcode == PILOT_OP_DNN_EXECUTE   ? try_dnn(f, c, m, &legacy)
            : env->opcode == PILOT_OP_DNN_BATCHNORM ? try_bn(f, c, m, env, &legacy)
                                                    : try_memset(f, c, m, &legacy);
    if (r != FAST_DONE)
        return r;
    if (legacy)
        c->count.legacy++; /* work on the legacy stream, as Python counts it */
    c->count.synced = 0;
    return FAST_DONE;
}
