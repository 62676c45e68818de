/* libpilot-cuda.so: cuGetExportTable, the driver's private tables.
 *
 * A CUDA runtime linked statically (nvcc's default, and inside cuBLAS, cuBLASLt, cuDNN, ...)
 * asks the driver for tables of functions by UUID at its start and uses a few of their entries:
 * module loading from the fatbin nvcc embedded, the primary context, storage per context, tool
 * hooks. They are undocumented; the UUIDs, sizes and the entries used here were measured on the
 * H100 (tests/gpu/driver_trace.sh, docs/design/frameworks.md R4) and by running
 * libcudart_static under pilot. Every table is served client-side: its entries are pilot's own
 * functions over the session (modules become MODULE_LOAD of the fatbin, contexts are drv_core.c's
 * tokens). An entry pilot does not know returns CUDA_ERROR_NOT_SUPPORTED and logs its table and
 * index once, so a runtime that needs more says exactly what.
 *
 * A table is an array of pointers; most start with their own size in bytes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drv.h"

#define SLOTS 32 /* the most entries a table has here (DEVICE_EXTENDED_RT: 26) */

enum table_id {
    T_CUDART_INTERFACE,
    T_TOOLS_TLS,
    T_TOOLS_HOOKS,
    T_CONTEXT_STORAGE,
    T_CONTEXT_CHECKS,
    T_CTX_CREATE_BYPASS,
    T_HEAP_ACCESS,
    T_DEVICE_EXTENDED,
    T_INTEGRITY,
    T_TABLES
};

struct table_info {
    const char *name;
    unsigned char uuid[16];
    int length; /* entries, the size word included */
    int sized;  /* entry 0 is the table's size in bytes */
};

static const struct table_info g_info[T_TABLES] = {
    [T_CUDART_INTERFACE] = {"CUDART_INTERFACE",
                            {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9,
                             0x39, 0x12, 0xfd, 0x9d, 0xf9},
                            13, 1},
    [T_TOOLS_TLS] = {"TOOLS_TLS",
                     {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a,
                      0x3a, 0xec, 0xdc},
                     4, 1},
    [T_TOOLS_HOOKS] = {"TOOLS_RUNTIME_CALLBACK_HOOKS",
                       {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00,
                        0x20, 0x0c, 0x0a, 0x66},
                       7, 1},
    [T_CONTEXT_STORAGE] = {"CONTEXT_LOCAL_STORAGE_INTERFACE_V0301",
                           {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68,
                            0xf3, 0x55, 0xd8, 0x95, 0x93},
                           4, 0},
    [T_CONTEXT_CHECKS] = {"CONTEXT_CHECKS",
                          {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5,
                           0x00, 0x6d, 0xfa, 0x7e},
                          4, 1},
    [T_CTX_CREATE_BYPASS] = {"CTX_CREATE_BYPASS",
                             {0x0c, 0xa5, 0x0b, 0x8c, 0x10, 0x04, 0x92, 0x9a, 0x89, 0xa7, 0xd0,
                              0xdf, 0x10, 0xe7, 0x72, 0x86},
                             2, 1},
    [T_HEAP_ACCESS] = {"HEAP_ACCESS",
                       {0x19, 0x5b, 0xcb, 0xf4, 0xd6, 0x7d, 0x02, 0x4a, 0xac, 0xc5, 0x1d, 0x29,
                        0xce, 0xa6, 0x31, 0xae},
                       3, 1},
    [T_DEVICE_EXTENDED] = {"DEVICE_EXTENDED_RT",
                           {0xb1, 0x05, 0x41, 0xe1, 0xf7, 0xc7, 0xc7, 0x4a, 0x9f, 0x64, 0xf2,
                            0x23, 0xbe, 0x99, 0xf1, 0xe2},
                           26, 1},
    [T_INTEGRITY] = {"INTEGRITY_CHECK",
                     {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c,
                      0x66, 0xe1, 0xf2},
                     3, 1},
};

static int g_trace = -1; /* PILOT_EXPORT_TRACE=1: one stderr line per private entry called */

static int tracing(void)
{
    if (g_trace < 0) {
        const char *v = getenv("PILOT_EXPORT_TRACE");
        g_trace = v && *v == '1';
    }
    return g_trace;
}

#define TRACE(table, slot)                                                                     \
    do {                                                                                       \
        if (tracing())                                                                         \
            fprintf(stderr, "[pilot %d] export %s[%d]\n", (int)getpid(), g_info[table].name,  \
                    slot);                                                                     \
    } while (0)

/* ---- entries pilot does not know ---- */

static unsigned char g_unknown_logged[T_TABLES][SLOTS];

