/* um_counters: a CUPTI injection library that counts the Unified Memory traffic of a process.
 *
 *   CUDA_INJECTION64_PATH=/abs/libumcounters.so UM_COUNTERS_OUT=/tmp/um.json ./program
 *
 * The driver loads it at cuInit and calls InitializeInjection, which configures CUPTI's Unified
 * Memory counters (BYTES_TRANSFER_HTOD, BYTES_TRANSFER_DTOH, GPU_PAGE_FAULT, CPU_PAGE_FAULT_COUNT,
 * THRASHING; a kind CUPTI refuses is left out and named in "failed") and enables
 * CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER. Records are summed per kind and written as one
 * JSON object to UM_COUNTERS_OUT ("%p" in it becomes the pid):
 *   {"htod_bytes", "dtoh_bytes", "gpu_page_faults", "gpu_page_fault_records",
 *    "cpu_page_faults", "thrashing", "thrashing_bytes", "records", "dropped", "flushes",
 *    "final", "pid", "configured": [...], "failed": [...]}
 * gpu_page_faults is the sum of the GPU_PAGE_FAULT records' values: CUPTI reports GPU faults as
 * one record per faulting page whose value is the number of fault *groups* (the driver batches
 * faults), so it counts fault groups per page, not individual faulting accesses; cpu_page_faults
 * and thrashing count records (a CPU fault record's value is a program counter, a thrashing
 * record's value the region's size, summed in thrashing_bytes).
 *
 * The file is rewritten atomically (write to FILE.tmp, rename) every 0.5 s by a background
 * thread that forces a flush of CUPTI's buffers first (so a reader sees totals at most ~0.5 s
 * old while the process runs, and a SIGKILLed process leaves its last totals), and at exit
 * (atexit: forced flush, "final": true). Messages go to stderr, prefixed "um_counters:".
 */
#include <cupti.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUF_SIZE (4u << 20)
#define MAX_KINDS 5

static const struct {
    CUpti_ActivityUnifiedMemoryCounterKind kind;
    const char *name;
} KINDS[MAX_KINDS] = {
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD, "BYTES_TRANSFER_HTOD"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH, "BYTES_TRANSFER_DTOH"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT, "GPU_PAGE_FAULT"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT, "CPU_PAGE_FAULT_COUNT"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING, "THRASHING"},
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;  // guards everything below
static struct {
    uint64_t htod, dtoh, gpu_faults, gpu_fault_records, cpu_faults, thrashing, thrashing_bytes;
    uint64_t records, dropped, flushes;
} totals;
static char configured[256], failed[1024];
static char out_path[4096];
static int configured_ok;  // the counters are configured and the activity kind enabled
static volatile int stopping;
static pthread_t flusher;
static int flusher_started;

static void say(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "um_counters: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
}

static const char *result_string(CUptiResult r)
{
    const char *s = NULL;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || s == NULL) return "unknown CUPTI error";
    return s;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUF_SIZE);
    *size = *buffer ? BUF_SIZE : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid)
{
    (void)size;
    CUpti_Activity *rec = NULL;
    size_t dropped = 0;
    pthread_mutex_lock(&lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) continue;
        const CUpti_ActivityUnifiedMemoryCounter3 *um = (const CUpti_ActivityUnifiedMemoryCounter3 *)rec;
        totals.records++;
        switch (um->counterKind) {
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD:
            totals.htod += um->value;
            break;
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH:
            totals.dtoh += um->value;
            break;
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT:
            totals.gpu_faults += um->value;
            totals.gpu_fault_records++;
            break;
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT:
            totals.cpu_faults++;
            break;
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING:
            totals.thrashing++;
            totals.thrashing_bytes += um->value;
            break;
        default:
            break;
        }
    }
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        totals.dropped += dropped;
    pthread_mutex_unlock(&lock);
    free(buffer);
}

static void write_json(int final)
{
    if (!out_path[0]) return;
    char tmp[4200], text[2600];
    pthread_mutex_lock(&lock);
    int len = snprintf(text, sizeof text,
        "{\"htod_bytes\": %llu, \"dtoh_bytes\": %llu, \"gpu_page_faults\": %llu, "
        "\"gpu_page_fault_records\": %llu, \"cpu_page_faults\": %llu, \"thrashing\": %llu, "
        "\"thrashing_bytes\": %llu, \"records\": %llu, \"dropped\": %llu, \"flushes\": %llu, "
        "\"final\": %s, \"pid\": %d, \"configured\": [%s], \"failed\": [%s]}\n",
        (unsigned long long)totals.htod, (unsigned long long)totals.dtoh,
        (unsigned long long)totals.gpu_faults, (unsigned long long)totals.gpu_fault_records,
        (unsigned long long)totals.cpu_faults, (unsigned long long)totals.thrashing,
        (unsigned long long)totals.thrashing_bytes, (unsigned long long)totals.records,
        (unsigned long long)totals.dropped, (unsigned long long)totals.flushes,
        final ? "true" : "false", (int)getpid(), configured, failed);
    pthread_mutex_unlock(&lock);
    snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) return;
    int ok = fwrite(text, 1, (size_t)len, f) == (size_t)len;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, out_path) != 0) unlink(tmp);
}

