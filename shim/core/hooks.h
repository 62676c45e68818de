/* Events a module of libpilot.so takes part in, registered where the module is.
 *
 * A module that keeps state of the session declares what it does after fork() (in the child),
 * after cudaDeviceReset(), when the program unregisters a fatbin or when a module with
 * __managed__ variables is loaded, with PILOT_HOOK; the event's owner calls pilot_hooks_...()
 * and never names the modules. The entries are const data the
 * linker gathers into one section (pilot_hooks), so registering references no symbol: a module
 * registers without depending on the registry's callers, and the registry on none of them. */
#ifndef PILOT_HOOKS_H
#define PILOT_HOOKS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

struct pilot_image;
struct gmem;

struct pilot_hook {
    /* In the child after fork(): forget the parent's session (its own module's state only; it
     * talks to no daemon and waits for no other module). Run in link order (shim/build.py's
     * SHIM_SOURCES), the order the modules' own pthread_atfork handlers once ran in. */
    void (*on_fork_child)(void);
    /* After cudaDeviceReset() succeeded on device: drop what the reset destroyed. Run by rank,
     * lower first (equal ranks in link order). */
    void (*on_device_reset)(int device);
    int reset_rank;
    /* The program unregistered a fatbin (registry.c): forget what was kept of its image. */
    void (*on_image_unregister)(struct pilot_image *img);
    /* registry.c loaded a module with a __managed__ variable `name` (module: the daemon's handle,
     * on device 0): bind it and fill *host_ptr. */
    cudaError_t (*on_managed_variable)(uint64_t module, const char *name, void **host_ptr);
    /* Stream capture made an allocation node (cudaMallocAsync): make its memory (graph_mem.c,
     * through the memory API, which itself asks stream capture about every call). */
    cudaError_t (*on_graph_memory_alloc)(const struct cudaMemAllocNodeParams *p, struct gmem **out);
    /* Graph allocations were released (graph_model.c's table): free their memory (graph_mem.c). */
    void (*on_graph_memory_released)(void);
    /* The program frees ptr (cudaFree; async: cudaFreeAsync on stream): 1 if the memory is the
     * module's to free (graph memory, graph_mem.c), with *err the free's result; 0 to let the
     * free go on. */
    int (*on_memory_free)(void *ptr, int async, cudaStream_t stream, cudaError_t *err);
    /* cudaFree freed the device memory at ptr: forget it (a pool's allocation, api_mempool.c). */
    void (*on_memory_freed)(uint64_t ptr);
};

/* Ranks of the device-reset hooks: the session's tables first, the managed ranges last (um_pack
 * releases its packed ranges through the managed ranges that coherence then drops). */
enum {
    PILOT_RESET_ALLOCATIONS = 10,
    PILOT_RESET_ARRAYS = 20,
    PILOT_RESET_OBJECTS = 30,
    PILOT_RESET_STREAMS = 40,
    PILOT_RESET_PACKED_MANAGED = 50,
    PILOT_RESET_MANAGED = 60,
};

/* Registers this module's hooks: PILOT_HOOK(name, .on_fork_child = fork_child, ...). */
#define PILOT_HOOK(name, ...)                                                                     \
    static const struct pilot_hook pilot_hook_##name                                             \
        __attribute__((used, section("pilot_hooks"), aligned(sizeof(void *)))) = {__VA_ARGS__}

/* Every module's on_fork_child (registered with pthread_atfork once, at load). */
void pilot_hooks_fork_child(void);
/* Every module's on_device_reset for device, by rank. */
void pilot_hooks_device_reset(int device);
/* Every module's on_image_unregister, in link order. */
void pilot_hooks_image_unregister(struct pilot_image *img);
/* Every module's on_managed_variable, in link order; the first error, else cudaSuccess. */
cudaError_t pilot_hooks_managed_variable(uint64_t module, const char *name, void **host_ptr);
/* The first on_graph_memory_alloc's answer (one module makes graph memory);
 * cudaErrorNotSupported if none is registered. */
cudaError_t pilot_hooks_graph_memory_alloc(const struct cudaMemAllocNodeParams *p, struct gmem **out);
/* Every module's on_graph_memory_released, in link order. */
void pilot_hooks_graph_memory_released(void);
/* The first on_memory_free that claims ptr: 1 (*err set), else 0. */
int pilot_hooks_memory_free(void *ptr, int async, cudaStream_t stream, cudaError_t *err);
/* Every module's on_memory_freed, in link order. */
void pilot_hooks_memory_freed(uint64_t ptr);

#endif
