/* Tracing stand-in for libcuda.so.1: the C half. gen_trace.py generates the other half (dt_tramp.S:
 * one trampoline per export of the real library plus a pool of spare ones, dt_table.c: their names)
 * and links the three into a library named libcuda.so.1.
 *
 * - Every export is a trampoline (count, then jump through dt_real[i]); no signature is needed. The
 *   first 64 calls of each and every 1024th after go through dt_slow, which calls dt_note_caller
 *   with the return address, so the JSON says which library calls what (sampled).
 * - cuGetProcAddress / cuGetProcAddress_v2 are wrapped: the real one resolves the symbol, the
 *   request is recorded (symbol, version, flags, result, the calling library and the first other
 *   library up the stack, e.g. the one that called cudaGetDriverEntryPoint in libcudart), and the
 *   caller gets a pool trampoline of its own for the real pointer (one per calling library and
 *   pointer), so calls made through cuGetProcAddress are counted per requesting library.
 * - cuGetExportTable passes through; the UUID and the caller are recorded. With
 *   DRIVER_TRACE_WRAP_TABLES=1 the caller gets a copy of the table whose code pointers into the real
 *   library are pool trampolines, so private-table calls are counted by (UUID, index).
 * - Libraries that dlopen libcuda.so.1 and dlsym a name get the export trampolines (the name
 *   resolves in this library), so their calls are in the "export" counts.
 * - One export of its own, driver_trace_snapshot(label): a copy of the counts at that moment,
 *   written with the rest (a program brackets a loop with two to get calls per iteration).
 *
 * Environment: DRIVER_TRACE_OUT (JSON path, %p = pid; default driver_trace.%p.json in the working
 * directory; written by the destructor), DRIVER_TRACE_WRAP_TABLES=1, DRIVER_TRACE_BACKTRACE=0 (no
 * stack walk for the "via" library), DRIVER_TRACE_DEEPBIND=1 (dlopen the real library with
 * RTLD_DEEPBIND), DRIVER_TRACE_QUIET=1 (no line on stderr at exit). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define CUDA_ERROR_NOT_FOUND 500

/* from dt_table.c / dt_tramp.S (hidden: built with -fvisibility=hidden) */
extern const size_t dt_nexports, dt_pool;
extern const char dt_real_path[];
extern const char *const dt_names[];
extern unsigned long dt_counts[];
extern void *dt_real[];
extern void *const dt_tramp[];
void dt_note_caller(size_t slot, void *ret);

typedef int CUresult;
typedef struct { unsigned char bytes[16]; } CUuuid;
typedef CUresult (*gpa_v1_t)(const char *, void **, int, uint64_t);
typedef CUresult (*gpa_v2_t)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*get_table_t)(const void **, const CUuuid *);

enum { KIND_EXPORT, KIND_PROC, KIND_TABLE };
#define MAXLIBS 1024
#define NCALLERS 6
#define MAXORDER 16384
#define MAXTABLES 256
#define MAXSNAPS 32

struct callers { uint16_t lib[NCALLERS]; uint32_t n[NCALLERS]; uint32_t other; };
struct slot { int export_idx; int lib; int kind; char *name; };
struct request { int lib, via, api, version, rc, status, resolved; uint64_t flags; char *symbol; };
struct table_req { int lib, via, rc; CUuuid uuid; const void *table; uint64_t size_hint; int wrapped; };
struct table_copy { const void *orig; const void *copy; int wrapped; };
struct segment { uintptr_t lo, hi; int exec; };
struct snapshot { char label[64]; unsigned long *counts; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *real_handle;
static gpa_v1_t real_gpa1;
static gpa_v2_t real_gpa2;
static get_table_t real_get_table;
static long idx_gpa1 = -1, idx_gpa2 = -1, idx_table = -1;
static const void *lib_base[MAXLIBS];
static char *lib_name[MAXLIBS];
static int nlibs;
static const void *own_base, *real_base;
static struct segment real_seg[16];
static int nreal_seg;
static struct callers *callers;     /* one per slot (exports then pool) */
static unsigned char *seen;         /* slot used at least once (first-use order) */
static uint32_t *order;
static size_t norder;
static struct slot *pool_meta;
static size_t pool_used;
static unsigned long pool_exhausted;
static void **ptr_keys;             /* real pointer -> export index (open addressing) */
static int *ptr_vals;
static size_t ptr_cap;
static uintptr_t *pool_keys;        /* (lib, real pointer) -> pool slot */
static size_t *pool_vals, pool_cap;
static struct request *reqs;
static size_t nreqs, reqs_cap;
static struct table_req treqs[4096];
static size_t ntreqs;
static struct table_copy tcopies[MAXTABLES];
static size_t ntcopies;
static struct snapshot snaps[MAXSNAPS];
static int nsnaps;
static int wrap_tables, use_backtrace = 1, quiet;
static pid_t forked_from;

static int dt_missing(void) { return CUDA_ERROR_NOT_FOUND; }

static size_t hash_ptr(uintptr_t p) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull); }

