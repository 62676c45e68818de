/* Launches with attributes: cudaLaunchKernelExC (what the C++ cudaLaunchKernelEx template
 * calls) and cudaLaunchCooperativeKernel, with their _ptsz forms.
 *
 * pilot carries the attributes programs commonly set: cooperative (grid-wide synchronization),
 * the cluster dimension and its scheduling preference, and the launch priority; Ignore entries
 * are skipped. Hints are checked as CUDA checks them, then dropped, because launching without
 * them is one of the executions CUDA allows: programmatic stream serialization (programmatic
 * dependent launch, as Thrust and CUB use it: without it the kernel starts after the previous
 * one finished, and its cudaGridDependencySynchronize returns at once), the preferred
 * shared-memory carveout, an L2 access policy window (kept from the daemon's streams as the
 * stream attribute is: a tenant's persisting lines would act on an L2 every tenant shares), the
 * synchronization policy, the memory synchronization domain and its map (without them a fence
 * orders against every domain: stronger, never weaker) and a preferred cluster dimension (the
 * launch keeps its cluster dimension). An attribute with effects a program relies on
 * (programmatic and launch completion events, device-updatable graph nodes) is refused with
 * cudaErrorNotSupported and a warning naming it, rather than silently launching without it. The daemon launches with
 * cuLaunchKernelEx (daemon/execution.py); cooperative and cluster launches wait for its answer,
 * because only the device can say whether it can run them. */
#include "log.h"
#include "shim.h"

static const char *attribute_name(int id)
{
    switch (id) {
    case cudaLaunchAttributeAccessPolicyWindow: return "cudaLaunchAttributeAccessPolicyWindow";
    case cudaLaunchAttributeSynchronizationPolicy: return "cudaLaunchAttributeSynchronizationPolicy";
    case cudaLaunchAttributeProgrammaticStreamSerialization:
        return "cudaLaunchAttributeProgrammaticStreamSerialization";
    case cudaLaunchAttributeProgrammaticEvent: return "cudaLaunchAttributeProgrammaticEvent";
    case cudaLaunchAttributeMemSyncDomainMap: return "cudaLaunchAttributeMemSyncDomainMap";
    case cudaLaunchAttributeMemSyncDomain: return "cudaLaunchAttributeMemSyncDomain";
    case cudaLaunchAttributePreferredClusterDimension:
        return "cudaLaunchAttributePreferredClusterDimension";
    case cudaLaunchAttributeLaunchCompletionEvent: return "cudaLaunchAttributeLaunchCompletionEvent";
    case cudaLaunchAttributeDeviceUpdatableKernelNode:
        return "cudaLaunchAttributeDeviceUpdatableKernelNode";
    case cudaLaunchAttributePreferredSharedMemoryCarveout:
        return "cudaLaunchAttributePreferredSharedMemoryCarveout";
    default: return NULL;
    }
}

/* The attributes as pilot carries them, or cudaErrorNotSupported for one it does not. */
static cudaError_t parse_attributes(const cudaLaunchAttribute *attrs, unsigned n,
                                    struct pilot_launch_ex *ex)
{
    if (n && !attrs)
        return cudaErrorInvalidValue;
    for (unsigned i = 0; i < n; i++) {
        const cudaLaunchAttribute *a = &attrs[i];
        switch ((int)a->id) {
        case cudaLaunchAttributeIgnore:
            break;
        case cudaLaunchAttributeCooperative:
            ex->cooperative = a->val.cooperative != 0;
            break;
        case cudaLaunchAttributeClusterDimension:
            ex->cluster[0] = a->val.clusterDim.x;
            ex->cluster[1] = a->val.clusterDim.y;
            ex->cluster[2] = a->val.clusterDim.z;
            if (!ex->cluster[0] && !ex->cluster[1] && !ex->cluster[2])
                return cudaErrorInvalidValue; /* 0 0 0 cannot be told from "no cluster" */
            break;
        case cudaLaunchAttributeClusterSchedulingPolicyPreference:
            ex->cluster_policy = (uint32_t)a->val.clusterSchedulingPolicyPreference;
            break;
        case cudaLaunchAttributePriority:
            ex->priority = a->val.priority;
            ex->has_priority = 1;
            break;
        case cudaLaunchAttributeProgrammaticStreamSerialization:
        case cudaLaunchAttributePreferredSharedMemoryCarveout:
        case cudaLaunchAttributeMemSyncDomainMap:
        case cudaLaunchAttributePreferredClusterDimension:
            break; /* hints: see the top of this file */
        case cudaLaunchAttributeAccessPolicyWindow:
            if (pilot_check_access_window(&a->val.accessPolicyWindow))
                return cudaErrorInvalidValue;
            break;
        case cudaLaunchAttributeSynchronizationPolicy:
            if (a->val.syncPolicy < cudaSyncPolicyAuto || a->val.syncPolicy > cudaSyncPolicyBlockingSync)
                return cudaErrorInvalidValue;
            break;
        case cudaLaunchAttributeMemSyncDomain:
            if ((unsigned)a->val.memSyncDomain > cudaLaunchMemSyncDomainRemote)
                return cudaErrorInvalidValue;
            break;
        default: {
            const char *name = attribute_name((int)a->id);
            LOG_WARN("cudaLaunchKernelExC: launch attribute %s (%d) is not supported by pilot",
                     name ? name : "unknown", (int)a->id);
            return name ? cudaErrorNotSupported : cudaErrorInvalidValue;
        }
        }
    }
    return cudaSuccess;
}

static struct pilot_kernel *find_kernel(const void *func)
{
    struct pilot_kernel *k = pilot_kernel_from_host(func);
    return k ? k : pilot_kernel_from_handle(func);
}

PILOT_EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                             void **args)
{
    if (!config)
        PILOT_RETURN(cudaErrorInvalidValue);
    PILOT_REQUIRE_SESSION();
    struct pilot_launch_ex ex = {0};
    cudaError_t err = parse_attributes(config->attrs, config->numAttrs, &ex);
    if (err)
        PILOT_RETURN(err);
    return pilot_launch(find_kernel(func), config->gridDim, config->blockDim, args,
                        config->dynamicSmemBytes, config->stream, &ex);
}

PILOT_EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config,
                                                  const void *func, void **args)
{
    if (!config || config->stream)
        return cudaLaunchKernelExC(config, func, args);
    cudaLaunchConfig_t c = *config;
    c.stream = cudaStreamPerThread;
    return cudaLaunchKernelExC(&c, func, args);
}

PILOT_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 grid, dim3 block,
                                                     void **args, size_t shared,
                                                     cudaStream_t stream)
{
    struct pilot_launch_ex ex = {.cooperative = 1};
    return pilot_launch(find_kernel(func), grid, block, args, shared, stream, &ex);
}

PILOT_EXPORT cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 grid, dim3 block,
                                                          void **args, size_t shared,
                                                          cudaStream_t stream)
{
    return cudaLaunchCooperativeKernel(func, grid, block, args, shared,
                                       stream ? stream : cudaStreamPerThread);
}
