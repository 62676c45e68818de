/* Large staging copies on two threads: the calling thread and one helper the shim starts on
 * first use. One core's memcpy is what limits a pipelined pageable transfer (the DMA engine is
 * several times faster), so splitting each chunk roughly halves the host-side time.
 *
 * The helper polls for work for a short while after each job, so the chunks of one transfer
 * reach it without a scheduler wake-up, then sleeps on a condition variable. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "shim.h"
#include "hooks.h"

#define SPLIT_MIN (512u << 10) /* below this one thread is as fast */
#define HELPER_SPIN_US 300

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work;
    pthread_t thread;
    int started, failed;
    void *dst;
    const void *src;
    size_t len;
    int busy; /* set by the caller, cleared by the helper when its half is copied */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER};

static long elapsed_us(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000L + (t.tv_nsec - t0->tv_nsec) / 1000;
}

static void *helper(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (!__atomic_load_n(&g.busy, __ATOMIC_ACQUIRE) && elapsed_us(&t0) < HELPER_SPIN_US)
            ;
        pthread_mutex_lock(&g.lock);
        while (!g.busy)
            pthread_cond_wait(&g.work, &g.lock);
        void *dst = g.dst;
        const void *src = g.src;
        size_t len = g.len;
        pthread_mutex_unlock(&g.lock);
        memcpy(dst, src, len);
        pthread_mutex_lock(&g.lock);
        __atomic_store_n(&g.busy, 0, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&g.lock);
    }
    return NULL;
}

static int helper_ready(void)
{
    if (__atomic_load_n(&g.started, __ATOMIC_ACQUIRE))
        return 1;
    if (g.failed)
        return 0;
    pthread_mutex_lock(&g.lock);
    if (!g.started && !g.failed) {
        pthread_attr_t attr;
        sigset_t all, old;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        /* The helper must never take the program's signals. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&g.thread, &attr, helper, NULL) == 0)
            __atomic_store_n(&g.started, 1, __ATOMIC_RELEASE);
        else
            g.failed = 1;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&g.lock);
    return g.started;
}

/* Not reentrant: staged transfers hold the session lock, so one runs at a time. */
void pilot_copy(void *dst, const void *src, size_t len)
{
    if (len < SPLIT_MIN || !helper_ready()) {
        memcpy(dst, src, len);
        return;
    }
    size_t half = (len / 2) & ~(size_t)4095;
    pthread_mutex_lock(&g.lock);
    g.dst = (char *)dst + half;
    g.src = (const char *)src + half;
    g.len = len - half;
    __atomic_store_n(&g.busy, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&g.work);
    pthread_mutex_unlock(&g.lock);
    memcpy(dst, src, half);
    while (__atomic_load_n(&g.busy, __ATOMIC_ACQUIRE)) /* the other half is about as long */
        ;
}

static void fork_child(void)
{
    /* After fork the helper thread does not exist in the child. */
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.work, NULL);
    g.started = 0;
    g.failed = 0;
    g.busy = 0;
}

PILOT_HOOK(parallel_copy, .on_fork_child = fork_child);
