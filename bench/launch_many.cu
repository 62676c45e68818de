// launch_many: tenants launching at once. K processes (forked before any CUDA call, each its own
// CUDA context, or under pilot its own session) each warm up, wait at a barrier, then launch N
// empty kernels back to back and synchronize. Prints `metric value` lines:
//   tenants8_launches_per_s  K * N / (last end - first start), all processes together
// (named for the default K = 8). Usage: launch_many [K (8)] [N (10000)]. Exits non-zero when a
// process fails.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

__global__ void empty_kernel() {}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void child(int n, int ready_fd, int go_fd, int result_fd)
{
    for (int i = 0; i < 100; i++)  // warm-up: context (or session), module, launch path
        empty_kernel<<<1, 1>>>();
    CHECK(cudaDeviceSynchronize());
    char c = 'r';
    if (write(ready_fd, &c, 1) != 1 || read(go_fd, &c, 1) != 1)
        exit(1);
    double t[2];
    t[0] = now_s();
    for (int i = 0; i < n; i++)
        empty_kernel<<<1, 1>>>();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    t[1] = now_s();
    if (write(result_fd, t, sizeof t) != (ssize_t)sizeof t)
        exit(1);
    exit(0);
}

int main(int argc, char **argv)
{
    const int k = argc > 1 ? atoi(argv[1]) : 8, n = argc > 2 ? atoi(argv[2]) : 10000;
    if (k < 1 || k > 256 || n < 1) {
        fprintf(stderr, "usage: %s [PROCESSES 1..256] [LAUNCHES>0]\n", argv[0]);
        return 2;
    }
    int ready[2], go[2], result[2];
    if (pipe(ready) || pipe(go) || pipe(result))
        return 1;
    alarm(600);  // a process that died before the barrier must not leave the rest waiting forever
    for (int i = 0; i < k; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0)
            child(n, ready[1], go[0], result[1]);
    }
    close(ready[1]);  // so that reads see the end when every process is gone
    close(result[1]);
    close(go[0]);
    char c;
    for (int i = 0; i < k; i++)
        if (read(ready[0], &c, 1) != 1)
            return 1;
    for (int i = 0; i < k; i++)
        if (write(go[1], "g", 1) != 1)
            return 1;
    double first = 1e300, last = 0;
    for (int i = 0; i < k; i++) {
        double t[2];
        if (read(result[0], t, sizeof t) != (ssize_t)sizeof t) {
            fprintf(stderr, "launch_many: a process failed\n");
            return 1;
        }
        first = t[0] < first ? t[0] : first;
        last = t[1] > last ? t[1] : last;
    }
    int failed = 0;
    for (int i = 0; i < k; i++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed = 1;
    }
    if (failed) {
        fprintf(stderr, "launch_many: a process failed\n");
        return 1;
    }
    printf("tenants8_launches_per_s %.1f\n", (double)k * n / (last - first));
    return 0;
}
