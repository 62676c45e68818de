/* The sessions' staging areas (api_memory.c's top comment): one per device part, opened on first
 * use, and the pipelined copies through them. Below api_memory.c and managed memory
 * (coherence.c uploads through it), which both copy through it. */
#include <pthread.h>
#include <string.h>

#include "shim.h"
#include "hooks.h"

static pthread_mutex_t g_stage_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pilot_staging g_stages[PILOT_MAX_DEVICES]; /* one per device part */

static void fork_child(void)
{
    /* After fork the mappings belong to the parent's session; the child opens its own. */
    pthread_mutex_init(&g_stage_lock, NULL);
    for (int d = 0; d < PILOT_MAX_DEVICES; d++)
        pilot_staging_unmap(&g_stages[d]);
}

PILOT_HOOK(staging, .on_fork_child = fork_child);

/* The route device's staging area, opened on first use. */
static cudaError_t staging_open(struct pilot_staging **out)
{
    cudaError_t err = cudaSuccess;
    struct pilot_staging *stage = &g_stages[pilot_route_device()];
    *out = stage;
    pthread_mutex_lock(&g_stage_lock);
    if (!stage->base) {
        pilot_req_staging_open req = {.min_bytes = 0};
        pilot_rep_staging rep;
        err = pilot_call(PILOT_OP_STAGING_OPEN, &req, sizeof req, NULL, 0, &rep, sizeof rep, NULL, 0,
                         NULL);
        if (err == cudaSuccess)
            err = pilot_staging_map(&rep, stage);
    }
    pthread_mutex_unlock(&g_stage_lock);
    return err;
}

cudaError_t pilot_staging_ready(void)
{
    struct pilot_staging *stage;
    return staging_open(&stage);
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

cudaError_t pilot_staged_h2d(uint16_t op, uint64_t dst, const uint8_t *src, uint64_t count,
                            uint64_t stream, uint32_t sync)
{
    struct pilot_staging *stage;
    cudaError_t err = staging_open(&stage);
    if (err)
        return err;
    if ((err = pilot_lock_session()))
        return err;
    const uint64_t slot = stage->slot_bytes, nchunks = (count + slot - 1) / slot;
    uint32_t outstanding = 0;
    cudaError_t first = cudaSuccess;
    pilot_rep_status rep;
    for (uint64_t i = 0; i < nchunks && first == cudaSuccess; i++) {
        if (outstanding == stage->slots) {
            first = pilot_recv_locked(&rep, sizeof rep);
            outstanding--;
            if (first)
                break;
        }
        uint64_t off = i * slot, len = min_u64(slot, count - off);
        uint32_t s = (uint32_t)(i % stage->slots);
        pilot_copy(stage->base + s * slot, src + off, len);
        pilot_req_memcpy req = {.dst = dst + off, .count = len, .stream = stream, .slot = s,
                                .sync = sync};
        first = pilot_send_locked(op, 0, &req, sizeof req, NULL, 0);
        if (first == cudaSuccess)
            outstanding++;
    }
    while (outstanding-- > 0) {
        cudaError_t e = pilot_recv_locked(&rep, sizeof rep);
        if (first == cudaSuccess)
            first = e;
        if (e == cudaErrorDevicesUnavailable)
            break;
    }
    pilot_unlock_session();
    return first;
}


cudaError_t pilot_staged_upload(uint16_t op, uint64_t dst, const void *src, uint64_t count)
{
    return pilot_staged_h2d(op, dst, src, count, 0, 1);
}

cudaError_t pilot_staged_d2h(uint8_t *dst, uint64_t src, uint64_t count, uint64_t stream,
                            uint32_t sync)
{
    struct pilot_staging *stage;
    cudaError_t err = staging_open(&stage);
    if (err)
        return err;
    if ((err = pilot_lock_session()))
        return err;
    const uint64_t slot = stage->slot_bytes, nchunks = (count + slot - 1) / slot;
    uint64_t sent = 0;
    uint32_t outstanding = 0;
    cudaError_t first = cudaSuccess;
    pilot_rep_status rep;
    for (; sent < nchunks && sent < stage->slots && first == cudaSuccess; sent++) {
        uint64_t off = sent * slot;
        pilot_req_memcpy req = {.src = src + off, .count = min_u64(slot, count - off),
                                .stream = stream, .slot = (uint32_t)sent, .sync = sync};
        first = pilot_send_locked(PILOT_OP_MEMCPY_D2H_STAGED, 0, &req, sizeof req, NULL, 0);
        if (first == cudaSuccess)
            outstanding++;
    }
    for (uint64_t i = 0; i < nchunks && outstanding > 0; i++) {
        cudaError_t e = pilot_recv_locked(&rep, sizeof rep);
        outstanding--;
        if (e != cudaSuccess) {
            if (first == cudaSuccess)
                first = e;
            if (e == cudaErrorDevicesUnavailable)
                break;
            continue; /* drain what is in flight */
        }
        if (first != cudaSuccess)
            continue;
        uint64_t off = i * slot, len = min_u64(slot, count - off);
        uint32_t s = (uint32_t)(i % stage->slots);
        pilot_copy(dst + off, stage->base + s * slot, len);
        if (sent < nchunks) {
            uint64_t noff = sent * slot;
            pilot_req_memcpy req = {.src = src + noff, .count = min_u64(slot, count - noff),
                                    .stream = stream, .slot = s, .sync = sync};
            first = pilot_send_locked(PILOT_OP_MEMCPY_D2H_STAGED, 0, &req, sizeof req, NULL, 0);
            if (first == cudaSuccess) {
                outstanding++;
                sent++;
            }
        }
    }
    pilot_unlock_session();
    return first;
}
