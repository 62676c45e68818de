/* A stand-in for NVIDIA's libcudnn.so.9 that only records its calls, so that tests without a GPU
 * check how daemon/backends/cudnn.py calls cuDNN through ctypes: argument order, pointers,
 * scalars read through host pointers (tests/unit/test_cudnn_ctypes.py). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static char g_log[1 << 16];
static size_t g_len;
static uintptr_t g_next = 0x1000;

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_log + g_len, sizeof g_log - g_len, fmt, ap);
    va_end(ap);
    if (n > 0 && g_len + (size_t)n < sizeof g_log)
        g_len += (size_t)n;
}

const char *fake_log(void) { return g_log; }
void fake_clear(void) { g_len = 0; g_log[0] = 0; }

size_t cudnnGetVersion(void) { return 91900; }
size_t cudnnGetCudartVersion(void) { return 13000; }
int cudnnCreate(void **h) { *h = (void *)(g_next += 0x10); say("create %p\n", *h); return 0; }
int cudnnDestroy(void *h) { say("destroy %p\n", h); return 0; }
int cudnnSetStream(void *h, void *s) { say("stream %p %p\n", h, s); return 0; }
int cudnnBackendCreateDescriptor(int type, void **d)
{
    *d = (void *)(g_next += 0x10);
    say("desc %d %p\n", type, *d);
    return 0;
}
int cudnnBackendDestroyDescriptor(void *d) { say("free %p\n", d); return 0; }
int cudnnBackendFinalize(void *d) { say("finalize %p\n", d); return 0; }
int cudnnBackendSetAttribute(void *d, int name, int type, int64_t count, const void *v)
{
    say("set %p %d %d %lld", d, name, type, (long long)count);
    for (int64_t i = 0; i < count && i < 4; i++) {
        uint64_t e = 0;
        memcpy(&e, (const char *)v + 8 * i, type == 3 || type == 6 || type == 15 || type == 0 ? 8 : 4);
        say(" %llx", (unsigned long long)e);
    }
    say("\n");
    return 0;
}
int cudnnBackendGetAttribute(void *d, int name, int type, int64_t requested, int64_t *count,
                             void *v)
{
    say("get %p %d %d %lld\n", d, name, type, (long long)requested);
    *count = 2;
    if (type == 3 && requested >= 1)
        *(int64_t *)v = 4096; /* e.g. a plan's workspace size */
    if (type == 15)
        for (int64_t i = 0; i < requested && i < 2; i++)
            say("fill %p\n", ((void **)v)[i]);
    return 0;
}
int cudnnBackendExecute(void *h, void *plan, void *pack) { say("execute %p %p %p\n", h, plan, pack); return 0; }
int cudnnCreateTensorDescriptor(void **t) { *t = (void *)(g_next += 0x10); return 0; }
int cudnnDestroyTensorDescriptor(void *t) { (void)t; return 0; }
int cudnnSetTensorNdDescriptor(void *t, int dtype, int n, const int *dims, const int *strides)
{
    say("tensor %p %d %d %d %d\n", t, dtype, n, dims[n - 1], strides[0]);
    return 0;
}
int cudnnBatchNormalizationForwardTrainingEx(
    void *h, int mode, int ops, const float *alpha, const float *beta, void *xd, void *x,
    void *zd, void *z, void *yd, void *y, void *bd, void *scale, void *bias, double factor,
    void *rm, void *rv, double eps, void *sm, void *si, void *act, void *ws, size_t wss,
    void *res, size_t ress)
{
    (void)h, (void)xd, (void)yd, (void)bd;
    say("bnfwd %d %d %g %g %p %p %p %p %p %p %g %p %p %g %p %p %p %p %zu %p %zu\n", mode, ops,
        *alpha, *beta, x, zd, z, y, scale, bias, factor, rm, rv, eps, sm, si, act, ws, wss, res,
        ress);
    return 0;
}
int cudnnBatchNormalizationBackwardEx(
    void *h, int mode, int ops, const float *ad, const float *bd_, const float *ap,
    const float *bp, void *xd, void *x, void *yd, void *y, void *dyd, void *dy, void *dzd,
    void *dz, void *dxd, void *dx, void *bnd, void *scale, void *bias, void *dscale, void *dbias,
    double eps, void *sm, void *si, void *act, void *ws, size_t wss, void *res, size_t ress)
{
    (void)h, (void)xd, (void)dyd, (void)dxd, (void)bnd;
    say("bnbwd %d %d %g %g %g %g %p %p %p %p %p %p %p %p %p %p %p %g %p %p %p %p %zu %p %zu\n",
        mode, ops, *ad, *bd_, *ap, *bp, x, yd, y, dy, dzd, dz, dx, scale, bias, dscale, dbias, eps,
        sm, si, act, ws, wss, res, ress);
    return 0;
}
int cudnnBatchNormalizationForwardInference(void *h, int mode, const double *alpha,
                                            const double *beta, void *xd, void *x, void *yd,
                                            void *y, void *bd, void *scale, void *bias, void *m,
                                            void *v, double eps)
{
    (void)h, (void)xd, (void)yd, (void)bd;
    say("bninf %d %g %g %p %p %p %p %p %p %g\n", mode, *alpha, *beta, x, y, scale, bias, m, v,
        eps);
    return 0;
}
int cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(void *h, int mode, int ops, void *x,
                                                             void *z, void *y, void *bn,
                                                             void *act, size_t *size)
{
    (void)h, (void)x, (void)bn;
    say("wsfwd %d %d %p %p %p\n", mode, ops, z, y ? (void *)1 : NULL, act);
    *size = 123;
    return 0;
}
