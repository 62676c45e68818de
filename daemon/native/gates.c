/* Host-callback gates (see gates.h). Runs on the driver's callback thread: only a pipe write
 * and, without stream memory operations, a futex wait; never a CUDA call, never Python. */
#define _GNU_SOURCE
#include "gates.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static void notify(pilot_gate *g)
{
    uint64_t token = g->token;
    /* 8 bytes to a pipe: written whole or not at all (PIPE_BUF), so tokens never interleave. */
    while (write(g->fd, &token, sizeof token) < 0 && errno == EINTR)
        ;
}

void pilot_gate_fire(void *arg)
{
    pilot_gate *g = arg;
    /* Read before the token goes out: once the hub has it, the gate may open and the slot be
     * armed again with a later target, which this call must not wait for. */
    const uint32_t target = g->target, wait = g->wait;
    notify(g);
    if (!wait)
        return;
    for (;;) {
        uint32_t seen = __atomic_load_n(&g->word, __ATOMIC_ACQUIRE);
        if ((int32_t)(seen - target) >= 0)
            return;
        syscall(SYS_futex, &g->word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
    }
}

void pilot_gate_fire_status(void *stream, int status, void *arg)
{
    (void)stream;
    pilot_gate *g = arg;
    g->status = status;
    pilot_gate_fire(arg);
}

void pilot_gate_open(pilot_gate *g, uint32_t value)
{
    __atomic_store_n(&g->word, value, __ATOMIC_SEQ_CST);
    if (g->wait)
        syscall(SYS_futex, &g->word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
