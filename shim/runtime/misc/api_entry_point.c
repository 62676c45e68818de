/* cudaGetDriverEntryPoint(ByVersion): the runtime's way to the driver API (PyTorch's c10 takes
 * its virtual-memory and context calls this way). Under pilot the driver is libpilot-cuda.so
 * (shim/driver/drv_*.c), installed beside this library and sharing its session: it is loaded on the
 * first request (SONAME libcuda.so.1, so a later dlopen("libcuda.so.1") in the process finds it
 * too) and its cuGetProcAddress_v2 answers. Never the machine's real libcuda: its functions
 * would work outside pilot. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "shim.h"

/* CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) */
typedef int (*get_proc_fn)(const char *symbol, void **pfn, int version, unsigned long long flags,
                           int *status);

static get_proc_fn g_get_proc;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void find_driver(void)
{
    Dl_info self;
    char path[PATH_MAX];
    if (!dladdr((void *)find_driver, &self) || !self.dli_fname ||
        strlen(self.dli_fname) >= sizeof path)
        return;
    strcpy(path, self.dli_fname);
    char beside[PATH_MAX + 32];
    snprintf(beside, sizeof beside, "%s/libpilot-cuda.so", dirname(path));
    void *lib = dlopen(beside, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        LOG_WARN("cudaGetDriverEntryPoint: pilot's driver library is not available (%s)", dlerror());
        return;
    }
    g_get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
}

/* cudaEnableDefault means the per-thread default stream in a per-thread build (the _ptsz entry
 * points), the legacy one otherwise; the other two flags are the driver's own values. */
static cudaError_t entry_point(const char *symbol, void **funcPtr, int version,
                               unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *driverStatus, int per_thread)
{
    if (!symbol || !funcPtr || flags > cudaEnablePerThreadDefaultStream)
        return cudaErrorInvalidValue;
    if (flags == cudaEnableDefault)
        flags = per_thread ? cudaEnablePerThreadDefaultStream : cudaEnableLegacyStream;
    pthread_once(&g_once, find_driver);
    if (!g_get_proc)
        return cudaErrorNotSupported;
    int status = cudaDriverEntryPointSymbolNotFound;
    int err = g_get_proc(symbol, funcPtr, version, flags, &status);
    if (err)
        return err == cudaErrorInvalidValue ? cudaErrorInvalidValue : cudaErrorNotSupported;
    if (driverStatus)
        *driverStatus = (enum cudaDriverEntryPointQueryResult)status; /* the same numbering */
    return cudaSuccess;
}

#define RUNTIME_VERSION (PILOT_CUDART_MAJOR * 1000)

#undef cudaGetDriverEntryPoint
#undef cudaGetDriverEntryPointByVersion

PILOT_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                                 unsigned long long flags,
                                                 enum cudaDriverEntryPointQueryResult *driverStatus)
{
    PILOT_RETURN(entry_point(symbol, funcPtr, RUNTIME_VERSION, flags, driverStatus, 0));
}

PILOT_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                                      unsigned long long flags,
                                                      enum cudaDriverEntryPointQueryResult *driverStatus)
{
    PILOT_RETURN(entry_point(symbol, funcPtr, RUNTIME_VERSION, flags, driverStatus, 1));
}

PILOT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                          unsigned int cudaVersion,
                                                          unsigned long long flags,
                                                          enum cudaDriverEntryPointQueryResult *driverStatus)
{
    PILOT_RETURN(entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus, 0));
}

PILOT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                               unsigned int cudaVersion,
                                                               unsigned long long flags,
                                                               enum cudaDriverEntryPointQueryResult *driverStatus)
{
    PILOT_RETURN(entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus, 1));
}
