// A host callback that blocks until the program releases it, for the tests of stream order
// (callbacks.cu, ptds.cu, free_async.cu): `hold` is queued on a stream, the main thread waits
// until it started, checks what it holds back, then releases it. `hold_bounded` gives up after
// GATE_PATIENCE_S seconds: a call that waited for the held stream then returns late instead of
// never, and `release` tells whether the program came in time.
#ifndef HOST_GATE_H
#define HOST_GATE_H

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

struct Gate {
    std::mutex m;
    std::condition_variable cv;
    bool started = false, released = false, gave_up = false;
};

#define GATE_PATIENCE_S 10

static void CUDART_CB hold(void *arg)
{
    Gate *g = (Gate *)arg;
    std::unique_lock<std::mutex> lock(g->m);
    g->started = true;
    g->cv.notify_all();
    g->cv.wait(lock, [g] { return g->released; });
}

static void CUDART_CB hold_bounded(void *arg)
{
    Gate *g = (Gate *)arg;
    std::unique_lock<std::mutex> lock(g->m);
    g->started = true;
    g->cv.notify_all();
    g->gave_up = !g->cv.wait_for(lock, std::chrono::seconds(GATE_PATIENCE_S),
                                 [g] { return g->released; });
}

static void wait_started(Gate *g)
{
    std::unique_lock<std::mutex> lock(g->m);
    g->cv.wait(lock, [g] { return g->started; });
}

// Whether the gate was still holding its stream (hold_bounded had not given up).
static bool release(Gate *g)
{
    std::lock_guard<std::mutex> lock(g->m);
    g->released = true;
    g->cv.notify_all();
    return !g->gave_up;
}

#endif
