// host_pages: what host memory costs, for choosing how Unified Memory shadows are backed.
// For a buffer of MiB (default 1024) it times, per backing:
//   touch     the host writes every float once (what a program's initialisation does)
//   register  cudaHostRegister of the whole buffer (what pinning a shadow costs)
//   unmap     munmap (what cudaFree of a shadow costs the client)
// Backings: anonymous private pages, the same with MADV_HUGEPAGE, a memfd (shared memory, as a
// shadow is), a memfd with MADV_HUGEPAGE, a memfd that another thread populates while the host
// writes (MADV_POPULATE_WRITE through a second mapping, as a daemon could), a memfd populated
// before the writes, and cudaMallocManaged (native Unified Memory, touch only). Then shadow-like
// runs: a read-only memfd mapping opened for writing 2 MiB at a time, as the first shim design
// did, optionally populated per chunk (MADV_POPULATE_WRITE) and by helper threads ahead
// (MADV_POPULATE_READ), with the daemon's side: registering a second mapping of it.
// Prints `backing touch_s register_s unmap_s` lines, then the kernel's THP settings. This is
// the measurement behind shim/runtime/managed/coherence.c's private huge-page shadows (bench/RESULTS.md).
// Usage: host_pages [MiB]
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double touch(float *p, size_t bytes)
{
    double t0 = now_s();
    size_t n = bytes / sizeof(float);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(i & 1023);
    return now_s() - t0;
}

struct populate_arg {
    int fd;
    size_t bytes;
    double seconds;
};

static void *populate(void *argp)
{
    struct populate_arg *arg = (struct populate_arg *)argp;
    double t0 = now_s();
    void *view = mmap(NULL, arg->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arg->fd, 0);
    if (view != MAP_FAILED) {
        if (madvise(view, arg->bytes, MADV_POPULATE_WRITE) != 0)
            perror("madvise(MADV_POPULATE_WRITE)");
        munmap(view, arg->bytes);
    }
    arg->seconds = now_s() - t0;
    return NULL;
}

enum backing { ANON, ANON_HUGE, MEMFD, MEMFD_HUGE, MEMFD_POPULATING, MEMFD_POPULATED, NBACKINGS };

static const char *const NAMES[] = {"anon",           "anon_hugepage",       "memfd",
                                    "memfd_hugepage", "memfd_populating_thread", "memfd_prepopulated"};

// ---- shadow-like: a read-only memfd mapping opened chunk by chunk (as coherence.c does) ----
static const size_t CHUNK = 2u << 20;

struct ahead {
    char *base;
    size_t nchunks, stride, first;
    int advice;
    volatile size_t *done; // chunks [0, *done) populated by this thread's lane
};

static void *populate_ahead(void *argp)
{
    struct ahead *a = (struct ahead *)argp;
    for (size_t i = a->first; i < a->nchunks; i += a->stride)
        if (madvise(a->base + i * CHUNK, CHUNK, a->advice) != 0) {
            perror("madvise ahead");
            break;
        }
    return NULL;
}

