/* Shim logging: one macro family, lines tagged [pilot pid tid file:line], level from $PILOT_LOG
 * (error, warn, info, debug; default warn). The output lands in someone else's program, so the
 * shim stays quiet unless something is wrong. */
#ifndef PILOT_LOG_H
#define PILOT_LOG_H

enum pilot_log_level { PILOT_LOG_ERROR = 0, PILOT_LOG_WARN = 1, PILOT_LOG_INFO = 2, PILOT_LOG_DEBUG = 3 };

int pilot_log_enabled(int level);
void pilot_log_write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define PILOT_LOG(level, ...)                                                \
    do {                                                                     \
        if (pilot_log_enabled(level))                                        \
            pilot_log_write(level, __FILE__, __LINE__, __VA_ARGS__);         \
    } while (0)
#define LOG_ERROR(...) PILOT_LOG(PILOT_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) PILOT_LOG(PILOT_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) PILOT_LOG(PILOT_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) PILOT_LOG(PILOT_LOG_DEBUG, __VA_ARGS__)

/* Called by the generated stubs, once per unimplemented function. */
void pilot_log_unsupported(const char *name);
void pilot_log_unsupported_driver(const char *name); /* the driver API library's */

#endif
