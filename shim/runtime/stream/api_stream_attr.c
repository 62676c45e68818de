/* Stream attributes (cudaStreamGetAttribute/SetAttribute/CopyAttributes) and cudaStreamGetId.
 * The attributes a stream carries in CUDA are hints to the device (an L2 access policy window,
 * a synchronization policy, memory synchronization domains): pilot keeps them per stream in the
 * shim, checked as CUDA checks them, and answers them back; the daemon's streams do not get them
 * (a tenant's L2 persistence hints would act on memory other tenants share). The priority is the
 * stream's own (cudaStreamGetPriority); setting it is not carried (cudaErrorNotSupported). */
#include <pthread.h>
#include <stdlib.h>

#include "log.h"
#include "shim.h"

struct attrs {
    uint64_t stream; /* daemon handle */
    struct cudaAccessPolicyWindow window;
    enum cudaSynchronizationPolicy sync_policy;
    cudaLaunchMemSyncDomainMap domain_map;
    enum cudaLaunchMemSyncDomain domain;
    struct attrs *next;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct attrs *g_attrs;

static const struct attrs g_defaults = {
    .sync_policy = cudaSyncPolicyAuto,
    .domain_map = {.default_ = 0, .remote = 1},
    .domain = cudaLaunchMemSyncDomainDefault,
};

/* The stream's entry (created with the defaults if `create`), or NULL. Under g_lock. */
static struct attrs *find(uint64_t stream, int create)
{
    for (struct attrs *a = g_attrs; a; a = a->next)
        if (a->stream == stream)
            return a;
    if (!create)
        return NULL;
    struct attrs *a = malloc(sizeof *a);
    if (a) {
        *a = g_defaults;
        a->stream = stream;
        a->next = g_attrs;
        g_attrs = a;
    }
    return a;
}

/* Checks the stream handle (and gets its priority): CUDA's error for one that is not a stream. */
static cudaError_t check_stream(cudaStream_t stream, int *priority)
{
    int p = 0;
    cudaError_t err = cudaStreamGetPriority(stream, &p);
    if (priority)
        *priority = p;
    return err;
}

PILOT_EXPORT cudaError_t cudaStreamGetAttribute(cudaStream_t hStream, cudaStreamAttrID attr,
                                                cudaStreamAttrValue *value_out)
{
    PILOT_REQUIRE_SESSION();
    if (!value_out)
        PILOT_RETURN(cudaErrorInvalidValue);
    int priority = 0;
    cudaError_t err = check_stream(hStream, &priority);
    if (err)
        PILOT_RETURN(err);
    pthread_mutex_lock(&g_lock);
    const struct attrs *a = find(pilot_stream_handle(hStream), 0);
    if (!a)
        a = &g_defaults;
    switch (attr) {
    case cudaLaunchAttributeAccessPolicyWindow:
        value_out->accessPolicyWindow = a->window;
        break;
    case cudaLaunchAttributeSynchronizationPolicy:
        value_out->syncPolicy = a->sync_policy;
        break;
    case cudaLaunchAttributePriority:
        value_out->priority = priority;
        break;
    case cudaLaunchAttributeMemSyncDomainMap:
        value_out->memSyncDomainMap = a->domain_map;
        break;
    case cudaLaunchAttributeMemSyncDomain:
        value_out->memSyncDomain = a->domain;
        break;
    default:
        err = cudaErrorInvalidValue;
    }
    pthread_mutex_unlock(&g_lock);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamSetAttribute(cudaStream_t hStream, cudaStreamAttrID attr,
                                                const cudaStreamAttrValue *value)
{
    PILOT_REQUIRE_SESSION();
    if (!value)
        PILOT_RETURN(cudaErrorInvalidValue);
    cudaError_t err = check_stream(hStream, NULL);
    if (err)
        PILOT_RETURN(err);
    switch (attr) {
    case cudaLaunchAttributeAccessPolicyWindow:
        err = pilot_check_access_window(&value->accessPolicyWindow);
        break;
    case cudaLaunchAttributeSynchronizationPolicy:
        if (value->syncPolicy < cudaSyncPolicyAuto || value->syncPolicy > cudaSyncPolicyBlockingSync)
            err = cudaErrorInvalidValue;
        break;
    case cudaLaunchAttributeMemSyncDomain:
        if ((unsigned)value->memSyncDomain > cudaLaunchMemSyncDomainRemote)
            err = cudaErrorInvalidValue;
        break;
    case cudaLaunchAttributeMemSyncDomainMap:
        break;
    case cudaLaunchAttributePriority:
        LOG_WARN("cudaStreamSetAttribute(cudaLaunchAttributePriority) is not supported by pilot");
        err = cudaErrorNotSupported;
        break;
    default:
        err = cudaErrorInvalidValue;
    }
    if (err)
        PILOT_RETURN(err);
    pthread_mutex_lock(&g_lock);
    struct attrs *a = find(pilot_stream_handle(hStream), 1);
    if (!a)
        err = cudaErrorMemoryAllocation;
    else if (attr == cudaLaunchAttributeAccessPolicyWindow)
        a->window = value->accessPolicyWindow;
    else if (attr == cudaLaunchAttributeSynchronizationPolicy)
        a->sync_policy = value->syncPolicy;
    else if (attr == cudaLaunchAttributeMemSyncDomain)
        a->domain = value->memSyncDomain;
    else
        a->domain_map = value->memSyncDomainMap;
    pthread_mutex_unlock(&g_lock);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamCopyAttributes(cudaStream_t dst, cudaStream_t src)
{
    PILOT_REQUIRE_SESSION();
    cudaError_t err = check_stream(dst, NULL);
    if (err == cudaSuccess)
        err = check_stream(src, NULL);
    if (err)
        PILOT_RETURN(err);
    pthread_mutex_lock(&g_lock);
    const struct attrs *from = find(pilot_stream_handle(src), 0);
    struct attrs *to = find(pilot_stream_handle(dst), 1);
    if (!to) {
        err = cudaErrorMemoryAllocation;
    } else {
        struct attrs *next = to->next;
        uint64_t h = to->stream;
        *to = from ? *from : g_defaults;
        to->stream = h;
        to->next = next;
    }
    pthread_mutex_unlock(&g_lock);
    PILOT_RETURN(err);
}

PILOT_EXPORT cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long *streamId)
{
    PILOT_REQUIRE_SESSION();
    if (!streamId)
        PILOT_RETURN(cudaErrorInvalidValue);
    cudaError_t err = check_stream(hStream, NULL);
    if (err)
        PILOT_RETURN(err);
    uint64_t h = pilot_stream_handle(hStream);
    /* the daemon's handle is unique in the session; the legacy stream's is 0 on every device */
    *streamId = h ? h : (1ull << 62) | (unsigned)pilot_current_device();
    return cudaSuccess;
}

static cudaStream_t per_thread(cudaStream_t stream)
{
    return stream ? stream : cudaStreamPerThread;
}

PILOT_EXPORT cudaError_t cudaStreamGetAttribute_ptsz(cudaStream_t hStream, cudaStreamAttrID attr,
                                                     cudaStreamAttrValue *value_out)
{
    return cudaStreamGetAttribute(per_thread(hStream), attr, value_out);
}

PILOT_EXPORT cudaError_t cudaStreamSetAttribute_ptsz(cudaStream_t hStream, cudaStreamAttrID attr,
                                                     const cudaStreamAttrValue *value)
{
    return cudaStreamSetAttribute(per_thread(hStream), attr, value);
}

PILOT_EXPORT cudaError_t cudaStreamCopyAttributes_ptsz(cudaStream_t dst, cudaStream_t src)
{
    return cudaStreamCopyAttributes(per_thread(dst), per_thread(src));
}

PILOT_EXPORT cudaError_t cudaStreamGetId_ptsz(cudaStream_t hStream, unsigned long long *streamId)
{
    return cudaStreamGetId(per_thread(hStream), streamId);
}

/* Persisting L2 lines come only from access policy windows, which pilot keeps as hints and never
 * gives the daemon's streams (above): none of the program's are persisting, so there is nothing
 * to demote, and another tenant's lines are not the program's to reset. */
PILOT_EXPORT cudaError_t cudaCtxResetPersistingL2Cache(void)
{
    PILOT_REQUIRE_SESSION();
    return cudaSuccess;
}