static void flush(void)
{
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&lock);
    totals.flushes += r == CUPTI_SUCCESS;
    pthread_mutex_unlock(&lock);
}

static void *flusher_main(void *arg)
{
    (void)arg;
    const struct timespec half = {0, 500 * 1000 * 1000};
    while (!stopping) {
        nanosleep(&half, NULL);
        if (stopping) break;
        if (configured_ok) flush();
        write_json(0);
    }
    return NULL;
}

static void at_exit(void)
{
    stopping = 1;
    if (flusher_started) pthread_join(flusher, NULL);
    if (configured_ok) flush();
    write_json(1);
}

/* Configures the counter kinds one by one (each call passes every kind accepted so far plus the
 * next), so that a kind CUPTI refuses leaves the others on; then enables the activity kind.
 * Returns 1 when at least one kind is on. */
static int configure(void)
{
    CUpti_ActivityUnifiedMemoryCounterConfig cfg[MAX_KINDS];
    uint32_t n = 0;
    CUptiResult r = CUPTI_SUCCESS;
    configured[0] = failed[0] = '\0';
    memset(cfg, 0, sizeof cfg);
    for (int i = 0; i < MAX_KINDS; i++) {
        cfg[n].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE;
        cfg[n].kind = KINDS[i].kind;
        cfg[n].deviceId = 0;
        cfg[n].enable = 1;
        r = cuptiActivityConfigureUnifiedMemoryCounter(cfg, n + 1);
        char *list = r == CUPTI_SUCCESS ? configured : failed;
        size_t used = strlen(list), room = (list == configured ? sizeof configured : sizeof failed);
        if (r == CUPTI_SUCCESS) {
            snprintf(list + used, room - used, "%s\"%s\"", used ? ", " : "", KINDS[i].name);
            n++;
        } else {
            snprintf(list + used, room - used, "%s\"%s: %s\"", used ? ", " : "", KINDS[i].name,
                     result_string(r));
        }
    }
    if (n == 0) return 0;
    if (r != CUPTI_SUCCESS && (r = cuptiActivityConfigureUnifiedMemoryCounter(cfg, n)) != CUPTI_SUCCESS) {
        say("re-configuring the accepted counters failed: %s%s", result_string(r), "");
        return 0;
    }
    r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER);
    if (r != CUPTI_SUCCESS) {
        say("cuptiActivityEnable(UNIFIED_MEMORY_COUNTER) failed: %s%s", result_string(r), "");
        return 0;
    }
    return 1;
}

/* CUPTI wants the counters configured after the driver is initialized; InitializeInjection
 * runs inside cuInit, so if configuring fails there it is tried again when a context is made. */
static void CUPTIAPI on_resource(void *userdata, CUpti_CallbackDomain domain,
                                 CUpti_CallbackId cbid, const void *data)
{
    (void)userdata;
    (void)data;
    if (domain != CUPTI_CB_DOMAIN_RESOURCE || cbid != CUPTI_CBID_RESOURCE_CONTEXT_CREATED ||
        configured_ok)
        return;
    configured_ok = configure();
    say("at context creation: configured [%s], failed [%s]", configured, failed);
}

int InitializeInjection(void)
{
    static int done;
    if (done) return 1;
    done = 1;
    const char *path = getenv("UM_COUNTERS_OUT");
    if (path && *path) {
        const char *p = strstr(path, "%p");
        if (p)
            snprintf(out_path, sizeof out_path, "%.*s%d%s", (int)(p - path), path, (int)getpid(),
                     p + 2);
        else
            snprintf(out_path, sizeof out_path, "%s", path);
    } else {
        say("UM_COUNTERS_OUT is not set: counting, writing nothing%s%s", "", "");
    }
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        say("cuptiActivityRegisterCallbacks failed: %s%s", result_string(r), "");
        snprintf(failed, sizeof failed, "\"cuptiActivityRegisterCallbacks: %s\"", result_string(r));
        write_json(1);
        return 1;  // the program goes on, uncounted
    }
    configured_ok = configure();
    if (configured_ok) {
        say("configured [%s], failed [%s]", configured, failed);
    } else {
        CUpti_SubscriberHandle sub;
        say("not configured at cuInit (failed [%s%s]); trying again at context creation",
            failed, "");
        if (cuptiSubscribe(&sub, on_resource, NULL) == CUPTI_SUCCESS)
            cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
    }
    write_json(0);
    atexit(at_exit);
    flusher_started = pthread_create(&flusher, NULL, flusher_main, NULL) == 0;
    return 1;
}
