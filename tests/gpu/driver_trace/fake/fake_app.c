/* Calls the fake driver every way a real program does: linked (DT_NEEDED), dlopen+dlsym, through
 * cuGetProcAddress (v1, v2, and the pointer cuGetProcAddress hands out for itself), an export table,
 * from 4 threads at once and from a forked child; checks every result, prints "ok". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
typedef struct { unsigned char bytes[16]; } CUuuid;
int cuInit(unsigned);
long cuMix(long, long, long, long, long, long, long, long, double, double);
int cuGetProcAddress_v2(const char *, void **, int, uint64_t, int *);
int cuGetProcAddress(const char *, void **, int, uint64_t);
int cuGetExportTable(const void **, const CUuuid *);
int other_hidden(int);
#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #c); return 1; } } while (0)
static void *spin(void *a) { (void)a; for (int i = 0; i < 10000; i++) cuInit(0); return NULL; }
int main(void)
{
    for (int i = 0; i < 3000; i++) CHECK(cuInit(0) == 0);
    CHECK(cuInit(7) == 1);
    for (long i = 0; i < 200; i++)   /* the first 64 through the slow path (callers noted), then fast */
        CHECK(cuMix(1, 2, 3, 4, 5, 6, 7, i, 0.5, 0.25) == 1 + 4 + 9 + 16 + 25 + 36 + 49 + 8 * i + 5 + 25);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h);
    int (*ver)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    Dl_info di;
    const char *dir = getenv("DRIVER_TRACE_DIR");   /* dlsym must find the tracer's trampoline */
    CHECK(ver && dir && dladdr((void *)ver, &di) && !strncmp(di.dli_fname, dir, strlen(dir)));
    for (int i = 0; i < 5; i++) { int v = 0; CHECK(ver(&v) == 0 && v == 13000); }
    int (*snap)(const char *) = (int (*)(const char *))dlsym(h, "driver_trace_snapshot");
    CHECK(snap && snap("loop:begin") == 0);
    for (int i = 0; i < 100; i++) { CHECK(cuInit(0) == 0); CHECK(i % 4 || ver(&(int){0}) == 0); }
    CHECK(snap("loop:end:100") == 1);
    int st = -1;
    int (*alloc)(uint64_t *, size_t) = 0;
    CHECK(cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 13000, 0, &st) == 0 && st == 0 && alloc);
    uint64_t p = 0;
    for (int i = 0; i < 2; i++) CHECK(alloc(&p, 16) == 0 && p == 0x1010);
    int (*hid)(int) = 0;
    CHECK(cuGetProcAddress_v2("cuHidden", (void **)&hid, 13000, 2, &st) == 0 && hid);
    for (int i = 0; i < 4; i++) CHECK(hid(7) == 21);
    CHECK(other_hidden(5) == 15 && other_hidden(1) == 3);
    int (*gpa)(const char *, void **, int, uint64_t, int *) = 0;
    CHECK(cuGetProcAddress("cuGetProcAddress", (void **)&gpa, 13000, 0) == 0 && gpa == cuGetProcAddress_v2);
    long (*mix)(long, long, long, long, long, long, long, long, double, double) = 0;
    CHECK(gpa("cuMix", (void **)&mix, 12080, 1, &st) == 0 && mix(0, 0, 0, 0, 0, 0, 0, 1, 1.0, 0.0) == 18);
    void *none = (void *)1;
    CHECK(cuGetProcAddress_v2("cuNope", &none, 13000, 0, &st) == 500 && st == 1 && none == NULL);
    CUuuid id = {{0xab, 1, 2, 3}};
    const struct { size_t size; int (*f0)(int); int (*f1)(int); } *t = 0;
    CHECK(cuGetExportTable((const void **)&t, &id) == 0 && t && t->size == 24);
    CHECK(t->f1(1) == 201 && t->f1(2) == 202 && t->f0(0) == 100);
    id.bytes[0] = 0xcd;
    CHECK(cuGetExportTable((const void **)&t, &id) == 500);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, spin, NULL);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    pid_t c = fork();
    if (c == 0) { cuInit(0); return 0; }
    int ws = 0;
    waitpid(c, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    printf("ok\n");
    return 0;
}
