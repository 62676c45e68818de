/* The driver's linker: cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete, cuLinkDestroy
 * (Numba links every kernel this way; CuPy and NVRTC programs link relocatable code with it).
 *
 * The client only gathers the inputs (its files are read here, with its own permissions); at
 * cuLinkComplete pilotd's driver links them (daemon/ops/linker.py, PILOT_OP_LINK) and the cubin
 * and the log come back (PILOT_OP_LINK_FETCH, in pieces). The cubin belongs to the link state
 * until cuLinkDestroy, as natively; the program loads it with cuModuleLoadData like any image.
 * Options with a plain value (registers, optimization level, target, debug and line info, ...)
 * go to pilotd's linker; the log buffers, their sizes and the wall time are filled here, from
 * the log pilotd returns (pilot_drv_jit_report, as for a module load). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drv.h"

#define LINK_MAGIC 0x4b4e494cu           /* "LINK" */
#define LINK_MAX_BYTES (512ull << 20)    /* inputs of one link, at most */

struct link_state {
    uint32_t magic;
    unsigned char *inputs; /* pilot_link_input records, each with its name and data, 8-aligned */
    size_t len, cap;
    uint32_t count;
    pilot_req_link req;
    /* The program's option arrays: the logs and OUT values are written at cuLinkComplete
     * (CUDA: they must stay valid for the life of the state when output options are used). */
    unsigned int noptions;
    CUjit_option *options;
    void **values;
    void *image;
    size_t image_size;
};

/* Options whose value is a plain number, which pilotd's linker takes as they are. */
static int forwarded(CUjit_option o)
{
    switch (o) {
    case CU_JIT_MAX_REGISTERS: case CU_JIT_OPTIMIZATION_LEVEL: case CU_JIT_TARGET:
    case CU_JIT_FALLBACK_STRATEGY: case CU_JIT_GENERATE_DEBUG_INFO: case CU_JIT_LOG_VERBOSE:
    case CU_JIT_GENERATE_LINE_INFO: case CU_JIT_CACHE_MODE: case CU_JIT_FTZ:
    case CU_JIT_PREC_DIV: case CU_JIT_PREC_SQRT: case CU_JIT_FMA:
        return 1;
    default:
        return 0;
    }
}

static struct link_state *state_of(CUlinkState s)
{
    struct link_state *st = (struct link_state *)s;
    return st && st->magic == LINK_MAGIC ? st : NULL;
}

