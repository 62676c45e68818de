/* Fatbins and kernels the program registers (nvcc's static constructors), and their lazy
 * resolution in the daemon: an image is uploaded and loaded (once per session and device) the
 * first time one of its kernels launches or one of its variables is used (api_symbols.c) on
 * that device, and each kernel's function handle is fetched once per device (its parameter
 * layout, the same everywhere, is kept from the first). Registration never talks to the
 * daemon, so programs start even before pilotd is reachable. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

#define FATBIN_WRAPPER_MAGIC 0x466243B1u
#define FATBIN_MAGIC 0xBA55ED50u
#define BUCKETS 1024u

struct fatbin_wrapper {
    int magic;
    int version;
    const unsigned long long *data;
    void *filename_or_fatbins;
};

struct fatbin_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t fat_size;
};

/* A __managed__ variable: the program reaches it through *host_ptr, which nvcc's code reads
 * after __cudaInitModule; we fill it in when the image's module is loaded. */
struct managed_var {
    void **host_ptr;
    char *name;
    struct managed_var *next;
};

struct pilot_image {
    const void *data;
    size_t size;
    int driver;      /* loaded by the driver API (cuModuleLoadData): data is our own copy */
    uint64_t module[PILOT_MAX_DEVICES]; /* daemon handle per device, 0 until loaded */
    int dead;        /* unregistered (library unloaded) */
    struct managed_var *managed; /* registered __managed__ variables */
    struct pilot_image *next; /* every image ever registered (g_images) */
};

