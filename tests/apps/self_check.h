// The self-check of the scenario programs (managed.cu, pinned.cu): CHECK stops the program on a
// failed CUDA call (exit 2), verdict prints "<name> ok" or "<name> FAIL <detail>" and remembers
// failures for main's exit status.
#ifndef SELF_CHECK_H
#define SELF_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            printf("%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
            exit(2);                                                                      \
        }                                                                                 \
    } while (0)

static int g_failed;
static void verdict(const char *name, int ok, const char *detail)
{
    printf("%s %s%s%s\n", name, ok ? "ok" : "FAIL", ok ? "" : " ", ok ? "" : detail);
    g_failed |= !ok;
}

#endif