static int export_of(const void *p)
{
    if (!p || !ptr_cap) return -1;
    for (size_t h = hash_ptr((uintptr_t)p) & (ptr_cap - 1);; h = (h + 1) & (ptr_cap - 1)) {
        if (ptr_keys[h] == p) return ptr_vals[h];
        if (!ptr_keys[h]) return -1;
    }
}

static void map_export(void *p, size_t i)
{
    if (!p) return;
    size_t h = hash_ptr((uintptr_t)p) & (ptr_cap - 1);
    while (ptr_keys[h] && ptr_keys[h] != p) h = (h + 1) & (ptr_cap - 1);
    if (!ptr_keys[h]) { ptr_keys[h] = p; ptr_vals[h] = (int)i; }   /* aliases: the first name */
}

static int segment_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    const struct link_map *lm = data;
    (void)size;
    if (info->dlpi_addr != lm->l_addr || !info->dlpi_name || strcmp(info->dlpi_name, lm->l_name)) return 0;
    for (int i = 0; i < info->dlpi_phnum && nreal_seg < 16; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        real_seg[nreal_seg].lo = info->dlpi_addr + ph->p_vaddr;
        real_seg[nreal_seg].hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
        real_seg[nreal_seg].exec = (ph->p_flags & PF_X) != 0;
        nreal_seg++;
    }
    return 1;
}

/* The real library's PT_LOAD segments (export-table wrapping only touches memory inside them). */
static void collect_segments(void)
{
    struct link_map *lm = NULL;
    if (dlinfo(real_handle, RTLD_DI_LINKMAP, &lm) == 0 && lm) dl_iterate_phdr(segment_cb, lm);
}

static void reset_in_child(void)
{
    forked_from = getppid();
    memset(dt_counts, 0, sizeof(unsigned long) * (dt_nexports + dt_pool));
    memset(callers, 0, sizeof(*callers) * (dt_nexports + dt_pool));
    memset(seen, 0, dt_nexports + dt_pool);
    norder = nreqs = ntreqs = 0;
    nsnaps = 0;
    pthread_mutex_init(&mu, NULL);
}

