// preload: a small program's kernels are loaded and resolved in pilotd when its session starts
// (shim/registry.c preload_small_program), not at their first launch.
// Usage: preload idle    -> cudaFree(0) only, prints "idle ok"
//        preload launch  -> a kernel launch is the program's first CUDA call, then vadd checked
// Built with -DMANY_KERNELS, the program has 40 more kernels (too many to resolve ahead).
#include <cuda_runtime.h>

#include <stdio.h>
#include <string.h>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

__global__ void vadd(const float *a, const float *b, float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}

__global__ void noargs_kernel(void) {}

__global__ void never_launched(int *p)
{
    *p = 1;
}

#ifdef MANY_KERNELS
template <int N> __global__ void many(int *p)
{
    p[N] = N;
}
template <int N> struct Instantiate {
    Instantiate()
    {
        (void)&many<N>;
        Instantiate<N - 1>();
    }
};
template <> struct Instantiate<0> {
    Instantiate() { (void)&many<0>; }
};
static Instantiate<39> g_many;
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "launch") == 0) {
        noargs_kernel<<<1, 1>>>();
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        const int n = 1000;
        float h[3][n], *d[3];
        for (int i = 0; i < n; i++) {
            h[0][i] = (float)i;
            h[1][i] = 2.0f * i;
        }
        for (int k = 0; k < 3; k++)
            CHECK(cudaMalloc((void **)&d[k], n * sizeof(float)));
        CHECK(cudaMemcpy(d[0], h[0], n * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d[1], h[1], n * sizeof(float), cudaMemcpyHostToDevice));
        vadd<<<(n + 127) / 128, 128>>>(d[0], d[1], d[2], n);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(h[2], d[2], n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++)
            if (h[2][i] != 3.0f * i) {
                fprintf(stderr, "c[%d] = %g\n", i, h[2][i]);
                return 1;
            }
        printf("launch ok\n");
        return 0;
    }
    CHECK(cudaFree(0));
    printf("idle ok\n");
    return 0;
}
