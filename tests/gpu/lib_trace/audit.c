/* An LD_AUDIT module that counts the calls a program makes into the CUDA math libraries
 * (cuBLAS, cuBLASLt, cuDNN, cuFFT, cuRAND, cuSPARSE, cuSOLVER, NCCL): which of their functions
 * PyTorch uses, the surface a library-level stand-in must carry (docs/design/frameworks.md,
 * section 6a). Standalone; build and use:
 *
 *   gcc -shared -fPIC -O2 -o audit.so audit.c
 *   LIB_TRACE_OUT=/tmp/trace.tsv LD_AUDIT=$PWD/audit.so python3 workload.py
 *
 * Every binding of a symbol defined in one of those libraries by an object outside them is
 * recorded (la_symbind64, also for objects bound at load time), with the library that asked for
 * it, and bound to a stub of its own that counts each call and jumps on: PyTorch's libraries are
 * bound at load (BIND_NOW), so an auditor's PLT hook (la_pltenter) never runs for them. A stub
 * uses only r11 (scratch in the x86-64 calling convention), so arguments pass untouched. (Calls
 * through GOT relocations that are not PLT slots, -fno-plt code, are not seen: the auditor's
 * binding hook does not run for them.) At
 * exit, LIB_TRACE_OUT gets one line per symbol: `defining library <TAB> symbol <TAB> calls <TAB>
 * first caller` (calls 0: bound, never called). LIB_TRACE_LIBS=prefix,... traces other
 * libraries. */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_SYMS 8192
#define MAX_OBJS 1024

struct sym {
    const char *name;
    unsigned lib, caller;
    unsigned long calls;
    uintptr_t target; /* the real function */
    unsigned char *stub;
};

static const char *g_objs[MAX_OBJS];
static unsigned g_nobjs;
static struct sym g_syms[MAX_SYMS];
static unsigned g_nsyms;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

#define STUB_BYTES 32
static unsigned char *g_stubs; /* MAX_SYMS stubs, executable */

/* movabs r11, &calls; lock inc qword [r11]; movabs r11, target; jmp r11 */
static unsigned char *make_stub(struct sym *s)
{
    if (!g_stubs) {
        void *p = mmap(NULL, (size_t)MAX_SYMS * STUB_BYTES, PROT_READ | PROT_WRITE | PROT_EXEC,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        g_stubs = p;
    }
    unsigned char *c = g_stubs + (size_t)(s - g_syms) * STUB_BYTES;
    uint64_t counter = (uintptr_t)&s->calls, target = s->target;
    c[0] = 0x49, c[1] = 0xbb;
    memcpy(c + 2, &counter, 8);
    c[10] = 0xf0, c[11] = 0x49, c[12] = 0xff, c[13] = 0x03;
    c[14] = 0x49, c[15] = 0xbb;
    memcpy(c + 16, &target, 8);
    c[24] = 0x41, c[25] = 0xff, c[26] = 0xe3;
    return c;
}


static const char *const TRACED[] = {"libcublas.so", "libcublasLt.so", "libcudnn", "libcufft",
                                     "libcurand", "libcusparse", "libcusolver", "libnccl"};

/* Whether the object at `path` is traced: its file name starts with one of TRACED, or with
 * one of the comma-separated prefixes of $LIB_TRACE_LIBS when that is set. */
static int traced(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *env = getenv("LIB_TRACE_LIBS");
    if (env && *env) {
        for (const char *p = env; *p;) {
            size_t n = strcspn(p, ",");
            if (n && strncmp(base, p, n) == 0)
                return 1;
            p += n + (p[n] == ',');
        }
        return 0;
    }
    for (size_t i = 0; i < sizeof TRACED / sizeof *TRACED; i++)
        if (strncmp(base, TRACED[i], strlen(TRACED[i])) == 0)
            return 1;
    return 0;
}

unsigned la_version(unsigned version)
{
    (void)version;
    return LAV_CURRENT;
}

/* cookie: index + 1 into g_objs, with bit 31 set for a traced library */
unsigned la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    (void)lmid;
    pthread_mutex_lock(&g_lock);
    unsigned i = g_nobjs < MAX_OBJS ? g_nobjs++ : MAX_OBJS - 1;
    g_objs[i] = strdup(map->l_name && *map->l_name ? map->l_name : "(main)");
    pthread_mutex_unlock(&g_lock);
    *cookie = (uintptr_t)(i + 1) | (traced(g_objs[i]) ? 0x80000000u : 0);
    return LA_FLG_BINDTO | LA_FLG_BINDFROM;
}

static struct sym *find_or_add(const char *name, unsigned lib, unsigned caller)
{
    for (unsigned i = 0; i < g_nsyms; i++)
        if (g_syms[i].lib == lib && strcmp(g_syms[i].name, name) == 0)
            return &g_syms[i];
    if (g_nsyms == MAX_SYMS)
        return NULL;
    struct sym *s = &g_syms[g_nsyms++];
    s->name = strdup(name);
    s->lib = lib;
    s->caller = caller;
    return s;
}

uintptr_t la_symbind64(Elf64_Sym *sym, unsigned ndx, uintptr_t *refcook, uintptr_t *defcook,
                       unsigned *flags, const char *symname)
{
    (void)ndx;
    unsigned def = (unsigned)*defcook, ref = (unsigned)*refcook;
    *flags |= LA_SYMB_NOPLTENTER | LA_SYMB_NOPLTEXIT;
    if (!(def & 0x80000000u) || (ref & 0x80000000u) ||
        (ELF64_ST_TYPE(sym->st_info) != STT_FUNC && ELF64_ST_TYPE(sym->st_info) != STT_GNU_IFUNC))
        return sym->st_value;
    uintptr_t bound = sym->st_value;
    pthread_mutex_lock(&g_lock);
    struct sym *s = find_or_add(symname, (def & 0x7fffffffu) - 1, (ref & 0x7fffffffu) - 1);
    if (s && !s->stub) {
        s->target = sym->st_value;
        s->stub = make_stub(s);
    }
    if (s && s->stub && s->target == sym->st_value)
        bound = (uintptr_t)s->stub;
    pthread_mutex_unlock(&g_lock);
    return bound;
}

static void __attribute__((destructor)) dump(void)
{
    const char *out = getenv("LIB_TRACE_OUT");
    FILE *f = out ? fopen(out, "a") : NULL;
    if (!f)
        return;
    pthread_mutex_lock(&g_lock);
    for (unsigned i = 0; i < g_nsyms; i++) {
        const char *lib = strrchr(g_objs[g_syms[i].lib], '/');
        const char *caller = strrchr(g_objs[g_syms[i].caller & 0x7fffffffu], '/');
        fprintf(f, "%s\t%s\t%lu\t%s\n", lib ? lib + 1 : g_objs[g_syms[i].lib], g_syms[i].name,
                g_syms[i].calls, caller ? caller + 1 : g_objs[g_syms[i].caller & 0x7fffffffu]);
    }
    pthread_mutex_unlock(&g_lock);
    fclose(f);
}