static int append(struct link_state *st, const void *data, size_t n)
{
    size_t padded = (n + 7) & ~(size_t)7;
    if (st->len + padded > LINK_MAX_BYTES)
        return -1;
    if (st->len + padded > st->cap) {
        size_t cap = st->cap ? st->cap : 65536;
        while (cap < st->len + padded)
            cap *= 2;
        unsigned char *grown = realloc(st->inputs, cap);
        if (!grown)
            return -1;
        st->inputs = grown;
        st->cap = cap;
    }
    memcpy(st->inputs + st->len, data, n);
    memset(st->inputs + st->len + n, 0, padded - n);
    st->len += padded;
    return 0;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options,
                                                  void **optionValues, CUlinkState *stateOut)
{
    if (!stateOut || (numOptions && (!options || !optionValues)))
        return CUDA_ERROR_INVALID_VALUE;
    PILOT_DRV_ENTER(1);
    struct link_state *st = calloc(1, sizeof *st);
    if (!st)
        return CUDA_ERROR_OUT_OF_MEMORY;
    st->magic = LINK_MAGIC;
    st->noptions = numOptions;
    st->options = options;
    st->values = optionValues;
    for (unsigned int i = 0; i < numOptions; i++) {
        if (!forwarded(options[i]))
            continue;
        if (st->req.noptions == PILOT_LINK_OPTIONS) {
            free(st);
            return CUDA_ERROR_INVALID_VALUE;
        }
        st->req.options[st->req.noptions++] = (pilot_link_option){
            .option = (uint32_t)options[i], .value = (uint32_t)(uintptr_t)optionValues[i]};
    }
    *stateOut = (CUlinkState)st;
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data,
                                                   size_t size, const char *name,
                                                   unsigned int numOptions, CUjit_option *options,
                                                   void **optionValues)
{
    (void)options;
    (void)optionValues;
    (void)numOptions; /* per-input options tune the JIT of that input: not carried */
    struct link_state *st = state_of(state);
    if (!st || !data || !size || (unsigned)type > CU_JIT_INPUT_LIBRARY)
        return st ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    PILOT_DRV_ENTER(1);
    if (type == CU_JIT_INPUT_PTX) /* PTX is text: the driver reads it up to a NUL */
        size = strnlen(data, size);
    const char *label = name ? name : "";
    pilot_link_input in = {.type = (uint32_t)type, .name_len = (uint32_t)strlen(label), .size = size};
    size_t before = st->len;
    /* the header, the name and the data each padded: the reader walks the same way */
    if (append(st, &in, sizeof in) || append(st, label, in.name_len) || append(st, data, size)) {
        st->len = before;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    st->count++;
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkAddFile_v2(CUlinkState state, CUjitInputType type,
                                                   const char *path, unsigned int numOptions,
                                                   CUjit_option *options, void **optionValues)
{
    if (!state_of(state) || !path)
        return state_of(state) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    FILE *f = fopen(path, "rb");
    if (!f)
        return CUDA_ERROR_FILE_NOT_FOUND;
    unsigned char *data = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 65536 > cap) {
            unsigned char *grown = cap < LINK_MAX_BYTES ? realloc(data, cap = (len + 65536) * 2) : NULL;
            if (!grown) {
                free(data);
                fclose(f);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            data = grown;
        }
        got = fread(data + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    fclose(f);
    CUresult r = len ? cuLinkAddData_v2(state, type, data, len, path, numOptions, options, optionValues)
                     : CUDA_ERROR_INVALID_IMAGE;
    free(data);
    return r;
}

/* bytes [offset, offset+count) of the last link's image and log, from pilotd */
static CUresult fetch(int dev, uint64_t offset, unsigned char *out, uint64_t count)
{
    for (uint64_t done = 0; done < count;) {
        uint64_t n = count - done < PILOT_INLINE_MAX ? count - done : PILOT_INLINE_MAX;
        pilot_req_link_fetch req = {.offset = offset + done, .count = n};
        size_t got = 0;
        CUresult r = PILOT_DRV_RT(pilot_drv_ops->call_on(dev, PILOT_OP_LINK_FETCH, &req, sizeof req,
                                                         NULL, 0, NULL, 0, out + done, n, &got));
        if (r != CUDA_SUCCESS)
            return r;
        if (got != n)
            return CUDA_ERROR_UNKNOWN;
        done += n;
    }
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    struct link_state *st = state_of(state);
    if (!st || !cubinOut || !sizeOut)
        return st ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    PILOT_DRV_ENTER(1);
    int dev = pilot_drv_device();
    st->req.count = st->count;
    pilot_rep_link rep;
    CUresult r = PILOT_DRV_RT(pilot_drv_ops->call_on(dev, PILOT_OP_LINK, &st->req, sizeof st->req,
                                                     st->inputs, st->len, &rep, sizeof rep, NULL, 0,
                                                     NULL));
    if (r != CUDA_SUCCESS)
        return r;
    char *log = NULL;
    if (rep.log_bytes) {
        log = malloc(rep.log_bytes);
        if (!log || fetch(dev, rep.image_bytes, (unsigned char *)log, rep.log_bytes) != CUDA_SUCCESS)
            rep.log_bytes = 0;
    }
    r = (CUresult)rep.result;
    if (r == CUDA_SUCCESS) {
        free(st->image);
        st->image = malloc(rep.image_bytes ? rep.image_bytes : 1);
        st->image_size = rep.image_bytes;
        r = st->image ? fetch(dev, 0, st->image, rep.image_bytes) : CUDA_ERROR_OUT_OF_MEMORY;
    }
    pilot_drv_jit_report(st->noptions, st->options, st->values, r, log ? log : "", rep.log_bytes);
    free(log);
    if (r != CUDA_SUCCESS)
        return r;
    *cubinOut = st->image;
    *sizeOut = st->image_size;
    return CUDA_SUCCESS;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkDestroy(CUlinkState state)
{
    struct link_state *st = state_of(state);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    st->magic = 0;
    free(st->inputs);
    free(st->image);
    free(st);
    return CUDA_SUCCESS;
}

/* The unversioned exports of old binaries: cuda.h maps these names to the _v2 forms. */
#undef cuLinkCreate
#undef cuLinkAddData
#undef cuLinkAddFile
PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkCreate(unsigned int numOptions, CUjit_option *options,
                                               void **optionValues, CUlinkState *stateOut);
PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkCreate(unsigned int numOptions, CUjit_option *options,
                                               void **optionValues, CUlinkState *stateOut)
{
    return cuLinkCreate_v2(numOptions, options, optionValues, stateOut);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkAddData(CUlinkState state, CUjitInputType type, void *data,
                                                size_t size, const char *name, unsigned int numOptions,
                                                CUjit_option *options, void **optionValues);
PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkAddData(CUlinkState state, CUjitInputType type, void *data,
                                                size_t size, const char *name, unsigned int numOptions,
                                                CUjit_option *options, void **optionValues)
{
    return cuLinkAddData_v2(state, type, data, size, name, numOptions, options, optionValues);
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path,
                                                unsigned int numOptions, CUjit_option *options,
                                                void **optionValues);
PILOT_DRV_EXPORT CUresult CUDAAPI cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path,
                                                unsigned int numOptions, CUjit_option *options,
                                                void **optionValues)
{
    return cuLinkAddFile_v2(state, type, path, numOptions, options, optionValues);
}
