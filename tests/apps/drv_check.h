// CHECK for the driver API programs (linker.cu, driver_host.cu): a failed call prints its
// CUresult's name and line, and main returns 1.
#ifndef DRV_CHECK_H
#define DRV_CHECK_H

#include <cstdio>

#include <cuda.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        CUresult r_ = (call);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                    \
            const char *name_ = nullptr;                                             \
            cuGetErrorName(r_, &name_);                                              \
            printf("%s: %s at line %d\n", #call, name_ ? name_ : "?", __LINE__);     \
            return 1;                                                                \
        }                                                                            \
    } while (0)

#endif