struct pilot_kernel {
    const void *host_fun;
    struct pilot_image *image;
    char *name;
    int resolved[PILOT_MAX_DEVICES];
    uint64_t function[PILOT_MAX_DEVICES];
    int32_t max_dynamic_shared_bytes[PILOT_MAX_DEVICES];
    uint32_t nparams, arg_bytes; /* the layout, the same on every device (params set once) */
    pilot_param_info *params;
    int32_t max_threads_per_block;
    /* cudaFuncSetAttribute values the daemon accepted, per device, for the function handle
     * they were set on (a new handle after a reset starts afresh) */
    uint64_t attr_function[PILOT_MAX_DEVICES];
    uint32_t attr_known[PILOT_MAX_DEVICES];
    int32_t attr_value[PILOT_MAX_DEVICES][PILOT_KERNEL_ATTRS];
    /* occupancy answers for that handle (cleared with the attributes: a carveout or shared
     * memory maximum changes them); entry i is valid when occ_function[dev][i] is the handle */
    struct occupancy_answer {
        uint64_t function, value, result;
        int32_t block_size;
        uint32_t flags;
    } occupancy[PILOT_MAX_DEVICES][PILOT_OCCUPANCY_CACHE];
    uint32_t occupancy_next[PILOT_MAX_DEVICES];
    struct pilot_kernel *next_by_host, *next_by_handle;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_load_lock = PTHREAD_MUTEX_INITIALIZER; /* one MODULE_LOAD per image */
static struct pilot_image *g_images;
static struct pilot_kernel *g_by_host[BUCKETS];
static struct pilot_kernel *g_by_handle[BUCKETS];

static unsigned bucket(const void *p)
{
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ull;
    return (unsigned)(x >> 40) % BUCKETS;
}

PILOT_EXPORT void **__cudaRegisterFatBinary(void *fat_cubin)
{
    const struct fatbin_wrapper *w = fat_cubin;
    struct pilot_image *img = calloc(1, sizeof *img);
    if (!img)
        return NULL;
    if (w && (unsigned)w->magic == FATBIN_WRAPPER_MAGIC && w->data) {
        const struct fatbin_header *h = (const void *)w->data;
        if (h->magic == FATBIN_MAGIC) {
            img->data = h;
            img->size = h->header_size + h->fat_size;
        }
    }
    if (!img->data)
        LOG_WARN("unrecognised fatbin wrapper at %p; its kernels cannot launch", fat_cubin);
    pthread_mutex_lock(&g_lock);
    img->next = g_images;
    g_images = img;
    pthread_mutex_unlock(&g_lock);
    return (void **)img;
}

PILOT_EXPORT void __cudaRegisterFatBinaryEnd(void **handle)
{
    (void)handle;
}

PILOT_EXPORT void __cudaRegisterManagedVar(void **handle, void **host_ptr, char *device_address,
                                           const char *device_name, int ext, size_t size,
                                           int constant, int global)
{
    (void)device_address, (void)ext, (void)size, (void)constant, (void)global;
    struct pilot_image *img = (struct pilot_image *)handle;
    struct managed_var *v = calloc(1, sizeof *v);
    if (!img || !v || !host_ptr || !device_name) {
        free(v);
        return;
    }
    v->host_ptr = host_ptr;
    v->name = strdup(device_name);
    pthread_mutex_lock(&g_lock);
    v->next = img->managed;
    img->managed = v;
    pthread_mutex_unlock(&g_lock);
}

/* nvcc's host code calls this before its first use of a __managed__ variable of the image: load
 * the module, which binds the variables' host pointers. */
PILOT_EXPORT char __cudaInitModule(void **handle)
{
    struct pilot_image *img = (struct pilot_image *)handle;
    uint64_t module;
    if (!img || !img->managed)
        return 1;
    cudaError_t err = pilot_ensure_session();
    if (err == cudaSuccess) {
        int previous = pilot_route_begin(0); /* where the variables are bound */
        err = pilot_image_module(img, &module);
        pilot_route_end(previous);
    }
    if (err) {
        fprintf(stderr, "pilot: cannot set up the __managed__ variables of this program (%s)\n",
                pilot_error_name(err) ? pilot_error_name(err) : "error");
        return 0;
    }
    return 1;
}

PILOT_EXPORT void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun,
                                         const char *device_name, int thread_limit, void *tid,
                                         void *bid, void *bdim, void *gdim, int *wsize)
{
    (void)device_fun, (void)thread_limit, (void)tid, (void)bid, (void)bdim, (void)gdim, (void)wsize;
    struct pilot_kernel *k = calloc(1, sizeof *k);
    if (!k || !device_name)
        return;
    k->host_fun = host_fun;
    k->image = (struct pilot_image *)handle;
    k->name = strdup(device_name);
    pthread_mutex_lock(&g_lock);
    unsigned b = bucket(host_fun);
    k->next_by_host = g_by_host[b];
    g_by_host[b] = k;
    b = bucket(k);
    k->next_by_handle = g_by_handle[b];
    g_by_handle[b] = k;
    pthread_mutex_unlock(&g_lock);
}

static void unlink_image_kernels(struct pilot_kernel **table, struct pilot_image *img, int by_host)
{
    for (unsigned b = 0; b < BUCKETS; b++) {
        struct pilot_kernel **pp = &table[b];
        while (*pp) {
            struct pilot_kernel *k = *pp;
            if (k->image == img)
                *pp = by_host ? k->next_by_host : k->next_by_handle;
            else
                pp = by_host ? &k->next_by_host : &k->next_by_handle;
        }
    }
}

PILOT_EXPORT void __cudaUnregisterFatBinary(void **handle)
{
    struct pilot_image *img = (struct pilot_image *)handle;
    if (!img)
        return;
    /* A library being unloaded: its host stubs may be reused by the next one, so forget its
     * kernels. The records themselves are leaked on purpose: another thread may hold one. The
     * daemon releases the module with the session. */
    pthread_mutex_lock(&g_lock);
    img->dead = 1;
    unlink_image_kernels(g_by_host, img, 1);
    unlink_image_kernels(g_by_handle, img, 0);
    pthread_mutex_unlock(&g_lock);
    pilot_hooks_image_unregister(img); /* api_symbols.c forgets its variables */
}

struct pilot_kernel *pilot_kernel_from_host(const void *host_fun)
{
    pthread_mutex_lock(&g_lock);
    struct pilot_kernel *k = g_by_host[bucket(host_fun)];
    while (k && k->host_fun != host_fun)
        k = k->next_by_host;
    pthread_mutex_unlock(&g_lock);
    return k;
}

