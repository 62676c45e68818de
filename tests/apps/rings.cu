// rings [LAUNCHES]: a program whose calls fill the shared-memory request ring many times over
// (issue 25 item 4): LAUNCHES (default 20,000) posted launches that each add to one counter, small copies both ways, and a
// copy larger than a message carries inline. Prints what it computed on stdout (the same natively,
// tests/gpu/run_compare.sh) and, on stderr, how many of pilot's rings its process maps
// (/proc/self/maps: memfd "pilot-ring"): 0 natively and when pilot runs it on the socket.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess) {                                                     \
            printf("CUDA error %s at line %d: %s\n", cudaGetErrorName(err_), __LINE__, \
                   #call);                                                             \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

__global__ void add_one(unsigned long long *counter, unsigned long long step)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *counter += step;
}

static int rings_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, "pilot-ring") != NULL;
    if (f)
        fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    const int launches = argc > 1 ? atoi(argv[1]) : 20000;
    unsigned long long *counter, total = 0;
    CHECK(cudaMalloc(&counter, sizeof *counter));
    CHECK(cudaMemset(counter, 0, sizeof *counter));
    for (int i = 0; i < launches; i++)
        add_one<<<1, 32>>>(counter, (unsigned long long)i);
    CHECK(cudaMemcpy(&total, counter, sizeof total, cudaMemcpyDeviceToHost));
    printf("sum %llu\n", total);

    const size_t big = 3u << 20; /* staged, not inline */
    unsigned char *host = (unsigned char *)malloc(big), *back = (unsigned char *)malloc(big);
    unsigned char *dev;
    for (size_t i = 0; i < big; i++)
        host[i] = (unsigned char)(i * 7 + 3);
    CHECK(cudaMalloc(&dev, big));
    CHECK(cudaMemcpy(dev, host, big, cudaMemcpyHostToDevice));
    int same = 1;
    for (int i = 0; i < 200; i++) { /* small round trips */
        unsigned char b = 0;
        size_t at = (size_t)i * 15731u % big;
        CHECK(cudaMemcpy(&b, dev + at, 1, cudaMemcpyDeviceToHost));
        same &= b == host[at];
    }
    CHECK(cudaMemcpy(back, dev, big, cudaMemcpyDeviceToHost));
    printf("copies %s\n", same && memcmp(host, back, big) == 0 ? "ok" : "WRONG");
    fprintf(stderr, "rings %d\n", rings_mapped());
    return 0;
}