static void init(void)
{
    const char *e;
    size_t total = dt_nexports + dt_pool;
    wrap_tables = (e = getenv("DRIVER_TRACE_WRAP_TABLES")) && *e == '1';
    use_backtrace = !((e = getenv("DRIVER_TRACE_BACKTRACE")) && *e == '0');
    quiet = (e = getenv("DRIVER_TRACE_QUIET")) && *e == '1';
    int deep = (e = getenv("DRIVER_TRACE_DEEPBIND")) && *e == '1';
    callers = calloc(total, sizeof(*callers));
    seen = calloc(total, 1);
    order = calloc(MAXORDER, sizeof(*order));
    pool_meta = calloc(dt_pool ? dt_pool : 1, sizeof(*pool_meta));
    for (ptr_cap = 64; ptr_cap < 8 * dt_nexports; ptr_cap *= 2) {}
    ptr_keys = calloc(ptr_cap, sizeof(*ptr_keys));
    ptr_vals = calloc(ptr_cap, sizeof(*ptr_vals));
    for (pool_cap = 64; pool_cap < 2 * dt_pool; pool_cap *= 2) {}
    pool_keys = calloc(pool_cap * 2, sizeof(*pool_keys));
    pool_vals = calloc(pool_cap, sizeof(*pool_vals));
    if (!callers || !seen || !order || !pool_meta || !ptr_keys || !ptr_vals || !pool_keys || !pool_vals) abort();
    /* The real library's constructors may call its exports through our trampolines already: the
     * first calls of each take the slow path, which resolves dt_real lazily (resolve_export). */
    void *h = dlopen(dt_real_path, RTLD_NOW | RTLD_LOCAL | (deep ? RTLD_DEEPBIND : 0));
    if (!h) {
        fprintf(stderr, "driver_trace: cannot load the real %s: %s\n", dt_real_path, dlerror());
        abort();
    }
    real_handle = h;
    for (size_t i = 0; i < dt_nexports; i++) {
        void *p = dlsym(real_handle, dt_names[i]);
        dt_real[i] = p ? p : (void *)dt_missing;
        if (!strcmp(dt_names[i], "cuGetProcAddress")) idx_gpa1 = (long)i;
        if (!strcmp(dt_names[i], "cuGetProcAddress_v2")) idx_gpa2 = (long)i;
        if (!strcmp(dt_names[i], "cuGetExportTable")) idx_table = (long)i;
        map_export(p, i);
        map_export(dt_tramp[i], i);   /* a real library whose own references bind to our exports */
    }
    real_gpa1 = (gpa_v1_t)dlsym(real_handle, "cuGetProcAddress");
    real_gpa2 = (gpa_v2_t)dlsym(real_handle, "cuGetProcAddress_v2");
    real_get_table = (get_table_t)dlsym(real_handle, "cuGetExportTable");
    Dl_info di;
    if (dladdr((void *)init, &di)) own_base = di.dli_fbase;
    for (size_t i = 0; i < dt_nexports && !real_base; i++)
        if (dt_real[i] != (void *)dt_missing && dladdr(dt_real[i], &di)) real_base = di.dli_fbase;
    collect_segments();
    pthread_atfork(NULL, NULL, reset_in_child);
}

__attribute__((constructor)) static void dt_ctor(void) { pthread_once(&once, init); }

/* Library id of an address (dladdr outside the lock: it takes the loader's lock, and a loader
 * thread running a constructor may be waiting for ours). */
static int lib_of(const void *addr)
{
    Dl_info di;
    const void *base = NULL;
    const char *name = "?";
    if (addr && dladdr(addr, &di)) {
        base = di.dli_fbase;
        name = di.dli_fname && *di.dli_fname ? di.dli_fname : "(main program)";
    }
    pthread_mutex_lock(&mu);
    int id;
    for (id = 0; id < nlibs; id++)
        if (lib_base[id] == base) break;
    if (id == nlibs) {
        if (nlibs < MAXLIBS - 1) { lib_base[nlibs] = base; lib_name[nlibs] = strdup(name); nlibs++; }
        else id = MAXLIBS - 1, lib_name[id] = lib_name[id] ? lib_name[id] : strdup("(too many libraries)");
    }
    pthread_mutex_unlock(&mu);
    return id;
}

/* The first library up the stack other than the direct caller's and ours (-1: none). */
static int via_of(int direct)
{
    void *frames[16];
    if (!use_backtrace) return -1;
    int n = backtrace(frames, 16);
    for (int i = 1; i < n; i++) {
        int id = lib_of(frames[i]);
        if (id != direct && lib_base[id] != own_base) return id;
    }
    return -1;
}

/* An export called before init has its real address (from the real library's own constructor). */
static void resolve_export(size_t slot)
{
    void *h = real_handle ? real_handle : dlopen(dt_real_path, RTLD_NOW | RTLD_NOLOAD);
    void *p = h ? dlsym(h, dt_names[slot]) : NULL;
    __atomic_store_n(&dt_real[slot], p ? p : (void *)dt_missing, __ATOMIC_RELEASE);
}

void dt_note_caller(size_t slot, void *ret)
{
    if (slot < dt_nexports && !__atomic_load_n(&dt_real[slot], __ATOMIC_ACQUIRE)) resolve_export(slot);
    if (!callers) return;
    int id = lib_of(ret);
    pthread_mutex_lock(&mu);
    if (!seen[slot]) {
        seen[slot] = 1;
        if (norder < MAXORDER) order[norder++] = (uint32_t)slot;
    }
    struct callers *c = &callers[slot];
    int k;
    for (k = 0; k < NCALLERS && c->n[k]; k++)
        if (c->lib[k] == id) break;
    if (k < NCALLERS) { c->lib[k] = (uint16_t)id; c->n[k]++; }
    else c->other++;
    pthread_mutex_unlock(&mu);
}

