// CUDA IPC between two processes, as the CUDA samples' simpleIPC and torch.multiprocessing use
// it: the parent exports a device allocation and an interprocess event, the child opens both,
// waits on the event, reads and writes the memory; the parent frees its allocation while the
// child still holds it (the child keeps reading what was there), and the misuses CUDA refuses.
// The processes fork before either touches CUDA and talk through pipes. With `other-user` (run
// as root) the child becomes user nobody first: under pilot another tenant, whose open fails.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#define N (1 << 20)

#define CHECK(call)                                                                  \
    do {                                                                             \
        cudaError_t err_ = (call);                                                   \
        if (err_ != cudaSuccess) {                                                   \
            printf("%s: %s at line %d\n", #call, cudaGetErrorName(err_), __LINE__);  \
            return 1;                                                                \
        }                                                                            \
    } while (0)

struct Handles {
    cudaIpcMemHandle_t mem;
    cudaIpcMemHandle_t driver_mem;  // the same allocation's, from the driver API
    cudaIpcEventHandle_t event;
};

// The driver API's IPC calls, reached through the runtime (no -lcuda): CUipcMemHandle has
// cudaIpcMemHandle_t's layout.
typedef int (*cu_get_mem_handle)(cudaIpcMemHandle_t *, unsigned long long);
typedef int (*cu_open_mem_handle)(unsigned long long *, cudaIpcMemHandle_t, unsigned int);
typedef int (*cu_close_mem_handle)(unsigned long long);

static void *driver_function(const char *name)
{
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 13000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
        return nullptr;
    return fn;
}

static void say(int fd, char c) { (void)!write(fd, &c, 1); }

static char hear(int fd)
{
    char c = 0;
    return read(fd, &c, 1) == 1 ? c : 0;
}

static long sum(const int *v, int n)
{
    long s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return s;
}

static int child(int in, int out, bool other_user)
{
    if (other_user && (setgroups(0, nullptr) || setgid(65534) || setuid(65534)))
        return 1;
    Handles h;
    if (read(in, &h, sizeof h) != (ssize_t)sizeof h)
        return 1;
    if (other_user) {
        void *p = nullptr;
        printf("child (another user): opening the handle fails: %d\n",
               cudaIpcOpenMemHandle(&p, h.mem, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess);
        fflush(stdout);
        say(out, 'x');
        return 0;
    }
    static int host[N];
    int *d = nullptr, *again = nullptr;
    cudaEvent_t ev;
    CHECK(cudaIpcOpenMemHandle((void **)&d, h.mem, cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenMemHandle((void **)&again, h.mem, cudaIpcMemLazyEnablePeerAccess));
    printf("child: opened twice at one address: %d\n", d == again);
    auto cu_open = (cu_open_mem_handle)driver_function("cuIpcOpenMemHandle");
    auto cu_close = (cu_close_mem_handle)driver_function("cuIpcCloseMemHandle");
    unsigned long long by_driver = 0;
    int opened = cu_open && cu_close ? cu_open(&by_driver, h.driver_mem, 1) : -1;
    printf("child: the driver API opens it at that address too: %d\n",
           opened == 0 && by_driver == (unsigned long long)(uintptr_t)d);
    printf("child: and closes it: %d\n", opened == 0 && cu_close(by_driver) == 0);
    CHECK(cudaIpcOpenEventHandle(&ev, h.event));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamWaitEvent(s, ev, 0));
    CHECK(cudaMemcpyAsync(host, d, sizeof host, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    printf("child: read the parent's data: sum %ld\n", sum(host, N));
    cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, d + 10));
    printf("child: the range is device memory: %d\n", attr.type == cudaMemoryTypeDevice);
    CHECK(cudaMemset(d, 0, 1024 * sizeof(int)));  // the parent sees this
    CHECK(cudaMemcpy(d + 1024, host + 1024, 16, cudaMemcpyDefault));
    CHECK(cudaDeviceSynchronize());
    fflush(stdout);
    say(out, 'w');
    if (hear(in) != 'f')  // the parent freed its allocation
        return 1;
    CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
    printf("child: after the parent's cudaFree it still reads: sum %ld\n", sum(host, N));
    printf("child: cudaFree of the opened memory: %s\n", cudaGetErrorName(cudaFree(d)));
    cudaGetLastError();
    CHECK(cudaIpcCloseMemHandle(again));
    CHECK(cudaMemcpy(host, d, 4, cudaMemcpyDeviceToHost));  // opened once more: still held
    CHECK(cudaIpcCloseMemHandle(d));
    printf("child: closing it a third time: %s\n", cudaGetErrorName(cudaIpcCloseMemHandle(d)));
    cudaGetLastError();
    cudaIpcMemHandle_t bogus;
    memset(&bogus, 0x5a, sizeof bogus);
    void *p = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&p, bogus, cudaIpcMemLazyEnablePeerAccess);
    printf("child: opening a made-up handle fails: %d\n", err != cudaSuccess);
    cudaGetLastError();
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(s));
    fflush(stdout);
    say(out, 'c');
    return 0;
}

