// Allocates each size given on the command line (e.g. 1M 3M 512K), keeping what succeeds, and
// prints the result of each plus what cudaMemGetInfo reports; then checks that the program
// still works after a refused allocation (a copy round trip through the first allocation).
#include <cstdio>
#include <cstdlib>
#include <cstring>

static size_t parse(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    size_t mul = *end == 'K' ? 1 << 10 : *end == 'M' ? 1 << 20 : *end == 'G' ? 1 << 30 : 1;
    return (size_t)(v * (double)mul);
}

int main(int argc, char **argv)
{
    void *first = NULL;
    for (int i = 1; i < argc; i++) {
        void *p = NULL;
        cudaError_t err = cudaMalloc(&p, parse(argv[i]));
        printf("malloc %s: %s\n", argv[i], cudaGetErrorName(err));
        if (err == cudaSuccess && !first)
            first = p;
    }
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    size_t free_b = 0, total_b = 0;
    cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
    printf("meminfo: %s free %zu total %zu\n", cudaGetErrorName(err), free_b, total_b);
    if (first) {
        char out[64] = "pilot quota round trip", in[64] = {0};
        cudaError_t a = cudaMemcpy(first, out, sizeof out, cudaMemcpyHostToDevice);
        cudaError_t b = cudaMemcpy(in, first, sizeof in, cudaMemcpyDeviceToHost);
        printf("copy after: %s\n", a == cudaSuccess && b == cudaSuccess && !strcmp(in, out) ? "ok" : "FAILED");
    }
    return 0;
}