static void count_wrapped(long idx, void *ret)
{
    if (idx < 0) return;
    __atomic_add_fetch(&dt_counts[idx], 1, __ATOMIC_RELAXED);
    dt_note_caller((size_t)idx, ret);
}

/* A pool trampoline for a real pointer (mu held); NULL when the pool is full. */
static void *pool_slot(const void *real, const char *name, int lib, int kind, int keyed)
{
    uintptr_t k0 = (uintptr_t)real, k1 = (uintptr_t)lib + 1;
    size_t h = (hash_ptr(k0) ^ k1) & (pool_cap - 1);
    if (keyed)
        for (; pool_keys[2 * h]; h = (h + 1) & (pool_cap - 1))
            if (pool_keys[2 * h] == k0 && pool_keys[2 * h + 1] == k1) return dt_tramp[dt_nexports + pool_vals[h]];
    if (pool_used >= dt_pool) { pool_exhausted++; return NULL; }
    size_t j = pool_used++;
    pool_meta[j] = (struct slot){export_of(real), lib, kind, strdup(name)};
    __atomic_store_n(&dt_real[dt_nexports + j], (void *)real, __ATOMIC_RELEASE);
    if (keyed) { pool_keys[2 * h] = k0; pool_keys[2 * h + 1] = k1; pool_vals[h] = j; }
    return dt_tramp[dt_nexports + j];
}

EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, uint64_t, int *);
EXPORT CUresult cuGetProcAddress(const char *, void **, int, uint64_t);
EXPORT CUresult cuGetExportTable(const void **, const CUuuid *);

static void *wrap_pointer(void *real, const char *symbol, int lib)
{
    if (!real) return real;
    if (real_gpa2 && real == (void *)real_gpa2) return (void *)cuGetProcAddress_v2;
    if (real_gpa1 && real == (void *)real_gpa1) return (void *)cuGetProcAddress;
    if (real_get_table && real == (void *)real_get_table) return (void *)cuGetExportTable;
    Dl_info di;     /* already ours (a real library whose own references bind to our exports) */
    if (dladdr(real, &di) && di.dli_fbase == own_base) return real;
    pthread_mutex_lock(&mu);
    void *t = pool_slot(real, symbol ? symbol : "?", lib, KIND_PROC, 1);
    pthread_mutex_unlock(&mu);
    if (t) return t;
    int e = export_of(real);                 /* pool full: the export's own trampoline, or none */
    return e >= 0 && dt_tramp[e] ? dt_tramp[e] : real;
}

static void record_request(int lib, int via, int api, const char *symbol, int version, uint64_t flags,
                           CUresult rc, int status, void *real)
{
    pthread_mutex_lock(&mu);
    if (nreqs == reqs_cap) {
        size_t cap = reqs_cap ? 2 * reqs_cap : 1024;
        struct request *r = cap <= 1u << 20 ? realloc(reqs, cap * sizeof(*r)) : NULL;
        if (!r) { pthread_mutex_unlock(&mu); return; }
        reqs = r, reqs_cap = cap;
    }
    reqs[nreqs++] = (struct request){lib, via, api, version, rc, status, rc == 0 ? export_of(real) : -1, flags,
                                     strdup(symbol ? symbol : "(null)")};
    pthread_mutex_unlock(&mu);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, uint64_t flags,
                                    int *symbolStatus)
{
    void *ret = __builtin_return_address(0);
    pthread_once(&once, init);
    count_wrapped(idx_gpa2, ret);
    if (!real_gpa2) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real_gpa2(symbol, pfn, cudaVersion, flags, symbolStatus);
    int lib = lib_of(ret), via = via_of(lib);
    void *real = rc == 0 && pfn ? *pfn : NULL;
    record_request(lib, via, 2, symbol, cudaVersion, flags, rc, symbolStatus ? *symbolStatus : -1, real);
    if (real) *pfn = wrap_pointer(real, symbol, lib);
    return rc;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, uint64_t flags)
{
    void *ret = __builtin_return_address(0);
    pthread_once(&once, init);
    count_wrapped(idx_gpa1, ret);
    if (!real_gpa1) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real_gpa1(symbol, pfn, cudaVersion, flags);
    int lib = lib_of(ret), via = via_of(lib);
    void *real = rc == 0 && pfn ? *pfn : NULL;
    record_request(lib, via, 1, symbol, cudaVersion, flags, rc, -1, real);
    if (real) *pfn = wrap_pointer(real, symbol, lib);
    return rc;
}

