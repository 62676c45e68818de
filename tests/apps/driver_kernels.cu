// Kernels the driver API test (driver_api.cu) loads as a module: built by the test with
// `nvcc -cubin -arch=sm_90` (loaded from the file) and `nvcc -fatbin` (embedded in the program).
struct Pair {
    int a;
    double b;
};

__device__ int counter = 7;

extern "C" __global__ void drv_scale(float *x, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * a;
}

extern "C" __global__ void drv_axpb(const int *x, int *y, int a, int b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + b;
}

extern "C" __global__ void drv_pair(Pair p, char c, long long *out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        out[0] = p.a * 1000 + (long long)p.b * 10 + c;
}

extern "C" __global__ void drv_bump(int n)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        counter += n;
}