struct pilot_kernel *pilot_kernel_from_handle(const void *handle)
{
    pthread_mutex_lock(&g_lock);
    struct pilot_kernel *k = g_by_handle[bucket(handle)];
    while (k && (const void *)k != handle)
        k = k->next_by_handle;
    pthread_mutex_unlock(&g_lock);
    return k;
}

const char *pilot_kernel_name(const struct pilot_kernel *k)
{
    return k->name;
}

PILOT_EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *out, const void *host_fun)
{
    struct pilot_kernel *k = pilot_kernel_from_host(host_fun);
    if (!out)
        PILOT_RETURN(cudaErrorInvalidValue);
    *out = (cudaKernel_t)k;
    PILOT_RETURN(k ? cudaSuccess : cudaErrorInvalidDeviceFunction);
}

/* The public cudaGetKernel is the same lookup. */
PILOT_EXPORT cudaError_t cudaGetKernel(cudaKernel_t *out, const void *host_fun)
{
    return __cudaGetKernel(out, host_fun);
}

/* The image's module in the daemon, loaded on first use: the one path kernels and variables
 * take, so both see the same module (and the same globals). */
cudaError_t pilot_image_module(struct pilot_image *img, uint64_t *module)
{
    const int dev = pilot_route_device();
    uint64_t loaded = __atomic_load_n(&img->module[dev], __ATOMIC_ACQUIRE);
    if (loaded) {
        *module = loaded;
        return cudaSuccess;
    }
    pthread_mutex_lock(&g_load_lock);
    cudaError_t err = cudaSuccess;
    if (!img->module[dev]) {
        if (!img->data || img->dead) {
            err = cudaErrorInvalidKernelImage;
        } else {
            pilot_req_module_load req = {.image_size = img->size};
            pilot_rep_u64 rep;
            err = pilot_call(PILOT_OP_MODULE_LOAD, &req, sizeof req, img->data, img->size, &rep,
                             sizeof rep, NULL, 0, NULL);
            if (err == cudaSuccess) {
                __atomic_store_n(&img->module[dev], rep.value, __ATOMIC_RELEASE);
                /* __managed__ variables live in device 0's module (unified memory is kept
                 * coherent through the session's part 0): bound once, there. */
                for (struct managed_var *v = img->managed; dev == 0 && v; v = v->next) {
                    cudaError_t e = pilot_hooks_managed_variable(rep.value, v->name, v->host_ptr);
                    err = err ? err : e;
                }
            }
        }
    }
    *module = img->module[dev];
    pthread_mutex_unlock(&g_load_lock);
    return err;
}

cudaError_t pilot_kernel_resolve(struct pilot_kernel *k, int dev)
{
    static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
    if (__atomic_load_n(&k->resolved[dev], __ATOMIC_ACQUIRE))
        return cudaSuccess;
    pthread_mutex_lock(&resolve_lock);
    cudaError_t err = cudaSuccess;
    if (!k->resolved[dev]) {
        int previous = pilot_route_begin(dev); /* the image and the function on dev's part */
        uint64_t module = 0;
        err = pilot_image_module(k->image, &module);
        if (err == cudaSuccess) {
            pilot_req_function_get req = {.module = module};
            pilot_rep_function rep;
            size_t cap = PILOT_MAX_PARAMS * sizeof(pilot_param_info), got = 0;
            pilot_param_info *params = malloc(cap);
            if (!params) {
                err = cudaErrorMemoryAllocation;
            } else {
                err = pilot_call(PILOT_OP_FUNCTION_GET, &req, sizeof req, k->name, strlen(k->name),
                                 &rep, sizeof rep, params, cap, &got);
                if (err == cudaSuccess && got != rep.nparams * sizeof(pilot_param_info))
                    err = cudaErrorInvalidDeviceFunction;
            }
            if (err == cudaSuccess) {
                if (!k->params) { /* kept from then on: launches on other threads read it */
                    k->params = params;
                    k->nparams = rep.nparams;
                    k->arg_bytes = rep.arg_bytes;
                    k->max_threads_per_block = rep.max_threads_per_block;
                } else {
                    free(params);
                }
                k->function[dev] = rep.function;
                k->max_dynamic_shared_bytes[dev] = rep.max_dynamic_shared_bytes;
                k->attr_known[dev] = 0; /* a function of its own: nothing set on it yet */
                memset(k->occupancy[dev], 0, sizeof k->occupancy[dev]);
                __atomic_store_n(&k->resolved[dev], 1, __ATOMIC_RELEASE);
            } else {
                free(params);
                LOG_WARN("kernel %s: cannot resolve in pilotd (%s)", k->name, cudaGetErrorName(err));
            }
        }
        pilot_route_end(previous);
    }
    pthread_mutex_unlock(&resolve_lock);
    return err;
}