static int in_real(uintptr_t p, size_t len, int want_exec)
{
    for (int i = 0; i < nreal_seg; i++)
        if (p >= real_seg[i].lo && p + len <= real_seg[i].hi && (!want_exec || real_seg[i].exec)) return 1;
    return 0;
}

/* A copy of an export table whose code pointers into the real library are pool trampolines (mu held).
 * A first word of 16..4096 that is a multiple of 8 is taken as the table's size in bytes; otherwise
 * the table runs while its words are code pointers into the real library (at most 128). */
static const void *wrap_table(const void *table, const CUuuid *id, int *nwrapped)
{
    for (size_t i = 0; i < ntcopies; i++)
        if (tcopies[i].orig == table) { *nwrapped = tcopies[i].wrapped; return tcopies[i].copy; }
    const uintptr_t *w = table;
    if (ntcopies >= MAXTABLES || !in_real((uintptr_t)table, 8, 0)) return table;
    size_t n;
    if (w[0] >= 16 && w[0] <= 4096 && w[0] % 8 == 0 && in_real((uintptr_t)table, w[0], 0)) n = w[0] / 8;
    else for (n = 0; n < 128 && in_real((uintptr_t)(w + n), 8, 0) && in_real(w[n], 1, 1); n++) {}
    uintptr_t *copy = malloc(n * 8 + 8);
    if (!copy || n == 0) { free(copy); return table; }
    memcpy(copy, w, n * 8);
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in_real(w[i], 1, 1)) continue;
        char name[64];
        snprintf(name, sizeof name, "%02x%02x%02x%02x[%zu]", id->bytes[0], id->bytes[1], id->bytes[2],
                 id->bytes[3], i);
        void *t = pool_slot((void *)w[i], name, -1, KIND_TABLE, 0);
        if (t) { copy[i] = (uintptr_t)t; k++; }
    }
    tcopies[ntcopies++] = (struct table_copy){table, copy, k};
    *nwrapped = k;
    return copy;
}

