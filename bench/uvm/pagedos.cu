// pagedos: PILOT's pageDoS (Fig. 2/4). A managed buffer of --bytes (default 6GiB); each pass is
// one kernel that reads, increments and writes back one 4-byte word in every 4 KiB page of the
// whole buffer, so that every page must be on the GPU during every pass: under oversubscription
// each pass migrates the buffer. Runs --seconds S (or --passes N; default 10 passes), then a
// kernel checks that every touched word equals the number of passes. Prints
//   uvm prog=pagedos bytes=N passes=P wall_s=S kernel_s=S pass_s=S passes_per_s=R ok=1
// (kernel_s: the passes' time, pass_s: kernel_s / passes), after a line "uvm ready" once the
// buffer is allocated and initialised. SIGTERM ends it after the current
// pass, with the line printed and exit 0. Sized to fit the GPU it is a well-behaved program
// whose working set is all of its memory.
#include "uvm.h"

#define PAGE_WORDS 1024  // 4 KiB of unsigned ints

__global__ void zero_pages(unsigned *x, size_t pages)
{
    FOR_EACH(p, pages)
        x[p * PAGE_WORDS] = 0;
}

__global__ void touch_pages(unsigned *x, size_t pages)
{
    FOR_EACH(p, pages)
        x[p * PAGE_WORDS] += 1;
}

__global__ void count_wrong(const unsigned *x, size_t pages, unsigned expect,
                            unsigned long long *wrong)
{
    FOR_EACH(p, pages)
        if (x[p * PAGE_WORDS] != expect)
            atomicAdd(wrong, 1ull);
}

int main(int argc, char **argv)
{
    struct uvm_opts o = uvm_parse(argc, argv, "touches one word per 4 KiB page of SIZE bytes "
                                  "of managed memory per pass", (size_t)6 << 30, 10);
    size_t pages = o.bytes / 4096;
    if (pages == 0) {
        fprintf(stderr, "pagedos: --bytes must be at least 4096\n");
        return 2;
    }
    const unsigned T = 256, B = uvm_blocks(pages, T);
    double t_start = now_s();
    unsigned *x;
    unsigned long long *wrong;
    CHECK(cudaMallocManaged(&x, pages * 4096, cudaMemAttachGlobal));
    CHECK(cudaMallocManaged(&wrong, sizeof *wrong, cudaMemAttachGlobal));
    *wrong = 0;
    zero_pages<<<B, T>>>(x, pages);
    CHECK(cudaDeviceSynchronize());
    printf("uvm ready\n");  // allocated and on the GPU: the runner starts the other tenant now
    fflush(stdout);
    long passes = 0;
    double t0 = now_s();
    while (uvm_more(&o, passes, t0)) {
        touch_pages<<<B, T>>>(x, pages);
        CHECK(cudaDeviceSynchronize());
        passes++;
    }
    double kernel_s = now_s() - t0;
    count_wrong<<<B, T>>>(x, pages, (unsigned)passes, wrong);
    CHECK(cudaDeviceSynchronize());
    int ok = *wrong == 0;
    if (!ok)
        fprintf(stderr, "pagedos: %llu of %zu pages do not hold %ld\n", *wrong, pages, passes);
    CHECK(cudaFree(x));
    CHECK(cudaFree(wrong));
    uvm_report("pagedos", pages * 4096, passes, t_start, kernel_s, "", ok);
    return ok ? 0 : 1;
}
