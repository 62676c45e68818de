#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int g_level = -1;

static int read_level(void)
{
    const char *env = getenv("PILOT_LOG");
    if (!env || !env[0])
        return PILOT_LOG_WARN;
    if (!strcmp(env, "error")) return PILOT_LOG_ERROR;
    if (!strcmp(env, "warn")) return PILOT_LOG_WARN;
    if (!strcmp(env, "info")) return PILOT_LOG_INFO;
    if (!strcmp(env, "debug")) return PILOT_LOG_DEBUG;
    return PILOT_LOG_WARN;
}

int pilot_log_enabled(int level)
{
    int cur = __atomic_load_n(&g_level, __ATOMIC_RELAXED);
    if (cur < 0) {
        cur = read_level();
        __atomic_store_n(&g_level, cur, __ATOMIC_RELAXED);
    }
    return level <= cur;
}

void pilot_log_write(int level, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    char msg[1024];
    const char *base = strrchr(file, '/');
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One write() per line so lines from several threads do not interleave. */
    char out[1200];
    int n = snprintf(out, sizeof out, "[pilot %d %ld %s:%d] %s: %s\n", (int)getpid(),
                     (long)syscall(SYS_gettid), base ? base + 1 : file, line, names[level & 3], msg);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, out, (size_t)n < sizeof out ? (size_t)n : sizeof out - 1);
        (void)w;
    }
}

void pilot_log_unsupported(const char *name)
{
    LOG_WARN("%s is not supported by pilot yet; returning cudaErrorNotSupported", name);
}

void pilot_log_unsupported_driver(const char *name)
{
    LOG_WARN("%s is not supported by pilot yet; returning CUDA_ERROR_NOT_SUPPORTED", name);
}