EXPORT CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    void *ret = __builtin_return_address(0);
    pthread_once(&once, init);
    count_wrapped(idx_table, ret);
    if (!real_get_table) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real_get_table(ppExportTable, pExportTableId);
    int lib = lib_of(ret), via = via_of(lib), wrapped = 0;
    const void *table = rc == 0 && ppExportTable ? *ppExportTable : NULL;
    pthread_mutex_lock(&mu);
    if (table && wrap_tables && pExportTableId) *ppExportTable = wrap_table(table, pExportTableId, &wrapped);
    if (ntreqs < sizeof treqs / sizeof treqs[0]) {
        struct table_req *t = &treqs[ntreqs++];
        *t = (struct table_req){lib, via, rc, {{0}}, table, 0, wrapped};
        if (pExportTableId) t->uuid = *pExportTableId;
        if (table && in_real((uintptr_t)table, 8, 0)) t->size_hint = *(const uint64_t *)table;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int driver_trace_snapshot(const char *label)
{
    pthread_once(&once, init);
    size_t n = dt_nexports + dt_pool;
    unsigned long *c = malloc(n * sizeof(*c));
    if (!c) return -1;
    for (size_t i = 0; i < n; i++) c[i] = __atomic_load_n(&dt_counts[i], __ATOMIC_RELAXED);
    pthread_mutex_lock(&mu);
    int k = nsnaps < MAXSNAPS ? nsnaps++ : -1;
    if (k >= 0) {
        snprintf(snaps[k].label, sizeof snaps[k].label, "%s", label ? label : "");
        snaps[k].counts = c;
    }
    pthread_mutex_unlock(&mu);
    if (k < 0) free(c);
    return k;
}

/* ---- the JSON written at exit ---- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* Named at the end: a library met before init finished (the real one's constructor) is known then. */
static void json_lib(FILE *f, int id)
{
    if (id < 0 || id >= MAXLIBS || !lib_name[id]) fputs("null", f);
    else if (lib_base[id] && lib_base[id] == real_base) fputs("\"(real libcuda)\"", f);
    else if (lib_base[id] && lib_base[id] == own_base) fputs("\"(tracer)\"", f);
    else json_str(f, lib_name[id]);
}

static const char *slot_name(size_t s)
{
    if (s < dt_nexports) return dt_names[s];
    const struct slot *m = &pool_meta[s - dt_nexports];
    return m->export_idx >= 0 ? dt_names[m->export_idx] : m->name;
}

static int needs_libcuda(struct dl_phdr_info *info)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
        const ElfW(Dyn) *d = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        uintptr_t strtab = 0;
        for (const ElfW(Dyn) *x = d; x->d_tag != DT_NULL; x++)
            if (x->d_tag == DT_STRTAB) strtab = x->d_un.d_ptr;
        if (!strtab) return 0;
        if (strtab < info->dlpi_addr) strtab += info->dlpi_addr;  /* not relocated by ld.so */
        for (const ElfW(Dyn) *x = d; x->d_tag != DT_NULL; x++)
            if (x->d_tag == DT_NEEDED && !strcmp((const char *)strtab + x->d_un.d_val, "libcuda.so.1")) return 1;
    }
    return 0;
}

struct loaded_state { FILE *f; int n; };

static int loaded_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct loaded_state *st = data;
    FILE *f = st->f;
    (void)size;
    char exe[4096] = "(main program)";
    const char *name = info->dlpi_name;
    if (!name || !*name) {
        if (st->n) return 0;   /* the vDSO; the main program comes first */
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) exe[n] = 0;
        name = exe;
    }
    fputs(st->n++ ? ",\n  " : "\n  ", f);
    fputs("{\"path\": ", f);
    json_str(f, name);
    fprintf(f, ", \"needs_libcuda\": %s}", needs_libcuda(info) ? "true" : "false");
    return 0;
}

