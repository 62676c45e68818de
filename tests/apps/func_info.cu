// func_info: what the runtime says about a kernel without launching it: cudaGetKernel,
// cudaFuncGetName, cudaFuncGetParamInfo (every parameter, then one past the last), and the
// errors for a pointer that is no kernel and for NULL. Prints only exact values and error names.
#include <cuda_runtime.h>

#include <stdio.h>

struct Mixed {
    int a;
    double b;
    char c[3];
};

__global__ void params_kernel(Mixed m, char flag, double *out, short s) {}

extern "C" __global__ void plain_c_kernel(float *x, int n) {}

static void param_info(const char *what, const void *func)
{
    for (size_t i = 0;; i++) {
        size_t offset = 99, size = 99;
        cudaError_t err = cudaFuncGetParamInfo(func, i, &offset, &size);
        if (err != cudaSuccess) {
            printf("%s param %zu: %s\n", what, i, cudaGetErrorName(err));
            break;
        }
        printf("%s param %zu: offset %zu size %zu\n", what, i, offset, size);
    }
}

int main(void)
{
    cudaKernel_t k = NULL;
    cudaError_t err = cudaGetKernel(&k, (const void *)params_kernel);
    printf("getKernel: %s %d\n", cudaGetErrorName(err), k != NULL);
    const char *name = NULL;
    err = cudaFuncGetName(&name, (const void *)params_kernel);
    printf("name: %s %s\n", cudaGetErrorName(err), name ? name : "(null)");
    name = NULL;
    err = cudaFuncGetName(&name, (const void *)plain_c_kernel);
    printf("name C: %s %s\n", cudaGetErrorName(err), name ? name : "(null)");
    name = NULL;
    err = cudaFuncGetName(&name, (const void *)k);
    printf("name by kernel handle: %s %s\n", cudaGetErrorName(err), name ? name : "(null)");
    param_info("params_kernel", (const void *)params_kernel);
    param_info("plain_c_kernel", (const void *)plain_c_kernel);
    printf("name of main: %s\n", cudaGetErrorName(cudaFuncGetName(&name, (const void *)main)));
    printf("name of NULL: %s\n", cudaGetErrorName(cudaFuncGetName(&name, NULL)));
    size_t offset;
    printf("params of main: %s\n",
           cudaGetErrorName(cudaFuncGetParamInfo((const void *)main, 0, &offset, NULL)));
    cudaGetLastError();
    printf("done\n");
    return 0;
}
