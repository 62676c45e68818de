// salus_torch_like: a CUDA C job shaped like a PyTorch training step with
// PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, for the salus detector (tests/apps/test_salus.py,
// bench/salus_experiments.py `steps`): its model state is allocated once (P), then each step
// returns to that level several times, as bench/salus_step_shapes.py's torch_like_step does
// (the same sizes, the same order):
//   - per layer: its output and a temporary (cudaMallocAsync), two launches, the output freed
//     before the temporary (cudaFreeAsync): back at the level, a dip inside the step;
//   - a backward piece: a gradient per layer (sizes varied), each with a launch, freed out of
//     order (odd layers first);
//   - an optimizer piece: one small buffer, a launch, freed;
//   - loss.item(): the step's counter copied to the host (a synchronizing D2H copy).
// The detector should report one boundary per step (not LAYERS + 2), with P = P_MiB and E the
// backward piece's gradients. Prints `steps N ok` (the kernels' counter checked) and `jct_s`.
//
// Usage: salus_torch_like P_MiB STEPS [LAYERS (4)] [UNIT_KiB (2048)] [HOST_MS (0)] [HOLD_MS (0)]
//   HOST_MS: the host sleeps that long per step after the copy (the sim runs kernels at once);
//   HOLD_MS: after the last step it holds its state that long before freeing it (a test reads
//   pilot's view of the job meanwhile).
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "salus_kernel.cuh"

static void sleep_ms(double ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {(time_t)(ms / 1e3), (long)((ms - 1e3 * (long)(ms / 1e3)) * 1e6)};
    nanosleep(&ts, NULL);
}

static unsigned long long g_launches;

static void *alloc(size_t bytes, cudaStream_t s)
{
    void *p = NULL;
    CHECK(cudaMallocAsync(&p, bytes, s));
    return p;
}

static void launch(unsigned long long *state, void *buf, size_t bytes, cudaStream_t s)
{
    size_t words = bytes / sizeof(unsigned int);
    iteration<<<4, 128, 0, s>>>(state, (unsigned int *)buf, words < 512 ? words : 512, 0);
    CHECK(cudaGetLastError());
    g_launches++;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s P_MiB STEPS [LAYERS] [UNIT_KiB] [HOST_MS] [HOLD_MS]\n", argv[0]);
        return 2;
    }
    size_t p = strtoull(argv[1], NULL, 10) << 20;
    long steps = atol(argv[2]);
    int layers = argc > 3 ? atoi(argv[3]) : 4;
    size_t unit = (argc > 4 ? strtoull(argv[4], NULL, 10) : 2048) << 10;
    double host_ms = argc > 5 ? atof(argv[5]) : 0.0, hold_ms = argc > 6 ? atof(argv[6]) : 0.0;
    if (p < sizeof(unsigned long long) || steps < 1 || layers < 1 || layers > 64 || unit < 8192) {
        fprintf(stderr, "P at least 1 MiB, STEPS at least 1, LAYERS 1-64, UNIT_KiB at least 8\n");
        return 2;
    }
    double t0 = seconds();
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    unsigned long long *state;
    CHECK(cudaMalloc(&state, p));
    CHECK(cudaMemset(state, 0, p));
    void *grads[64];
    for (long step = 0; step < steps; step++) {
        for (int i = 0; i < layers; i++) {  /* forward: back at the level after each layer */
            size_t out_bytes = unit * (1 + i % 2), tmp_bytes = unit / 2 + i * (unit / 8);
            void *out = alloc(out_bytes, s), *tmp = alloc(tmp_bytes, s);
            launch(state, out, out_bytes, s);
            launch(state, tmp, tmp_bytes, s);
            CHECK(cudaFreeAsync(out, s));
            CHECK(cudaFreeAsync(tmp, s));
        }
        for (int i = 0; i < layers; i++) {  /* backward: gradients of several sizes */
            size_t g = unit * (2 + i % 3);
            grads[i] = alloc(g, s);
            launch(state, grads[i], g, s);
        }
        for (int i = 1; i < layers; i += 2)  /* freed out of order */
            CHECK(cudaFreeAsync(grads[i], s));
        for (int i = 0; i < layers; i += 2)
            CHECK(cudaFreeAsync(grads[i], s));
        void *opt = alloc(unit / 4, s);  /* optimizer */
        launch(state, opt, unit / 4, s);
        CHECK(cudaFreeAsync(opt, s));
        unsigned long long count = 0;  /* loss.item() */
        CHECK(cudaMemcpyAsync(&count, state, sizeof count, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        sleep_ms(host_ms);
    }
    unsigned long long count = 0;
    CHECK(cudaMemcpy(&count, state, sizeof count, cudaMemcpyDeviceToHost));
    double jct = seconds() - t0;
    printf("%s %ld %s\n", "steps", steps, count == g_launches ? "ok" : "wrong");
    printf("jct_s %.3f\n", jct);
    fflush(stdout);
    sleep_ms(hold_ms);
    CHECK(cudaFree(state));
    CHECK(cudaStreamDestroy(s));
    return count == g_launches ? 0 : 1;
}