void pilot_kernel_info(const struct pilot_kernel *k, int dev, struct pilot_kernel_launch_info *out)
{
    out->function = k->function[dev];
    out->nparams = k->nparams;
    out->arg_bytes = k->arg_bytes;
    out->params = k->params;
    out->max_threads_per_block = k->max_threads_per_block;
    out->max_dynamic_shared_bytes = __atomic_load_n(&k->max_dynamic_shared_bytes[dev], __ATOMIC_RELAXED);
}

static void forget_table(struct pilot_kernel **table)
{
    for (unsigned b = 0; b < BUCKETS; b++)
        for (struct pilot_kernel *k = table[b]; k; k = k->next_by_host) {
            memset(k->resolved, 0, sizeof k->resolved); /* images are reset through g_images */
            memset(k->function, 0, sizeof k->function);
            memset(k->attr_known, 0, sizeof k->attr_known);
            memset(k->occupancy, 0, sizeof k->occupancy);
        }
}

/* After fork: nothing is loaded in the child's session (api_symbols.c forgets its own). */
static void fork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
    pthread_mutex_init(&g_load_lock, NULL);
    forget_table(g_by_host);
    for (struct pilot_image *img = g_images; img; img = img->next)
        memset(img->module, 0, sizeof img->module); /* images with variables and no kernels too */
}

/* A small program's images are loaded, and its kernels resolved, in pilotd as soon as its
 * session is up, not at each kernel's first launch (issue 28: the first kernel of a fresh
 * process paid ~0.85 ms of MODULE_LOAD and FUNCTION_GET on an H100, against a first launch of
 * ~0.4 ms natively). A framework's hundreds of images stay lazy, as the driver keeps them.
 * Best effort: what fails here is tried again, and reported, at first use. PILOT_PRELOAD=0
 * turns it off. */
#define PRELOAD_MAX_IMAGES 8
#define PRELOAD_MAX_BYTES (8u << 20)
#define PRELOAD_MAX_KERNELS 32

static void preload_small_program(void)
{
    const char *env = getenv("PILOT_PRELOAD");
    if (env && strcmp(env, "0") == 0)
        return;
    struct pilot_image *images[PRELOAD_MAX_IMAGES];
    struct pilot_kernel *kernels[PRELOAD_MAX_KERNELS];
    size_t nimages = 0, nkernels = 0, bytes = 0;
    int small = 1;
    pthread_mutex_lock(&g_lock);
    for (struct pilot_image *img = g_images; img && small; img = img->next) {
        if (img->driver || img->dead || !img->data)
            continue;
        bytes += img->size;
        small = nimages < PRELOAD_MAX_IMAGES && bytes <= PRELOAD_MAX_BYTES;
        if (small)
            images[nimages++] = img;
    }
    int few = 1; /* more kernels than that: the images are loaded, the kernels stay lazy */
    for (unsigned b = 0; b < BUCKETS && small && few; b++)
        for (struct pilot_kernel *k = g_by_host[b]; k && few; k = k->next_by_host) {
            if (k->image->dead)
                continue;
            few = nkernels < PRELOAD_MAX_KERNELS;
            if (few)
                kernels[nkernels++] = k;
        }
    if (!few)
        nkernels = 0;
    pthread_mutex_unlock(&g_lock);
    if (!small)
        return;
    const int dev = pilot_route_device();
    uint64_t module;
    for (size_t i = 0; i < nimages; i++)
        (void)pilot_image_module(images[i], &module);
    for (size_t i = 0; i < nkernels; i++)
        if (__atomic_load_n(&kernels[i]->image->module[dev], __ATOMIC_ACQUIRE))
            (void)pilot_kernel_resolve(kernels[i], dev);
}