static CUresult unknown_entry(int table, int slot)
{
    if (!__atomic_exchange_n(&g_unknown_logged[table][slot], 1, __ATOMIC_RELAXED)) {
        char what[96];
        snprintf(what, sizeof what, "the driver's private entry %s[%d]", g_info[table].name,
                 slot);
        pilot_drv_log_unsupported(what);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* One function per (table, slot), since the caller passes no way to tell them apart. Their
 * arguments are unknown and ignored: the System V calling convention lets a function taking
 * none be called with any. */
#define UNKNOWN(t, s)                                                                          \
    static CUresult unknown_##t##_##s(void) { return unknown_entry(t, s); }
#define UNKNOWN_ROW(t)                                                                         \
    UNKNOWN(t, 0) UNKNOWN(t, 1) UNKNOWN(t, 2) UNKNOWN(t, 3) UNKNOWN(t, 4) UNKNOWN(t, 5)       \
    UNKNOWN(t, 6) UNKNOWN(t, 7) UNKNOWN(t, 8) UNKNOWN(t, 9) UNKNOWN(t, 10) UNKNOWN(t, 11)     \
    UNKNOWN(t, 12) UNKNOWN(t, 13) UNKNOWN(t, 14) UNKNOWN(t, 15) UNKNOWN(t, 16)                \
    UNKNOWN(t, 17) UNKNOWN(t, 18) UNKNOWN(t, 19) UNKNOWN(t, 20) UNKNOWN(t, 21)                \
    UNKNOWN(t, 22) UNKNOWN(t, 23) UNKNOWN(t, 24) UNKNOWN(t, 25)
#define UNKNOWN_REF(t)                                                                         \
    {(void *)unknown_##t##_0, (void *)unknown_##t##_1, (void *)unknown_##t##_2,               \
     (void *)unknown_##t##_3, (void *)unknown_##t##_4, (void *)unknown_##t##_5,               \
     (void *)unknown_##t##_6, (void *)unknown_##t##_7, (void *)unknown_##t##_8,               \
     (void *)unknown_##t##_9, (void *)unknown_##t##_10, (void *)unknown_##t##_11,             \
     (void *)unknown_##t##_12, (void *)unknown_##t##_13, (void *)unknown_##t##_14,            \
     (void *)unknown_##t##_15, (void *)unknown_##t##_16, (void *)unknown_##t##_17,            \
     (void *)unknown_##t##_18, (void *)unknown_##t##_19, (void *)unknown_##t##_20,            \
     (void *)unknown_##t##_21, (void *)unknown_##t##_22, (void *)unknown_##t##_23,            \
     (void *)unknown_##t##_24, (void *)unknown_##t##_25}

UNKNOWN_ROW(0) UNKNOWN_ROW(1) UNKNOWN_ROW(2) UNKNOWN_ROW(3) UNKNOWN_ROW(4) UNKNOWN_ROW(5)
UNKNOWN_ROW(6) UNKNOWN_ROW(7) UNKNOWN_ROW(8)

static void *const g_unknown[T_TABLES][26] = {UNKNOWN_REF(0), UNKNOWN_REF(1), UNKNOWN_REF(2),
                                               UNKNOWN_REF(3), UNKNOWN_REF(4), UNKNOWN_REF(5),
                                               UNKNOWN_REF(6), UNKNOWN_REF(7), UNKNOWN_REF(8)};

/* ---- CUDART_INTERFACE: modules from the fatbin nvcc embeds, the primary context ---- */

static CUresult module_from_fatbin(CUmodule *module, const void *wrapper)
{
    if (!module || !wrapper)
        return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadData(module, wrapper);
}

static CUresult cudart_module(CUmodule *module, const void *wrapper)
{
    TRACE(T_CUDART_INTERFACE, 1);
    return module_from_fatbin(module, wrapper);
}

/* The primary context of a device, retained, as the static runtime's own context. */
static CUresult cudart_primary_context(CUcontext *ctx, CUdevice dev)
{
    TRACE(T_CUDART_INTERFACE, 2);
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    return cuDevicePrimaryCtxRetain(ctx, dev);
}

/* The forms with options: none known is honoured, so any is refused. */
static CUresult cudart_module_ext(CUmodule *module, const void *wrapper, void *a, void *b,
                                  unsigned c)
{
    TRACE(T_CUDART_INTERFACE, 6);
    if (a || b || c)
        return unknown_entry(T_CUDART_INTERFACE, 6);
    return module_from_fatbin(module, wrapper);
}

static void cudart_entry7(uintptr_t arg)
{
    TRACE(T_CUDART_INTERFACE, 7);
    (void)arg;
}

static CUresult cudart_module_header(const void *fatbin, CUmodule *module, void *a, void *b,
                                     unsigned c)
{
    TRACE(T_CUDART_INTERFACE, 8);
    if (a || b || c)
        return unknown_entry(T_CUDART_INTERFACE, 8);
    return module_from_fatbin(module, fatbin);
}

/* Loads the PTX compiler natively; the daemon's driver compiles, so nothing to do. */
static CUresult cudart_load_compilers(void)
{
    TRACE(T_CUDART_INTERFACE, 12);
    return CUDA_SUCCESS;
}

/* ---- tool hooks: buffers the runtime fills for profilers; nobody reads them here ---- */

static uint32_t g_hook_buffer1[1024], g_hook_buffer2[14];

static void hook_buffer1(void **ptr, size_t *size)
{
    TRACE(T_TOOLS_HOOKS, 2);
    *ptr = g_hook_buffer1;
    *size = sizeof g_hook_buffer1 / sizeof g_hook_buffer1[0];
}

static void hook_buffer2(void **ptr, size_t *size)
{
    TRACE(T_TOOLS_HOOKS, 6);
    *ptr = g_hook_buffer2;
    *size = sizeof g_hook_buffer2 / sizeof g_hook_buffer2[0];
}

/* ---- context-local storage: the runtime keeps its state per context in the driver ---- */

typedef void (*storage_dtor)(CUcontext, void *key, void *value);

struct storage_item {
    CUcontext ctx;
    void *key, *value;
    storage_dtor dtor;
    struct storage_item *next;
};

static struct storage_item *g_storage;
static pthread_mutex_t g_storage_lock = PTHREAD_MUTEX_INITIALIZER;

/* ctx, or the calling thread's current context for NULL; NULL if there is none. */
static CUcontext storage_context(CUcontext ctx)
{
    if (!ctx && cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
        return NULL;
    return ctx;
}

static struct storage_item **storage_find(CUcontext ctx, void *key)
{
    struct storage_item **p = &g_storage;
    while (*p && ((*p)->ctx != ctx || (*p)->key != key))
        p = &(*p)->next;
    return p;
}

static CUresult storage_put(CUcontext ctx, void *key, void *value, storage_dtor dtor)
{
    TRACE(T_CONTEXT_STORAGE, 0);
    if (!(ctx = storage_context(ctx)))
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_storage_lock);
    struct storage_item **p = storage_find(ctx, key);
    if (!*p) {
        *p = calloc(1, sizeof **p);
        if (!*p) {
            pthread_mutex_unlock(&g_storage_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        (*p)->ctx = ctx;
        (*p)->key = key;
    }
    (*p)->value = value;
    (*p)->dtor = dtor;
    pthread_mutex_unlock(&g_storage_lock);
    return CUDA_SUCCESS;
}

static CUresult storage_delete(CUcontext ctx, void *key)
{
    TRACE(T_CONTEXT_STORAGE, 1);
    if (!(ctx = storage_context(ctx)))
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_storage_lock);
    struct storage_item **p = storage_find(ctx, key), *item = *p;
    if (item)
        *p = item->next;
    pthread_mutex_unlock(&g_storage_lock);
    free(item);
    return item ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult storage_get(void **value, CUcontext ctx, void *key)
{
    TRACE(T_CONTEXT_STORAGE, 2);
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (!(ctx = storage_context(ctx)))
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_storage_lock);
    struct storage_item *item = *storage_find(ctx, key);
    if (item)
        *value = item->value;
    pthread_mutex_unlock(&g_storage_lock);
    return item ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Runs and drops the context-local storage of ctx (the primary context was reset). */
static void context_reset(CUcontext ctx)
{
    /* The destructors run outside the lock: the runtime's may call back into the storage. */
    for (;;) {
        pthread_mutex_lock(&g_storage_lock);
        struct storage_item **p = &g_storage;
        while (*p && (*p)->ctx != ctx)
            p = &(*p)->next;
        struct storage_item *item = *p;
        if (item)
            *p = item->next;
        pthread_mutex_unlock(&g_storage_lock);
        if (!item)
            return;
        if (item->dtor)
            item->dtor(ctx, item->key, item->value);
        free(item);
    }
}

__attribute__((constructor)) static void register_context_reset(void)
{
    pilot_drv_on_context_reset(context_reset);
}

/* ---- the integrity check: what stops a static runtime here ----
 * The runtime asks the driver for a keyed hash (of the process and thread, the tables' addresses,
 * the time and the devices) and refuses to work unless it matches its own. Only NVIDIA's libcuda
 * computes it; pilot does not reproduce it, so a static runtime on pilot's driver stops here and
 * its CUDA calls fail (frameworks.md section 10). Said once, as an error. */

static unsigned char g_integrity_said;

static CUresult integrity_check(uint32_t version, uint64_t seconds, uint64_t *result)
{
    TRACE(T_INTEGRITY, 1);
    (void)version, (void)seconds, (void)result;
    if (!__atomic_exchange_n(&g_integrity_said, 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "[pilot %d] error: a statically linked CUDA runtime (nvcc's default, or the one "
                "inside a CUDA library such as cuBLAS, cuBLASLt or cuDNN) asked for the NVIDIA "
                "driver's integrity check, which pilot cannot compute: that runtime's CUDA calls "
                "fail. Programs must use the shared runtime (`nvcc -cudart shared`); the CUDA "
                "libraries are not carried yet (docs/design/frameworks.md)\n",
                (int)getpid());
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- context checks: flags of a context the runtime asks about; none is ever set here ---- */

static CUresult context_check(CUcontext ctx, uint32_t *flags, const void **other)
{
    TRACE(T_CONTEXT_CHECKS, 2);
    (void)ctx, (void)other;
    if (flags)
        *flags = 0;
    return CUDA_SUCCESS;
}

static uint32_t context_check3(void)
{
    TRACE(T_CONTEXT_CHECKS, 3);
    return 0;
}

/* ---- the tables ---- */

static void *g_tables[T_TABLES][SLOTS];
static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void)
{
    for (int t = 0; t < T_TABLES; t++) {
        for (int s = 0; s < g_info[t].length; s++)
            g_tables[t][s] = g_unknown[t][s];
        if (g_info[t].sized)
            g_tables[t][0] = (void *)(uintptr_t)(g_info[t].length * sizeof(void *));
    }
    void **c = g_tables[T_CUDART_INTERFACE];
    c[1] = (void *)cudart_module;
    c[2] = (void *)cudart_primary_context;
    c[6] = (void *)cudart_module_ext;
    c[7] = (void *)cudart_entry7;
    c[8] = (void *)cudart_module_header;
    c[12] = (void *)cudart_load_compilers;
    g_tables[T_TOOLS_HOOKS][2] = (void *)hook_buffer1;
    g_tables[T_TOOLS_HOOKS][6] = (void *)hook_buffer2;
    void **s = g_tables[T_CONTEXT_STORAGE];
    s[0] = (void *)storage_put;
    s[1] = (void *)storage_delete;
    s[2] = (void *)storage_get;
    g_tables[T_CONTEXT_CHECKS][2] = (void *)context_check;
    g_tables[T_CONTEXT_CHECKS][3] = (void *)context_check3;
    g_tables[T_INTEGRITY][1] = (void *)integrity_check;
}

/* Whether the table `id` was said to be unknown before (each is said once; the first 16). */
static int said_before(const unsigned char *id)
{
    static unsigned char said[16][16];
    static int nsaid;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nsaid && !found; i++)
        found = memcmp(said[i], id, 16) == 0;
    if (!found && nsaid < 16)
        memcpy(said[nsaid++], id, 16);
    else
        found = 1;
    pthread_mutex_unlock(&lock);
    return found;
}

PILOT_DRV_EXPORT CUresult CUDAAPI cuGetExportTable(const void **ppExportTable,
                                                   const CUuuid *pExportTableId)
{
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_tables_once, build_tables);
    for (int t = 0; t < T_TABLES; t++) {
        if (memcmp(pExportTableId->bytes, g_info[t].uuid, 16) == 0) {
            if (tracing())
                fprintf(stderr, "[pilot %d] export table %s\n", (int)getpid(), g_info[t].name);
            *ppExportTable = g_tables[t];
            return CUDA_SUCCESS;
        }
    }
    *ppExportTable = NULL;
    const unsigned char *u = (const unsigned char *)pExportTableId->bytes;
    /* NVML (libnvidia-ml, loaded by PyTorch) asks every libcuda for this one and works on
     * without it: not worth a line on every run. */
    static const unsigned char nvml_table[16] = {0x69, 0xa2, 0x8e, 0x9f, 0x24, 0x49, 0x8b, 0x47,
                                                 0xb0, 0x30, 0xc5, 0xda, 0x33, 0x0e, 0xa4, 0xe9};
    int quiet = memcmp(u, nvml_table, 16) == 0;
    if (tracing() || (!quiet && !said_before(u))) {
        char what[96];
        snprintf(what, sizeof what,
                 "the driver's private table %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
                 "%02x%02x%02x%02x%02x%02x",
                 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
                 u[13], u[14], u[15]);
        pilot_drv_log_unsupported(what);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}
