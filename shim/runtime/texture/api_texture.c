/* Texture and surface objects (cudaCreateTextureObject, cudaCreateSurfaceObject, ...).
 *
 * Kernels use the object's value, so it is the driver's own cudaTextureObject_t; the daemon
 * creates it for a resource of the session (one of its arrays, or a range of its memory),
 * records it as the session's, refuses to destroy objects of others and destroys the session's
 * at its end. The shim keeps the descriptors each object was made from, for the
 * cudaGet*ObjectResourceDesc / TextureDesc / ResourceViewDesc queries, and the device it is on. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shim.h"
#include "hooks.h"

struct object_rec {
    uint64_t handle;
    int surface;
    int device;
    int has_view;
    struct cudaResourceDesc res;
    struct cudaTextureDesc tex;
    struct cudaResourceViewDesc view;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct object_rec *g_objects;
static size_t g_count, g_cap;

static long find_locked(uint64_t handle, int surface)
{
    for (size_t i = 0; i < g_count; i++)
        if (g_objects[i].handle == handle && g_objects[i].surface == surface)
            return (long)i;
    return -1;
}

static int lookup(uint64_t handle, int surface, struct object_rec *out)
{
    pthread_mutex_lock(&g_lock);
    long i = find_locked(handle, surface);
    if (i >= 0)
        *out = g_objects[i];
    pthread_mutex_unlock(&g_lock);
    return i >= 0;
}

static int remember(const struct object_rec *rec)
{
    pthread_mutex_lock(&g_lock);
    if (g_count == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 16;
        struct object_rec *grown = realloc(g_objects, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&g_lock);
            return 0;
        }
        g_objects = grown;
        g_cap = cap;
    }
    g_objects[g_count++] = *rec;
    pthread_mutex_unlock(&g_lock);
    return 1;
}

static void forget(uint64_t handle, int surface)
{
    pthread_mutex_lock(&g_lock);
    long i = find_locked(handle, surface);
    if (i >= 0)
        g_objects[i] = g_objects[--g_count];
    pthread_mutex_unlock(&g_lock);
}

static void clear_device(int device)
{
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_count;)
        if (g_objects[i].device == device)
            g_objects[i] = g_objects[--g_count];
        else
            i++;
    pthread_mutex_unlock(&g_lock);
}

static void fork_child(void)
{
    g_count = 0; /* the parent's objects are its session's */
    pthread_mutex_init(&g_lock, NULL);
}

static pilot_channel_desc wire_desc(struct cudaChannelFormatDesc d)
{
    return (pilot_channel_desc){.x = d.x, .y = d.y, .z = d.z, .w = d.w, .f = (int32_t)d.f};
}

/* The resource on the wire, and the device the object goes to (the array's, the memory's). */
static cudaError_t wire_resource(const struct cudaResourceDesc *r, pilot_resource *w, int *device)
{
    memset(w, 0, sizeof *w);
    w->type = (uint32_t)r->resType;
    w->flags = r->flags;
    *device = pilot_current_device();
    switch (r->resType) {
    case cudaResourceTypeArray: {
        if (!r->res.array.array)
            return cudaErrorInvalidValue;
        w->array = (uintptr_t)r->res.array.array;
        int dev = pilot_handle_device(w->array);
        if (dev >= pilot_device_count())
            return cudaErrorInvalidResourceHandle;
        *device = dev;
        return cudaSuccess;
    }
    case cudaResourceTypeLinear:
        w->ptr = (uintptr_t)r->res.linear.devPtr;
        w->size = r->res.linear.sizeInBytes;
        w->desc = wire_desc(r->res.linear.desc);
        break;
    case cudaResourceTypePitch2D:
        w->ptr = (uintptr_t)r->res.pitch2D.devPtr;
        w->width = r->res.pitch2D.width;
        w->height = r->res.pitch2D.height;
        w->pitch = r->res.pitch2D.pitchInBytes;
        w->desc = wire_desc(r->res.pitch2D.desc);
        break;
    case cudaResourceTypeMipmappedArray:
        pilot_log_unsupported("cudaCreateTextureObject (mipmapped arrays)");
        return cudaErrorNotSupported;
    default:
        return cudaErrorInvalidValue;
    }
    if (!w->ptr)
        return cudaErrorInvalidValue;
    int dev = pilot_alloc_device(w->ptr);
    if (dev >= 0)
        *device = dev;
    return cudaSuccess;
}

static void wire_texture(const struct cudaTextureDesc *t, pilot_texture_desc *w)
{
    memset(w, 0, sizeof *w);
    for (int i = 0; i < 3; i++)
        w->address_mode[i] = (int32_t)t->addressMode[i];
    w->filter_mode = (int32_t)t->filterMode;
    w->read_mode = (int32_t)t->readMode;
    w->srgb = t->sRGB;
    memcpy(w->border_color, t->borderColor, sizeof w->border_color);
    w->normalized_coords = t->normalizedCoords;
    w->max_anisotropy = t->maxAnisotropy;
    w->mipmap_filter_mode = (int32_t)t->mipmapFilterMode;
    w->mipmap_level_bias = t->mipmapLevelBias;
    w->min_mipmap_level_clamp = t->minMipmapLevelClamp;
    w->max_mipmap_level_clamp = t->maxMipmapLevelClamp;
    w->disable_trilinear_optimization = t->disableTrilinearOptimization;
    w->seamless_cubemap = t->seamlessCubemap;
}

static void wire_view(const struct cudaResourceViewDesc *v, pilot_view_desc *w)
{
    memset(w, 0, sizeof *w);
    w->format = (int32_t)v->format;
    w->width = v->width;
    w->height = v->height;
    w->depth = v->depth;
    w->first_mipmap_level = v->firstMipmapLevel;
    w->last_mipmap_level = v->lastMipmapLevel;
    w->first_layer = v->firstLayer;
    w->last_layer = v->lastLayer;
}

