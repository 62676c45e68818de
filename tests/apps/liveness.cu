// Liveness of pilotd seen from a program: a call may wait long for a reply, and must, while
// pilotd is alive; it must fail once pilotd stops answering.
//   slow_callback (default)  a host callback that takes 3 s, then cudaStreamSynchronize: succeeds
//                            (under pilot with PILOT_LIVENESS=1 the shim checks pilotd 3 times
//                            meanwhile)
//   loop                     prints "looping", then memset + synchronize for up to 60 s; prints
//                            the first error's name (the test stops pilotd meanwhile) or
//                            "no error"
#include <cuda_runtime.h>

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void CUDART_CB slow(void *arg)
{
    (void)arg;
    sleep(3);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc > 1 && !strcmp(argv[1], "loop")) {
        void *p;
        cudaError_t e = cudaMalloc(&p, 1 << 20);
        printf("looping\n");
        double t0 = now_s();
        while (e == cudaSuccess && now_s() - t0 < 60) {
            e = cudaMemset(p, 1, 1 << 20);
            if (e == cudaSuccess)
                e = cudaDeviceSynchronize();
        }
        printf("%s\n", e == cudaSuccess ? "no error" : cudaGetErrorName(e));
        return 0;
    }
    cudaStream_t s;
    cudaError_t e = cudaStreamCreate(&s);
    if (e == cudaSuccess)
        e = cudaLaunchHostFunc(s, slow, NULL);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    printf("slow_callback %s\n", e == cudaSuccess ? "ok" : cudaGetErrorName(e));
    return e == cudaSuccess ? 0 : 1;
}
