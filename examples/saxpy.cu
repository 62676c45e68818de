// A plain CUDA program: nothing in it knows about pilot.
//   nvcc -cudart shared -o saxpy examples/saxpy.cu
//   ./saxpy                 (natively)
//   pilot run -- ./saxpy    (through pilotd)
#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t err_ = (call);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(err_));           \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

__global__ void saxpy(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

int main()
{
    const int n = 1 << 20;
    float *x = (float *)malloc(n * sizeof(float)), *y = (float *)malloc(n * sizeof(float));
    for (int i = 0; i < n; i++) {
        x[i] = 1.0f;
        y[i] = 2.0f;
    }
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, n * sizeof(float)));
    CHECK(cudaMalloc(&dy, n * sizeof(float)));
    CHECK(cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y, n * sizeof(float), cudaMemcpyHostToDevice));
    saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, dx, dy);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(y, dy, n * sizeof(float), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < n; i++)
        wrong += y[i] != 4.0f;
    printf("saxpy of %d elements: %s\n", n, wrong ? "WRONG" : "ok");
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    free(x);
    free(y);
    return wrong != 0;
}