PILOT_HOOK(registry, .on_fork_child = fork_child);

/* The preload runs once the session is up (transport.c's session-ready hooks). */
__attribute__((constructor)) static void register_preload(void)
{
    pilot_on_session_ready(preload_small_program);
}

int pilot_kernel_attr_is(struct pilot_kernel *k, uint64_t function, int attr, int32_t value)
{
    int dev = pilot_route_device(), same;
    if (attr < 0 || attr >= PILOT_KERNEL_ATTRS)
        return 0;
    pthread_mutex_lock(&g_lock);
    same = k->attr_function[dev] == function && (k->attr_known[dev] >> attr & 1) &&
           k->attr_value[dev][attr] == value;
    pthread_mutex_unlock(&g_lock);
    return same;
}

void pilot_kernel_attr_set(struct pilot_kernel *k, uint64_t function, int attr, int32_t value)
{
    int dev = pilot_route_device();
    if (attr < 0 || attr >= PILOT_KERNEL_ATTRS)
        return;
    pthread_mutex_lock(&g_lock);
    if (k->attr_function[dev] != function) {
        k->attr_function[dev] = function;
        k->attr_known[dev] = 0;
    }
    k->attr_known[dev] |= 1u << attr;
    k->attr_value[dev][attr] = value;
    memset(k->occupancy[dev], 0, sizeof k->occupancy[dev]);
    pthread_mutex_unlock(&g_lock);
}

int pilot_kernel_occupancy(struct pilot_kernel *k, uint64_t function, int32_t block_size,
                           uint64_t value, uint32_t flags, uint64_t *result)
{
    int dev = pilot_route_device(), found = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < PILOT_OCCUPANCY_CACHE && !found; i++) {
        const struct occupancy_answer *a = &k->occupancy[dev][i];
        if (a->function == function && function && a->block_size == block_size &&
            a->value == value && a->flags == flags) {
            *result = a->result;
            found = 1;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

void pilot_kernel_occupancy_answer(struct pilot_kernel *k, uint64_t function, int32_t block_size,
                                   uint64_t value, uint32_t flags, uint64_t result)
{
    int dev = pilot_route_device();
    pthread_mutex_lock(&g_lock);
    uint32_t i = k->occupancy_next[dev]++ % PILOT_OCCUPANCY_CACHE;
    k->occupancy[dev][i] = (struct occupancy_answer){function, value, result, block_size, flags};
    pthread_mutex_unlock(&g_lock);
}

void pilot_kernel_set_max_dynamic_shared(struct pilot_kernel *k, int32_t bytes)
{
    __atomic_store_n(&k->max_dynamic_shared_bytes[pilot_route_device()], bytes, __ATOMIC_RELAXED);
}

/* ---- modules of the driver API (libpilot-cuda.so, through driver_ops.c) ----
 * cuModuleLoadData's image becomes an image of this registry like a registered fatbin (its own
 * copy: the program may free its buffer), loaded at once on the context's device, so a bad
 * image fails the load as it does natively. Its functions are kernels found by handle only
 * (no host stub), so every launch path, cudaFuncGetAttributes and cudaLaunchKernel take them. */

cudaError_t pilot_module_load_image(const void *data, size_t size, int dev, struct pilot_image **out)
{
    struct pilot_image *img = calloc(1, sizeof *img);
    void *copy = malloc(size ? size : 1);
    if (!img || !copy) {
        free(img);
        free(copy);
        return cudaErrorMemoryAllocation;
    }
    memcpy(copy, data, size);
    img->data = copy;
    img->size = size;
    img->driver = 1;
    uint64_t module;
    int previous = pilot_route_begin(dev);
    cudaError_t err = pilot_image_module(img, &module);
    pilot_route_end(previous);
    if (err != cudaSuccess) {
        free(copy);
        free(img);
        return err;
    }
    pthread_mutex_lock(&g_lock);
    img->next = g_images;
    g_images = img;
    pthread_mutex_unlock(&g_lock);
    *out = img;
    return cudaSuccess;
}

int pilot_module_valid(const struct pilot_image *img)
{
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (struct pilot_image *i = g_images; i && !found; i = i->next)
        found = i == img && i->driver && !i->dead;
    pthread_mutex_unlock(&g_lock);
    return found;
}

cudaError_t pilot_module_unload(struct pilot_image *img)
{
    if (!pilot_module_valid(img))
        return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&g_lock);
    img->dead = 1;
    unlink_image_kernels(g_by_handle, img, 0); /* its functions are no handles any more */
    pthread_mutex_unlock(&g_lock);
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&g_load_lock);
    for (int dev = 0; dev < PILOT_MAX_DEVICES; dev++) {
        if (!img->module[dev])
            continue;
        pilot_req_handle req = {.handle = img->module[dev]};
        cudaError_t e = pilot_call_on(dev, PILOT_OP_MODULE_UNLOAD, &req, sizeof req, NULL, 0, NULL,
                                      0, NULL, 0, NULL);
        err = err ? err : e;
        img->module[dev] = 0;
    }
    pthread_mutex_unlock(&g_load_lock);
    return err; /* the record is leaked on purpose, as __cudaUnregisterFatBinary does */
}

