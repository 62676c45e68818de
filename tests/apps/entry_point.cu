// entry_point: cudaGetDriverEntryPoint(ByVersion), the runtime's way to the driver API, used the
// way PyTorch's c10 uses it: fetch cuMemAlloc/cuMemsetD32/cuMemFree and call them on the
// runtime's own context; an unknown name is cudaSuccess with a NULL pointer and a status
// saying so. Prints only exact values and error names.
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdio.h>

typedef CUresult (*mem_alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*memset_d32_t)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*mem_free_t)(CUdeviceptr);

int main(void)
{
    cudaFree(0); /* the runtime's context, current from here on */
    void *fn = NULL;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointVersionNotSufficent;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 13000, cudaEnableDefault,
                                                       &status);
    printf("cuMemAlloc: %s found %d status %d\n", cudaGetErrorName(err), fn != NULL, (int)status);
    mem_alloc_t mem_alloc = (mem_alloc_t)fn;
    err = cudaGetDriverEntryPointByVersion("cuMemsetD32", &fn, 13000, cudaEnableDefault, &status);
    memset_d32_t memset_d32 = (memset_d32_t)fn;
    err = cudaGetDriverEntryPointByVersion("cuMemFree", &fn, 13000, cudaEnableDefault, &status);
    mem_free_t mem_free = (mem_free_t)fn;
    if (!mem_alloc || !memset_d32 || !mem_free) {
        printf("missing entry points\n");
        return 1;
    }
    CUdeviceptr p = 0;
    CUresult r = mem_alloc(&p, 1024 * sizeof(unsigned));
    printf("driver cuMemAlloc: %d\n", (int)r);
    r = memset_d32(p, 0xC0FFEEu, 1024);
    printf("driver cuMemsetD32: %d\n", (int)r);
    unsigned host[1024] = {0};
    err = cudaMemcpy(host, (void *)p, sizeof host, cudaMemcpyDeviceToHost);
    printf("runtime reads it: %s %x %x\n", cudaGetErrorName(err), host[0], host[1023]);
    printf("driver cuMemFree: %d\n", (int)mem_free(p));

    fn = (void *)1;
    status = cudaDriverEntryPointSuccess;
    err = cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &fn, 13000, cudaEnableDefault,
                                           &status);
    printf("unknown: %s null %d status %d\n", cudaGetErrorName(err), fn == NULL, (int)status);
    /* (a NULL symbol is not asked: the H100's runtime crashes on it) */
    cudaGetLastError();
    printf("done\n");
    return 0;
}
