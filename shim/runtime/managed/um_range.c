/* A managed allocation's own range: pilotd's managed memory (PILOT_OP_MALLOC_MANAGED) behind a
 * shadow at the same address here (coherence.c), and its release. cudaMallocManaged
 * (api_managed.c) makes one per allocation, um_pack.c one per range it packs small ones into. */
#include <unistd.h>

#include "log.h"
#include "shim.h"

#define SHADOW_ATTEMPTS 8 /* addresses tried before giving up on a managed allocation */

static uint64_t page_round(uint64_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) & ~(page - 1);
}

static void free_on_daemon(uint64_t ptr, int device)
{
    pilot_req_free req = {.ptr = ptr};
    pilot_call_on(device, PILOT_OP_FREE, &req, sizeof req, NULL, 0, NULL, 0, NULL, 0, NULL);
}

void pilot_um_release_range(uint64_t base, int device)
{
    free_on_daemon(base, device);
    pilot_um_remove(base);
}

cudaError_t pilot_um_new_range(uint64_t size, uint32_t flags, uint64_t *out)
{
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), len = page_round(size);
    const int device = pilot_route_device();
    uint64_t taken[SHADOW_ATTEMPTS], base = 0;
    int ntaken = 0;
    cudaError_t err;
    pilot_req_malloc_managed req = {.size = size, .flags = flags};
    for (;;) {
        pilot_rep_u64 rep;
        err = pilot_call(PILOT_OP_MALLOC_MANAGED, &req, sizeof req, NULL, 0, &rep, sizeof rep, NULL,
                         0, NULL);
        if (err)
            break;
        base = rep.value;
        if (base % page) {
            LOG_ERROR("managed allocation at %#llx is not page-aligned", (unsigned long long)base);
            free_on_daemon(base, device);
            err = cudaErrorMemoryAllocation;
            break;
        }
        int in_use;
        err = pilot_um_map_shadow(base, len, 1, PILOT_UM_ALLOCATION, &in_use);
        if (!err)
            break;
        if (!in_use || ntaken == SHADOW_ATTEMPTS) {
            free_on_daemon(base, device);
            break;
        }
        /* Keep it allocated while asking again, so the daemon hands out another address. */
        taken[ntaken++] = base;
    }
    while (ntaken > 0)
        free_on_daemon(taken[--ntaken], device);
    if (err == cudaSuccess)
        *out = base;
    return err;
}