static int parent(int in, int out, pid_t kid)
{
    static int host[N];
    for (int i = 0; i < N; i++)
        host[i] = i % 1000;
    int *d = nullptr;
    CHECK(cudaMalloc(&d, sizeof host));
    CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));
    cudaEvent_t ev, plain;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
    CHECK(cudaEventCreate(&plain));
    CHECK(cudaEventRecord(ev, 0));
    Handles h;
    cudaIpcMemHandle_t inner;
    CHECK(cudaIpcGetMemHandle(&h.mem, d));
    CHECK(cudaIpcGetMemHandle(&inner, d + 4096));
    printf("parent: a pointer inside the allocation gives its handle: %d\n",
           memcmp(&h.mem, &inner, sizeof inner) == 0);
    CHECK(cudaIpcGetEventHandle(&h.event, ev));
    auto cu_get = (cu_get_mem_handle)driver_function("cuIpcGetMemHandle");
    printf("parent: the driver API makes a handle too: %d\n",
           cu_get && cu_get(&h.driver_mem, (unsigned long long)(uintptr_t)d) == 0);
    cudaIpcEventHandle_t eh;
    printf("parent: a handle of an event without cudaEventInterprocess fails: %d\n",
           cudaIpcGetEventHandle(&eh, plain) != cudaSuccess);
    cudaGetLastError();
    int *own = nullptr;
    printf("parent: opening its own handle fails: %d\n",
           cudaIpcOpenMemHandle((void **)&own, h.mem, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess);
    cudaGetLastError();
    if (write(out, &h, sizeof h) != (ssize_t)sizeof h)
        return 1;
    fflush(stdout);
    char heard = hear(in);
    if (heard == 'x') {  // the child could not open it
        int status = 0;
        waitpid(kid, &status, 0);
        CHECK(cudaFree(d));
        printf("parent: child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 0;
    }
    if (heard != 'w')
        return 1;
    CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
    printf("parent: sees the child's writes: sum %ld\n", sum(host, N));
    CHECK(cudaFree(d));
    fflush(stdout);
    say(out, 'f');
    if (hear(in) != 'c')
        return 1;
    int status = 0;
    waitpid(kid, &status, 0);
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaEventDestroy(plain));
    printf("parent: child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

int main(int argc, char **argv)
{
    bool other_user = argc > 1 && strcmp(argv[1], "other-user") == 0;
    int down[2], up[2];
    if (pipe(down) || pipe(up))
        return 1;
    fflush(stdout);
    pid_t kid = fork();
    if (kid == 0) {
        int rc = child(down[0], up[1], other_user);
        fflush(stdout);
        if (rc)
            say(up[1], 'x');
        return rc;
    }
    return parent(up[0], down[1], kid);
}
