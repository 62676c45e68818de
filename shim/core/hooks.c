/* The registry of shim/core/hooks.h: walks the entries the linker gathered in section
 * pilot_hooks (from __start_pilot_hooks to __stop_pilot_hooks, which ld defines for a section
 * named like a C identifier). */
#include "hooks.h"

#include <limits.h>
#include <pthread.h>
#include <stddef.h>

extern const struct pilot_hook __start_pilot_hooks[] __attribute__((visibility("hidden")));
extern const struct pilot_hook __stop_pilot_hooks[] __attribute__((visibility("hidden")));

void pilot_hooks_fork_child(void)
{
    for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
        if (h->on_fork_child)
            h->on_fork_child();
}

void pilot_hooks_device_reset(int device)
{
    /* A handful of entries: each pass runs the lowest rank not run yet. */
    long done = (long)INT_MIN - 1;
    for (;;) {
        long rank = LONG_MAX;
        for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
            if (h->on_device_reset && h->reset_rank > done && h->reset_rank < rank)
                rank = h->reset_rank;
        if (rank == LONG_MAX)
            return;
        for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
            if (h->on_device_reset && h->reset_rank == rank)
                h->on_device_reset(device);
        done = rank;
    }
}

void pilot_hooks_image_unregister(struct pilot_image *img)
{
    for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
        if (h->on_image_unregister)
            h->on_image_unregister(img);
}

cudaError_t pilot_hooks_managed_variable(uint64_t module, const char *name, void **host_ptr)
{
    cudaError_t err = cudaSuccess;
    for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
        if (h->on_managed_variable) {
            cudaError_t e = h->on_managed_variable(module, name, host_ptr);
            err = err ? err : e;
        }
    return err;
}

cudaError_t pilot_hooks_graph_memory_alloc(const struct cudaMemAllocNodeParams *p, struct gmem **out)
{
    for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
        if (h->on_graph_memory_alloc)
            return h->on_graph_memory_alloc(p, out);
    return cudaErrorNotSupported;
}

void pilot_hooks_graph_memory_released(void)
{
    for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
        if (h->on_graph_memory_released)
            h->on_graph_memory_released();
}

int pilot_hooks_memory_free(void *ptr, int async, cudaStream_t stream, cudaError_t *err)
{
    for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
        if (h->on_memory_free && h->on_memory_free(ptr, async, stream, err))
            return 1;
    return 0;
}

void pilot_hooks_memory_freed(uint64_t ptr)
{
    for (const struct pilot_hook *h = __start_pilot_hooks; h < __stop_pilot_hooks; h++)
        if (h->on_memory_freed)
            h->on_memory_freed(ptr);
}

/* Registered before the program's constructors run (this library is loaded first), so a
 * program's own child handler that calls CUDA finds the shim reset. */
__attribute__((constructor)) static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, pilot_hooks_fork_child);
}
