/* A fake libcuda.so.1 for tests/unit/test_driver_trace.py: a few exports (one with stack and
 * floating-point arguments), cuGetProcAddress(_v2) that also hands out a function it does not export,
 * and an export table {size, f0, f1} under a UUID starting 0xab. Build with -Wl,-Bsymbolic like the
 * real driver (its own references bind inside it). Its constructor calls cuDriverGetVersion of the
 * libcuda.so.1 already loaded, i.e. the tracer's, before the tracer has finished loading it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
typedef struct { unsigned char bytes[16]; } CUuuid;
int cuInit(unsigned flags) { return flags == 0 ? 0 : 1; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
/* 8 integer arguments (two on the stack) and two doubles */
long cuMix(long a, long b, long c, long d, long e, long f, long g, long h, double x, double y)
{ return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + (long)(x * 10) + (long)(y * 100); }
int cuMemAlloc_v2(uint64_t *p, size_t n) { *p = 0x1000 + n; return 0; }
int cuMemAlloc(unsigned *p, unsigned n) { *p = n; return 0; }
__attribute__((visibility("hidden"))) int cuSecret(void) { return 1; }   /* not exported */
int cuDataObject = 5;                                                      /* not a function */
static int hidden_fn(int x) { return x * 3; }
static int table_fn0(int x) { return x + 100; }
static int table_fn1(int x) { return x + 200; }
static const struct { size_t size; int (*f0)(int); int (*f1)(int); } table = {sizeof table, table_fn0, table_fn1};
int cuGetExportTable(const void **pp, const CUuuid *id)
{ if (id->bytes[0] != 0xab) return 500; *pp = &table; return 0; }
int cuGetProcAddress_v2(const char *, void **, int, uint64_t, int *);
static int lookup(const char *s, void **pfn, int *st)
{
    static const struct { const char *n; void *p; } t[] = {
        {"cuInit", (void *)cuInit}, {"cuMemAlloc", (void *)cuMemAlloc_v2}, {"cuHidden", (void *)hidden_fn},
        {"cuMix", (void *)cuMix}, {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
        {"cuGetExportTable", (void *)cuGetExportTable}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].n)) { *pfn = t[i].p; if (st) *st = 0; return 0; }
    *pfn = NULL; if (st) *st = 1; return 500;
}
int cuGetProcAddress_v2(const char *s, void **pfn, int v, uint64_t f, int *st) { (void)v; (void)f; return lookup(s, pfn, st); }
int cuGetProcAddress(const char *s, void **pfn, int v, uint64_t f) { (void)v; (void)f; return lookup(s, pfn, NULL); }

__attribute__((constructor)) static void fake_ctor(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*ver)(int *) = h ? (int (*)(int *))dlsym(h, "cuDriverGetVersion") : NULL;
    int v = 0;
    if (ver && (ver(&v) != 0 || v != 13000)) __builtin_trap();
}