static cudaError_t create(uint64_t *out, const struct cudaResourceDesc *res,
                          const struct cudaTextureDesc *tex,
                          const struct cudaResourceViewDesc *view, int surface)
{
    if (!out || !res || (!surface && !tex))
        return cudaErrorInvalidValue;
    pilot_req_texture_create req;
    memset(&req, 0, sizeof req);
    int device;
    cudaError_t err = wire_resource(res, &req.res, &device);
    if (err)
        return err;
    if (!surface) {
        wire_texture(tex, &req.tex);
        if (view) {
            wire_view(view, &req.view);
            req.has_view = 1;
        }
    }
    pilot_rep_u64 rep;
    err = pilot_call_on(device, surface ? PILOT_OP_SURFACE_CREATE : PILOT_OP_TEXTURE_CREATE, &req,
                        sizeof req, NULL, 0, &rep, sizeof rep, NULL, 0, NULL);
    if (err)
        return err;
    struct object_rec rec = {.handle = rep.value, .surface = surface, .device = device,
                             .has_view = view != NULL, .res = *res};
    if (!surface)
        rec.tex = *tex;
    if (view)
        rec.view = *view;
    if (!remember(&rec)) {
        pilot_req_handle destroy = {.handle = rep.value};
        pilot_call_on(device, surface ? PILOT_OP_SURFACE_DESTROY : PILOT_OP_TEXTURE_DESTROY,
                      &destroy, sizeof destroy, NULL, 0, NULL, 0, NULL, 0, NULL);
        return cudaErrorMemoryAllocation;
    }
    *out = rep.value;
    return cudaSuccess;
}

/* Sent whatever the table says: the daemon decides whose object it is. */
static cudaError_t destroy(uint64_t handle, int surface)
{
    struct object_rec rec;
    int device = lookup(handle, surface, &rec) ? rec.device : pilot_current_device();
    pilot_req_handle req = {.handle = handle};
    cudaError_t err = pilot_call_on(device, surface ? PILOT_OP_SURFACE_DESTROY
                                                    : PILOT_OP_TEXTURE_DESTROY,
                                    &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
    if (err == cudaSuccess)
        forget(handle, surface);
    return err;
}

PILOT_EXPORT cudaError_t cudaCreateTextureObject(cudaTextureObject_t *pTexObject,
                                                 const struct cudaResourceDesc *pResDesc,
                                                 const struct cudaTextureDesc *pTexDesc,
                                                 const struct cudaResourceViewDesc *pResViewDesc)
{
    PILOT_REQUIRE_SESSION();
    uint64_t handle = 0;
    cudaError_t err = create(&handle, pResDesc, pTexDesc, pResViewDesc, 0);
    if (err == cudaSuccess)
        *pTexObject = handle;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaDestroyTextureObject(cudaTextureObject_t texObject)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(destroy(texObject, 0));
}

PILOT_EXPORT cudaError_t cudaCreateSurfaceObject(cudaSurfaceObject_t *pSurfObject,
                                                 const struct cudaResourceDesc *pResDesc)
{
    PILOT_REQUIRE_SESSION();
    if (pResDesc && pResDesc->resType != cudaResourceTypeArray)
        PILOT_RETURN(cudaErrorInvalidValue); /* surfaces are of arrays only */
    uint64_t handle = 0;
    cudaError_t err = create(&handle, pResDesc, NULL, NULL, 1);
    if (err == cudaSuccess)
        *pSurfObject = handle;
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaDestroySurfaceObject(cudaSurfaceObject_t surfObject)
{
    PILOT_REQUIRE_SESSION();
    PILOT_RETURN(destroy(surfObject, 1));
}

/* The descriptor at `offset` (`size` bytes) of the record of a live object: what the
 * cudaGet*Object*Desc queries answer. */
static cudaError_t describe(uint64_t handle, int surface, void *out, size_t offset, size_t size)
{
    struct object_rec rec;
    if (!out || !lookup(handle, surface, &rec))
        return cudaErrorInvalidValue;
    memcpy(out, (const char *)&rec + offset, size);
    return cudaSuccess;
}

#define DESCRIBE(handle, surface, out, field) \
    PILOT_RETURN(describe(handle, surface, out, offsetof(struct object_rec, field), \
                          sizeof((struct object_rec *)0)->field))

PILOT_EXPORT cudaError_t cudaGetTextureObjectResourceDesc(struct cudaResourceDesc *pResDesc,
                                                          cudaTextureObject_t texObject)
{
    DESCRIBE(texObject, 0, pResDesc, res);
}

PILOT_EXPORT cudaError_t cudaGetTextureObjectTextureDesc(struct cudaTextureDesc *pTexDesc,
                                                         cudaTextureObject_t texObject)
{
    DESCRIBE(texObject, 0, pTexDesc, tex);
}

PILOT_EXPORT cudaError_t cudaGetTextureObjectResourceViewDesc(
    struct cudaResourceViewDesc *pResViewDesc, cudaTextureObject_t texObject)
{
    DESCRIBE(texObject, 0, pResViewDesc, view); /* zeros when the object was made without a view */
}

PILOT_EXPORT cudaError_t cudaGetSurfaceObjectResourceDesc(struct cudaResourceDesc *pResDesc,
                                                          cudaSurfaceObject_t surfObject)
{
    DESCRIBE(surfObject, 1, pResDesc, res);
}

PILOT_HOOK(api_texture, .on_fork_child = fork_child,
           .on_device_reset = clear_device, .reset_rank = PILOT_RESET_OBJECTS);
