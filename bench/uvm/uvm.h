// What the bench/uvm programs share: CHECK, sizes with units, a monotonic clock, the options
// every program takes and the one result line the runner (bench/policy_runner.py) parses:
//   uvm prog=NAME bytes=N wall_s=S kernel_s=S ... ok=1|0
// Options: --bytes SIZE (managed memory in all; 4096, 64MiB, 6GiB, 1.5G), --seconds S (run
// passes until S seconds have gone by), --passes N (or exactly N passes; with neither, the
// program's default pass count). SIGTERM or SIGINT ends the pass loop after the pass under way:
// the program checks its result, prints its line and exits 0.
#pragma once
#include <cuda_runtime.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../check.h"

static volatile sig_atomic_t uvm_stop = 0;

static void uvm_on_signal(int sig)
{
    (void)sig;
    uvm_stop = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// "6GiB", "512MiB", "64M", "1.5G", "4096": bytes; 0 on a malformed size.
static size_t parse_size(const char *text)
{
    char *end;
    double v = strtod(text, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024;
    else if (*end == 'T' || *end == 't') mul = 1024.0 * 1024 * 1024 * 1024;
    else if (*end != '\0' && strcmp(end, "B") != 0) return 0;
    if (mul > 1) {
        end++;
        if (*end == 'i') end++;
        if (*end == 'B') end++;
        if (*end != '\0') return 0;
    }
    return v > 0 ? (size_t)(v * mul) : 0;
}

struct uvm_opts {
    size_t bytes;
    double seconds;  // 0: by passes
    long passes;
};

// Parses --bytes/--seconds/--passes (other words: usage); installs the stop handlers.
static struct uvm_opts uvm_parse(int argc, char **argv, const char *usage, size_t default_bytes,
                                 long default_passes)
{
    struct uvm_opts o = {default_bytes, 0.0, 0};
    for (int i = 1; i < argc; i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--bytes") && val) o.bytes = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && val) o.seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && val) o.passes = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--bytes SIZE] [--seconds S | --passes N]\n%s\n", argv[0],
                    usage);
            exit(2);
        }
    }
    if (o.bytes == 0 || o.seconds < 0 || o.passes < 0) {
        fprintf(stderr, "%s: bad --bytes, --seconds or --passes\n", argv[0]);
        exit(2);
    }
    if (o.seconds == 0 && o.passes == 0) o.passes = default_passes;
    signal(SIGTERM, uvm_on_signal);
    signal(SIGINT, uvm_on_signal);
    return o;
}

// Whether another pass should start: passes or seconds left, no stop signal.
static int uvm_more(const struct uvm_opts *o, long done, double t0)
{
    if (uvm_stop) return 0;
    if (o->seconds > 0) return now_s() - t0 < o->seconds;
    return done < o->passes;
}

// Grid-stride loop: i runs over [0, n) across the whole grid.
#define FOR_EACH(i, n)                                                         \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

// The line every program prints last; extra: more " key=value" pairs (may be "").
static void uvm_report(const char *prog, size_t bytes, long passes, double t_start,
                       double kernel_s, const char *extra, int ok)
{
    printf("uvm prog=%s bytes=%zu passes=%ld wall_s=%.4f kernel_s=%.4f pass_s=%.6f "
           "passes_per_s=%.3f%s ok=%d\n", prog, bytes, passes, now_s() - t_start, kernel_s,
           passes ? kernel_s / passes : 0.0, kernel_s > 0 ? passes / kernel_s : 0.0, extra, ok);
    fflush(stdout);
}

// A grid of at most 65535*k blocks over n items (grid-stride kernels cover the rest).
static unsigned uvm_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 1u << 20 ? 1u << 20 : b);
}
