// fig1_vector_add: the workload of PILOT's Fig. 1, run N at a time by bench/fig1.py.
//
// Three managed float arrays a, b, c totalling MIB MiB (cudaMallocManaged); the host
// initialises a and b; LAUNCHES launches of vector_add (c = a + b, a grid-stride loop over the
// whole arrays) with BLOCKS blocks of THREADS threads, back to back on the default stream, then
// one synchronization; the host then checks every element of c. Prints one line:
//
//   fig1 kernel_s=... kernel_host_s=... wall_s=... init_s=... check_s=... wait_s=... n=... ok=1
//
//   kernel_s       cudaEvent time from before the first launch to after the last one
//   kernel_host_s  the same phase timed on the host (launches + the final synchronization)
//   wall_s         the whole program (CUDA initialisation, allocation, host init, kernels,
//                  check, cudaFree) minus wait_s
//   init_s         CUDA initialisation, allocations and host initialisation
//   check_s        the host reading and checking c
//   wait_s         time spent at the start barrier (--barrier), excluded from wall_s
//
// With --barrier the program prints "fig1 ready" once everything before the kernels is done,
// then waits for a line on stdin ("go") before it launches: fig1.py starts N copies and lets them
// all go at once, so that their kernel phases overlap.
//
// Usage: fig1_vector_add [MIB (512)] [LAUNCHES (400)] [BLOCKS (16)] [THREADS (1024)] [--barrier]
// Exit status: 0 when every CUDA call succeeded and c is right; 1 on a CUDA error, 2 on a wrong
// result, 3 when the barrier's stdin closed without "go", 4 on bad arguments.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                 \
    do {                                                                            \
        cudaError_t err_ = (call);                                                  \
        if (err_ != cudaSuccess) {                                                  \
            fprintf(stderr, "fig1: CUDA error %s at %s:%d: %s (%s)\n",              \
                    cudaGetErrorName(err_), __FILE__, __LINE__, #call,              \
                    cudaGetErrorString(err_));                                      \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

__global__ void vector_add(const float *a, const float *b, float *c, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        c[i] = a[i] + b[i];
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Small integers: every sum is exact in float, so the check is exact.
static float a_of(size_t i) { return (float)(i % 1000); }
static float b_of(size_t i) { return (float)((i * 7) % 1000) * 2.0f; }

static long positive(const char *text, const char *what)
{
    char *end;
    long v = strtol(text, &end, 0);
    if (*text == '\0' || *end != '\0' || v <= 0) {
        fprintf(stderr, "fig1: %s must be a positive integer, not '%s'\n", what, text);
        exit(4);
    }
    return v;
}

int main(int argc, char **argv)
{
    double t0 = now_s();
    long mib = 512, launches = 400, blocks = 16, threads = 1024;
    int barrier = 0, pos = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--barrier") == 0) {
            barrier = 1;
            continue;
        }
        switch (pos++) {
        case 0: mib = positive(argv[i], "MIB"); break;
        case 1: launches = positive(argv[i], "LAUNCHES"); break;
        case 2: blocks = positive(argv[i], "BLOCKS"); break;
        case 3: threads = positive(argv[i], "THREADS"); break;
        default:
            fprintf(stderr, "usage: %s [MIB] [LAUNCHES] [BLOCKS] [THREADS] [--barrier]\n", argv[0]);
            return 4;
        }
    }
    size_t n = ((size_t)mib << 20) / (3 * sizeof(float));

    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0)); // the context, before anything is timed against the others
    float *a, *b, *c;
    CHECK(cudaMallocManaged(&a, n * sizeof(float), cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&b, n * sizeof(float), cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&c, n * sizeof(float), cudaMemAttachGlobal));
    for (size_t i = 0; i < n; i++) {
        a[i] = a_of(i);
        b[i] = b_of(i);
    }
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    double t1 = now_s();

    double waited = 0;
    if (barrier) {
        printf("fig1 ready\n");
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin) || strncmp(line, "go", 2) != 0) {
            fprintf(stderr, "fig1: the start barrier closed without \"go\"\n");
            return 3;
        }
        waited = now_s() - t1;
    }

    double t2 = now_s();
    CHECK(cudaEventRecord(start, 0));
    for (long l = 0; l < launches; l++)
        vector_add<<<(unsigned)blocks, (unsigned)threads>>>(a, b, c, n);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(stop, 0));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaDeviceSynchronize());
    double t3 = now_s();
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));

    size_t wrong = 0, first_wrong = 0;
    float first_got = 0;
    for (size_t i = 0; i < n; i++) {
        if (c[i] != a_of(i) + b_of(i) && wrong++ == 0) {
            first_wrong = i;
            first_got = c[i];
        }
    }
    double t4 = now_s();
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    double t5 = now_s();

    printf("fig1 kernel_s=%.6f kernel_host_s=%.6f wall_s=%.6f init_s=%.6f check_s=%.6f "
           "wait_s=%.6f n=%zu ok=%d\n",
           ms / 1000.0, t3 - t2, t5 - t0 - waited, t1 - t0, t4 - t3, waited, n, wrong == 0);
    if (wrong) {
        fprintf(stderr, "fig1: %zu of %zu elements wrong, the first at %zu: %g, expected %g\n",
                wrong, n, first_wrong, (double)first_got,
                (double)(a_of(first_wrong) + b_of(first_wrong)));
        return 2;
    }
    return 0;
}
