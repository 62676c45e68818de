// A host callback that blocks until the program releases it, for the tests of stream order
// (callbacks.cu, ptds.cu): `hold` is queued on a stream, the main thread waits until it
// started, checks what it holds back, then releases it.
#ifndef HOST_GATE_H
#define HOST_GATE_H

#include <cuda_runtime.h>

#include <condition_variable>
#include <mutex>

struct Gate {
    std::mutex m;
    std::condition_variable cv;
    bool started = false, released = false;
};

static void CUDART_CB hold(void *arg)
{
    Gate *g = (Gate *)arg;
    std::unique_lock<std::mutex> lock(g->m);
    g->started = true;
    g->cv.notify_all();
    g->cv.wait(lock, [g] { return g->released; });
}

static void wait_started(Gate *g)
{
    std::unique_lock<std::mutex> lock(g->m);
    g->cv.wait(lock, [g] { return g->started; });
}

static void release(Gate *g)
{
    std::lock_guard<std::mutex> lock(g->m);
    g->released = true;
    g->cv.notify_all();
}

#endif