// mode 0: open RW, write. 1: open RW, MADV_POPULATE_WRITE the chunk, write.
// 2/3: `helpers` threads MADV_POPULATE_READ ahead on the read-only mapping; per chunk open RW
// (mode 3 also MADV_POPULATE_WRITE), write. Then the daemon's side: a second mapping of the
// memfd registered (its pages exist, its PTEs do not), and the unmap.
static void shadow_like(int mode, int helpers, size_t bytes)
{
    int fd = memfd_create("host_pages", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        perror("memfd");
        return;
    }
    char *p = (char *)mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    size_t nchunks = bytes / CHUNK;
    pthread_t threads[16];
    struct ahead lanes[16];
    double t0 = now_s();
    for (int h = 0; h < helpers; h++) {
        lanes[h] = (struct ahead){p, nchunks, (size_t)helpers, (size_t)h, MADV_POPULATE_READ, NULL};
        pthread_create(&threads[h], NULL, populate_ahead, &lanes[h]);
    }
    size_t per_chunk = CHUNK / sizeof(float);
    for (size_t c = 0; c < nchunks; c++) {
        char *chunk = p + c * CHUNK;
        mprotect(chunk, CHUNK, PROT_READ | PROT_WRITE);
        if (mode == 1 || mode == 3)
            madvise(chunk, CHUNK, MADV_POPULATE_WRITE);
        float *f = (float *)chunk;
        for (size_t i = 0; i < per_chunk; i++)
            f[i] = (float)(i & 1023);
    }
    double t_touch = now_s() - t0;
    for (int h = 0; h < helpers; h++)
        pthread_join(threads[h], NULL);
    double t_joined = now_s() - t0;
    char *view = (char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    t0 = now_s();
    cudaError_t err = cudaHostRegister(view, bytes, cudaHostRegisterPortable);
    double t_reg = now_s() - t0;
    if (err == cudaSuccess)
        cudaHostUnregister(view);
    munmap(view, bytes);
    view = (char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    t0 = now_s();
    madvise(view, bytes, MADV_POPULATE_WRITE);
    double t_viewpop = now_s() - t0;
    t0 = now_s();
    err = cudaHostRegister(view, bytes, cudaHostRegisterPortable);
    double t_reg2 = now_s() - t0;
    if (err == cudaSuccess)
        cudaHostUnregister(view);
    munmap(view, bytes);
    t0 = now_s();
    munmap(p, bytes);
    double t_unmap = now_s() - t0;
    close(fd);
    printf("shadow mode %d helpers %-2d %.3f %.3f %.3f   (helpers joined %.3f; view populate %.3f "
           "then register %.3f)\n",
           mode, helpers, t_touch, t_reg, t_unmap, t_joined, t_viewpop, t_reg2);
}

static void run(enum backing b, size_t bytes)
{
    int fd = -1;
    void *p;
    if (b == ANON || b == ANON_HUGE) {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    } else {
        fd = memfd_create("host_pages", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
            perror("memfd");
            return;
        }
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (p == MAP_FAILED) {
        perror("mmap");
        return;
    }
    if ((b == ANON_HUGE || b == MEMFD_HUGE) && madvise(p, bytes, MADV_HUGEPAGE) != 0)
        perror("madvise(MADV_HUGEPAGE)");
    struct populate_arg arg = {fd, bytes, 0};
    pthread_t thread;
    if (b == MEMFD_POPULATED)
        populate(&arg);
    if (b == MEMFD_POPULATING)
        pthread_create(&thread, NULL, populate, &arg);
    double t_touch = touch((float *)p, bytes);
    if (b == MEMFD_POPULATING)
        pthread_join(thread, NULL);
    double t0 = now_s();
    cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    double t_reg = now_s() - t0;
    if (err != cudaSuccess)
        printf("# %s: cudaHostRegister: %s\n", NAMES[b], cudaGetErrorName(err));
    else
        cudaHostUnregister(p);
    t0 = now_s();
    munmap(p, bytes);
    double t_unmap = now_s() - t0;
    if (fd >= 0)
        close(fd);
    printf("%-24s %.3f %.3f %.3f", NAMES[b], t_touch, t_reg, t_unmap);
    if (b == MEMFD_POPULATED || b == MEMFD_POPULATING)
        printf("   (populate %.3f s)", arg.seconds);
    printf("\n");
}

static void managed(size_t bytes)
{
    float *p;
    if (cudaMallocManaged(&p, bytes, cudaMemAttachGlobal) != cudaSuccess) {
        printf("# cudaMallocManaged failed\n");
        return;
    }
    double t_touch = touch(p, bytes);
    double t0 = now_s();
    cudaFree(p);
    printf("%-24s %.3f -     %.3f\n", "managed (native)", t_touch, now_s() - t0);
}

static void show(const char *path)
{
    char line[256] = "";
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(line, sizeof line, f))
            line[0] = 0;
        fclose(f);
    }
    line[strcspn(line, "\n")] = 0;
    printf("# %s: %s\n", path, f ? line : "(absent)");
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
    size_t bytes = mib << 20, free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    if (free_b < 2 * bytes) {
        fprintf(stderr, "refusing: %zu MiB free on the GPU, need %zu\n", free_b >> 20, 2 * mib);
        return 1;
    }
    printf("# %zu MiB; backing touch_s register_s unmap_s\n", mib);
    for (int round = 0; round < 2; round++)
        for (int b = ANON; b < NBACKINGS; b++)
            run((enum backing)b, bytes);
    static const int variants[][2] = {{0, 0}, {1, 0}, {2, 1}, {3, 1}, {2, 4}, {3, 4}, {2, 8}, {3, 8}};
    for (int round = 0; round < 2; round++)
        for (const auto &v : variants)
            shadow_like(v[0], v[1], bytes);
    managed(bytes);
    managed(bytes);
    show("/sys/kernel/mm/transparent_hugepage/enabled");
    show("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    show("/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled");
    show("/proc/sys/kernel/osrelease");
    return 0;
}