static void dump(void)
{
    char path[4096], tmp[4200], cmd[2048] = "";
    const char *pat = getenv("DRIVER_TRACE_OUT");
    if (!pat || !*pat) pat = "driver_trace.%p.json";
    size_t o = 0;
    for (const char *p = pat; *p && o < sizeof path - 24; p++) {
        if (p[0] == '%' && p[1] == 'p') { o += (size_t)snprintf(path + o, 24, "%d", (int)getpid()); p++; }
        else path[o++] = *p;
    }
    path[o] = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *c = fopen("/proc/self/cmdline", "r");
    if (c) {
        size_t n = fread(cmd, 1, sizeof cmd - 1, c);
        fclose(c);
        for (size_t i = 0; i + 1 < n; i++) if (!cmd[i]) cmd[i] = ' ';
        cmd[n] = 0;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) { fprintf(stderr, "driver_trace: cannot write %s\n", tmp); return; }
    pthread_mutex_lock(&mu);
    size_t total = dt_nexports + pool_used;
    unsigned long ncalls = 0;
    fprintf(f, "{\"tracer\": 1, \"pid\": %d, \"forked_from\": %d, \"cmdline\": ", (int)getpid(), (int)forked_from);
    json_str(f, cmd);
    fputs(", \"real\": ", f);
    json_str(f, dt_real_path);
    fprintf(f, ", \"exports\": %zu, \"pool_size\": %zu, \"pool_used\": %zu, \"pool_exhausted\": %lu,"
               " \"wrap_tables\": %s, \"caller_sampling\": \"first 64 calls and every 1024th per slot\",\n",
            dt_nexports, dt_pool, pool_used, pool_exhausted, wrap_tables ? "true" : "false");
    fputs("\"calls\": [", f);
    int first = 1;
    for (size_t s = 0; s < total; s++) {
        unsigned long n = __atomic_load_n(&dt_counts[s], __ATOMIC_RELAXED);
        if (!n) continue;
        ncalls += n;
        const struct slot *m = s < dt_nexports ? NULL : &pool_meta[s - dt_nexports];
        static const char *kinds[] = {"export", "proc_address", "export_table"};
        fputs(first ? "\n  {\"fn\": " : ",\n  {\"fn\": ", f);
        first = 0;
        json_str(f, slot_name(s));
        fprintf(f, ", \"through\": \"%s\", \"calls\": %lu, \"requested\": ", kinds[m ? m->kind : KIND_EXPORT], n);
        if (m) json_str(f, m->name); else fputs("null", f);
        fputs(", \"requested_by\": ", f);
        json_lib(f, m ? m->lib : -1);
        fputs(", \"callers\": {", f);
        const struct callers *cl = &callers[s];
        for (int k = 0; k < NCALLERS && cl->n[k]; k++) {
            if (k) fputs(", ", f);
            json_lib(f, cl->lib[k]);
            fprintf(f, ": %u", cl->n[k]);
        }
        fprintf(f, "}, \"callers_other\": %u}", cl->other);
    }
    fprintf(f, "],\n\"total_calls\": %lu,\n\"first_use\": [", ncalls);
    for (size_t i = 0; i < norder; i++) {
        if (i) fputs(", ", f);
        json_str(f, slot_name(order[i]));
    }
    fputs("],\n\"snapshots\": [", f);
    for (int k = 0; k < nsnaps; k++) {
        fputs(k ? ",\n  {\"label\": " : "\n  {\"label\": ", f);
        json_str(f, snaps[k].label);
        fputs(", \"calls\": [", f);
        int any = 0;
        for (size_t s = 0; s < total; s++) {
            if (!snaps[k].counts[s]) continue;
            fputs(any++ ? ", [" : "[", f);
            json_str(f, slot_name(s));
            fprintf(f, ", %lu]", snaps[k].counts[s]);
        }
        fputs("]}", f);
    }
    fputs("],\n\"proc_address\": [", f);
    for (size_t i = 0; i < nreqs; i++) {
        const struct request *r = &reqs[i];
        fputs(i ? ",\n  {\"lib\": " : "\n  {\"lib\": ", f);
        json_lib(f, r->lib);
        fputs(", \"via\": ", f);
        json_lib(f, r->via);
        fputs(", \"symbol\": ", f);
        json_str(f, r->symbol);
        fprintf(f, ", \"api\": %d, \"version\": %d, \"flags\": %llu, \"rc\": %d, \"status\": %d, \"resolved\": ",
                r->api, r->version, (unsigned long long)r->flags, r->rc, r->status);
        if (r->resolved >= 0) json_str(f, dt_names[r->resolved]); else fputs("null", f);
        fputc('}', f);
    }
    fputs("],\n\"export_tables\": [", f);
    for (size_t i = 0; i < ntreqs; i++) {
        const struct table_req *t = &treqs[i];
        fputs(i ? ",\n  {\"lib\": " : "\n  {\"lib\": ", f);
        json_lib(f, t->lib);
        fputs(", \"via\": ", f);
        json_lib(f, t->via);
        fputs(", \"uuid\": \"", f);
        for (int b = 0; b < 16; b++) fprintf(f, "%02x", t->uuid.bytes[b]);
        fprintf(f, "\", \"rc\": %d, \"table\": \"%p\", \"first_word\": %llu, \"entries_wrapped\": %d}", t->rc,
                t->table, (unsigned long long)t->size_hint, t->wrapped);
    }
    pthread_mutex_unlock(&mu);
    struct loaded_state st = {f, 0};   /* outside mu: dl_iterate_phdr takes the loader's lock */
    fputs("],\n\"loaded\": [", f);
    dl_iterate_phdr(loaded_cb, &st);
    fputs("]}\n", f);
    if (fclose(f) == 0 && rename(tmp, path) == 0) {
        if (!quiet) fprintf(stderr, "driver_trace: %lu driver calls, %zu cuGetProcAddress requests -> %s\n",
                            ncalls, nreqs, path);
    } else {
        fprintf(stderr, "driver_trace: cannot write %s\n", path);
    }
}

__attribute__((destructor)) static void dt_dtor(void) { dump(); }