cudaError_t pilot_module_function(struct pilot_image *img, const char *name, int dev,
                                  struct pilot_kernel **out)
{
    if (!pilot_module_valid(img))
        return cudaErrorInvalidResourceHandle;
    struct pilot_kernel *k = NULL;
    pthread_mutex_lock(&g_lock); /* one kernel per image and name, as one CUfunction natively */
    for (unsigned b = 0; b < BUCKETS && !k; b++)
        for (struct pilot_kernel *i = g_by_handle[b]; i && !k; i = i->next_by_handle)
            if (i->image == img && strcmp(i->name, name) == 0)
                k = i;
    pthread_mutex_unlock(&g_lock);
    int created = !k;
    if (created) {
        k = calloc(1, sizeof *k);
        if (!k || !(k->name = strdup(name))) {
            free(k);
            return cudaErrorMemoryAllocation;
        }
        k->image = img;
    }
    cudaError_t err = pilot_kernel_resolve(k, dev);
    if (err != cudaSuccess) {
        if (created) {
            free(k->name);
            free(k);
        }
        return err;
    }
    if (created) {
        pthread_mutex_lock(&g_lock);
        unsigned b = bucket(k);
        k->next_by_handle = g_by_handle[b];
        g_by_handle[b] = k;
        pthread_mutex_unlock(&g_lock);
    }
    *out = k;
    return cudaSuccess;
}

struct pilot_image *pilot_kernel_image(const struct pilot_kernel *k)
{
    return k->image;
}

cudaError_t pilot_module_global(struct pilot_image *img, const char *name, int dev,
                                uint64_t *ptr, uint64_t *size)
{
    if (!pilot_module_valid(img))
        return cudaErrorInvalidResourceHandle;
    int previous = pilot_route_begin(dev);
    uint64_t module = 0;
    cudaError_t err = pilot_image_module(img, &module);
    if (err == cudaSuccess) {
        pilot_req_symbol_get req = {.module = module};
        pilot_rep_u64 rep;
        err = pilot_call(PILOT_OP_SYMBOL_GET, &req, sizeof req, name, strlen(name), &rep,
                         sizeof rep, NULL, 0, NULL);
        if (err == cudaSuccess) {
            pilot_alloc_add_symbol(rep.value, rep.value2);
            *ptr = rep.value;
            *size = rep.value2;
        }
    }
    pilot_route_end(previous);
    return err;
}
