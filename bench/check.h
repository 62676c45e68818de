// CHECK(call): a CUDA runtime call that must succeed; otherwise the error's name, where, and
// exit 1. Shared by the bench programs (each is still one file to nvcc; quoted includes are
// found beside the source).
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                 \
    do {                                                                            \
        cudaError_t err_ = (call);                                                  \
        if (err_ != cudaSuccess) {                                                  \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), \
                    __FILE__, __LINE__, #call);                                     \
            exit(1);                                                                \
        }                                                                           \
    } while (0)
