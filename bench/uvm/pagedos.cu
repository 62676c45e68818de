// pagedos: PILOT's pageDoS (Fig. 2/4). --bytes (default 6GiB) of managed memory; each pass reads,
// increments and writes back one 4-byte word in every 4 KiB page of all of it, so that every page
// must be on the GPU during every pass: under oversubscription each pass migrates the buffer.
// The memory is allocated in pieces of --chunk bytes (default 512MiB; 0: one piece), one kernel
// per piece and pass: pilot emulates a smaller GPU at launch granularity (it evicts what a launch
// needs room for), so no single kernel may need more than the capacity it emulates. Runs --seconds S (or --passes N; default 10 passes), then a
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

#define MAX_CHUNKS 4096

int main(int argc, char **argv)
{
    size_t chunk = (size_t)512 << 20;
    int kept = 1;
    for (int i = 1; i < argc; i++) {  // --chunk SIZE is ours; the rest go to uvm_parse
        if (!strcmp(argv[i], "--chunk") && i + 1 < argc) {
            const char *v = argv[++i];
            chunk = strcmp(v, "0") ? parse_size(v) : 0;
            if (chunk == 0 && strcmp(v, "0")) {
                fprintf(stderr, "pagedos: bad --chunk %s\n", v);
                return 2;
            }
        } else {
            argv[kept++] = argv[i];
        }
    }
    argc = kept;
    struct uvm_opts o = uvm_parse(argc, argv, "touches one word per 4 KiB page of SIZE bytes "
                                  "of managed memory per pass ([--chunk SIZE] pieces)",
                                  (size_t)6 << 30, 10);
    size_t pages = o.bytes / 4096;
    if (pages == 0) {
        fprintf(stderr, "pagedos: --bytes must be at least 4096\n");
        return 2;
    }
    size_t chunk_pages = chunk ? (chunk / 4096 ? chunk / 4096 : 1) : pages;
    size_t nchunks = (pages + chunk_pages - 1) / chunk_pages;
    if (nchunks > MAX_CHUNKS) {
        fprintf(stderr, "pagedos: more than %d pieces; raise --chunk\n", MAX_CHUNKS);
        return 2;
    }
    const unsigned T = 256;
    double t_start = now_s();
    static unsigned *x[MAX_CHUNKS];
    size_t n[MAX_CHUNKS];
    unsigned long long *wrong;
    for (size_t c = 0; c < nchunks; c++) {
        n[c] = c + 1 < nchunks ? chunk_pages : pages - c * chunk_pages;
        CHECK(cudaMallocManaged(&x[c], n[c] * 4096, cudaMemAttachGlobal));
    }
    CHECK(cudaMallocManaged(&wrong, sizeof *wrong, cudaMemAttachGlobal));
    *wrong = 0;
    for (size_t c = 0; c < nchunks; c++)
        zero_pages<<<uvm_blocks(n[c], T), T>>>(x[c], n[c]);
    CHECK(cudaDeviceSynchronize());
    printf("uvm ready\n");  // allocated and on the GPU: the runner starts the other tenant now
    fflush(stdout);
    long passes = 0;
    double t0 = now_s();
    while (uvm_more(&o, passes, t0)) {
        for (size_t c = 0; c < nchunks; c++)
            touch_pages<<<uvm_blocks(n[c], T), T>>>(x[c], n[c]);
        CHECK(cudaDeviceSynchronize());
        passes++;
    }
    double kernel_s = now_s() - t0;
    for (size_t c = 0; c < nchunks; c++)
        count_wrong<<<uvm_blocks(n[c], T), T>>>(x[c], n[c], (unsigned)passes, wrong);
    CHECK(cudaDeviceSynchronize());
    int ok = *wrong == 0;
    if (!ok)
        fprintf(stderr, "pagedos: %llu of %zu pages do not hold %ld\n", *wrong, pages, passes);
    for (size_t c = 0; c < nchunks; c++)
        CHECK(cudaFree(x[c]));
    CHECK(cudaFree(wrong));
    uvm_report("pagedos", pages * 4096, passes, t_start, kernel_s, "", ok);
    return ok ? 0 : 1;
}
