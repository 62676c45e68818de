// arrays: CUDA arrays, 3D pitched memory, texture and surface objects (shim/runtime/texture/api_array.c,
// api_memory3d.c, api_texture.c, api_helpers.c; daemon/ops/arrays.py).
//
// Each scenario keeps a host model of every array and buffer it writes (bytes, row-major), makes
// the copies, reads everything back and compares with the model; it prints what it checked
// (checksums of the contents, sampled values, error names), then "<scenario> ok". Everything
// printed is exact and the same on every run: tests/gpu/run_compare.sh and arrays_compare.sh
// diff it against a native run. Scenarios: helpers pitched3d arrays arrays3d texture surface
// errors peer3d (all of them with no argument; peer3d copies only with two devices or more). Pilot-only modes (tests/apps/test_arrays.py): `hold`
// creates an array, a texture and a surface, prints their handles and waits for a line on stdin;
// `forge ARRAY TEXTURE SURFACE` uses another process's handles; `hog COUNT` allocates 1 MiB
// arrays until one fails and holds them; `scrub` reads a new array where a freed one was.
// cudaMemcpyToArray and friends are deprecated, and still used by programs pilot must run
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "self_check.h"

// ---- kernels ----

__global__ void tex_sample(cudaTextureObject_t tex, const float2 *pts, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = tex2D<float>(tex, pts[i].x, pts[i].y);
}

__global__ void tex_sample_int(cudaTextureObject_t tex, const float2 *pts, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = tex2D<int>(tex, pts[i].x, pts[i].y);
}

__global__ void tex_fetch_linear(cudaTextureObject_t tex, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = tex1Dfetch<int>(tex, i);
}

// Writes base + y * width + x at every (x, y) with (x + y) % 3 != 0.
__global__ void surf_fill(cudaSurfaceObject_t surf, int width, int height, unsigned base)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height && (x + y) % 3 != 0)
        surf2Dwrite(base + (unsigned)(y * width + x), surf, x * (int)sizeof(unsigned), y);
}

// ---- host models ----

static unsigned char *pattern(size_t n, unsigned seed)
{
    unsigned char *p = (unsigned char *)malloc(n);
    if (!p) {
        printf("host allocation failed\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31u + seed * 77u + (i >> 8) + 1u);
    return p;
}

static unsigned char *zeros(size_t n)
{
    unsigned char *p = (unsigned char *)calloc(n, 1);
    if (!p) {
        printf("host allocation failed\n");
        exit(2);
    }
    return p;
}

// A box of w bytes x h rows x d slices between two byte buffers (pitch bytes a row, rows a slice).
static void box(unsigned char *dst, size_t dpitch, size_t drows, size_t dx, size_t dy, size_t dz,
                const unsigned char *src, size_t spitch, size_t srows, size_t sx, size_t sy,
                size_t sz, size_t w, size_t h, size_t d)
{
    for (size_t z = 0; z < d; z++)
        for (size_t y = 0; y < h; y++)
            memmove(dst + ((dz + z) * drows + dy + y) * dpitch + dx,
                    src + ((sz + z) * srows + sy + y) * spitch + sx, w);
}

static unsigned fnv(const unsigned char *p, size_t n)
{
    unsigned h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static int same(const unsigned char *a, const unsigned char *b, size_t n, const char *what)
{
    if (memcmp(a, b, n) == 0)
        return 1;
    size_t i = 0;
    while (a[i] == b[i])
        i++;
    printf("mismatch in %s at byte %zu: %u != %u\n", what, i, a[i], b[i]);
    return 0;
}

// The whole of a 2D (or 1D) array, read back.
static unsigned char *read_array(cudaArray_t a, size_t row, size_t rows)
{
    unsigned char *out = zeros(row * rows);
    CHECK(cudaMemcpy2DFromArray(out, row, a, 0, 0, row, rows, cudaMemcpyDeviceToHost));
    return out;
}

// ---- scenarios ----

static void helpers(void)
{
    cudaChannelFormatDesc f4 = cudaCreateChannelDesc<float4>();
    cudaChannelFormatDesc u2 = cudaCreateChannelDesc<uchar2>();
    cudaChannelFormatDesc h1 = cudaCreateChannelDescHalf();
    cudaChannelFormatDesc raw = cudaCreateChannelDesc(16, 16, 0, 0, cudaChannelFormatKindSigned);
    printf("helpers float4=%d,%d,%d,%d,%d uchar2=%d,%d,%d,%d,%d half=%d,%d,%d,%d,%d raw=%d,%d,%d,%d,%d\n",
           f4.x, f4.y, f4.z, f4.w, (int)f4.f, u2.x, u2.y, u2.z, u2.w, (int)u2.f, h1.x, h1.y, h1.z,
           h1.w, (int)h1.f, raw.x, raw.y, raw.z, raw.w, (int)raw.f);
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    prop.major = 9;
    prop.minor = 0;
    int dev = -1;
    CHECK(cudaChooseDevice(&dev, &prop));
    printf("helpers choose_9_0=%d\n", dev);
    printf("helpers choose_null=%s\n", cudaGetErrorName(cudaChooseDevice(&dev, NULL)));
    cudaGetLastError();
    verdict("helpers", 1, "");
}

static void pitched3d(void)
{
    const size_t W = 100, H = 7, D = 5;
    cudaPitchedPtr p;
    CHECK(cudaMalloc3D(&p, make_cudaExtent(W, H, D)));
    printf("pitched3d pitch=%zu xsize=%zu ysize=%zu\n", p.pitch, p.xsize, p.ysize);
    const size_t P = p.pitch;
    unsigned char *model = zeros(P * H * D);
    // memset everything, then a sub-box through an offset pitched pointer
    CHECK(cudaMemset3D(p, 0x11, make_cudaExtent(W, H, D)));
    for (size_t z = 0; z < D; z++)
        for (size_t y = 0; y < H; y++)
            memset(model + (z * H + y) * P, 0x11, W);
    cudaPitchedPtr sub = p;
    sub.ptr = (char *)p.ptr + (1 * H + 2) * P + 3;
    CHECK(cudaMemset3D(sub, 0x22, make_cudaExtent(10, 3, 2)));
    for (size_t z = 1; z < 3; z++)
        for (size_t y = 2; y < 5; y++)
            memset(model + (z * H + y) * P + 3, 0x22, 10);

    // host -> device: a host box of another pitch and rows per slice, positions on both sides
    const size_t HP = 120, HR = 9, HD = 6;
    unsigned char *host = pattern(HP * HR * HD, 1);
    cudaMemcpy3DParms c;
    memset(&c, 0, sizeof c);
    c.srcPtr = make_cudaPitchedPtr(host, HP, 110, HR);
    c.srcPos = make_cudaPos(5, 1, 2);
    c.dstPtr = p;
    c.dstPos = make_cudaPos(20, 3, 1);
    c.extent = make_cudaExtent(50, 4, 3);
    c.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&c));
    box(model, P, H, 20, 3, 1, host, HP, HR, 5, 1, 2, 50, 4, 3);

    // device -> device into an allocation with other rows per slice (slice by slice)
    cudaPitchedPtr q;
    CHECK(cudaMalloc3D(&q, make_cudaExtent(128, 10, 6)));
    const size_t QP = q.pitch;
    unsigned char *qmodel = zeros(QP * 10 * 6);
    CHECK(cudaMemset3D(q, 0, make_cudaExtent(QP, 10, 6)));
    memset(&c, 0, sizeof c);
    c.srcPtr = p;
    c.srcPos = make_cudaPos(2, 1, 0);
    c.dstPtr = q;
    c.dstPos = make_cudaPos(7, 4, 2);
    c.extent = make_cudaExtent(90, 5, 4);
    c.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaMemcpy3D(&c));
    box(qmodel, QP, 10, 7, 4, 2, model, P, H, 2, 1, 0, 90, 5, 4);

    // asynchronous memset and copy on a stream
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    sub = q;
    sub.ptr = (char *)q.ptr + (3 * 10 + 0) * QP + 64;
    CHECK(cudaMemset3DAsync(sub, 0x7e, make_cudaExtent(30, 10, 2), s));
    for (size_t z = 3; z < 5; z++)
        for (size_t y = 0; y < 10; y++)
            memset(qmodel + (z * 10 + y) * QP + 64, 0x7e, 30);
    unsigned char *host2 = pattern(40 * 3 * 2, 2);
    memset(&c, 0, sizeof c);
    c.srcPtr = make_cudaPitchedPtr(host2, 40, 40, 3);
    c.dstPtr = q;
    c.dstPos = make_cudaPos(100, 7, 0);
    c.extent = make_cudaExtent(25, 3, 2);
    c.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3DAsync(&c, s));
    CHECK(cudaStreamSynchronize(s));
    box(qmodel, QP, 10, 100, 7, 0, host2, 40, 3, 0, 0, 0, 25, 3, 2);

    // read both back with 3D device -> host copies (host pitch = device pitch)
    unsigned char *back = zeros(P * H * D), *qback = zeros(QP * 10 * 6);
    memset(&c, 0, sizeof c);
    c.srcPtr = p;
    c.dstPtr = make_cudaPitchedPtr(back, P, W, H);
    c.extent = make_cudaExtent(P, H, D);
    c.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&c));
    c.srcPtr = q;
    c.dstPtr = make_cudaPitchedPtr(qback, QP, 128, 10);
    c.extent = make_cudaExtent(QP, 10, 6);
    CHECK(cudaMemcpy3D(&c));
    // the pitch padding of p was never written: compare the rows' first W bytes only
    int ok = 1;
    for (size_t r = 0; r < H * D && ok; r++)
        ok = same(back + r * P, model + r * P, W, "pitched3d p");
    for (size_t r = 0; r < 10 * 6 && ok; r++)
        ok = same(qback + r * QP, qmodel + r * QP, 128, "pitched3d q");
    unsigned hp = 0, hq = 0;
    for (size_t r = 0; r < H * D; r++)
        hp = hp * 31u + fnv(model + r * P, W);
    for (size_t r = 0; r < 10 * 6; r++)
        hq = hq * 31u + fnv(qmodel + r * QP, 128);
    printf("pitched3d p=%08x q=%08x\n", hp, hq);

    // host -> host 3D
    unsigned char *hh = zeros(64 * 4 * 3);
    memset(&c, 0, sizeof c);
    c.srcPtr = make_cudaPitchedPtr(host, HP, 110, HR);
    c.srcPos = make_cudaPos(1, 2, 3);
    c.dstPtr = make_cudaPitchedPtr(hh, 64, 64, 4);
    c.extent = make_cudaExtent(60, 4, 3);
    c.kind = cudaMemcpyHostToHost;
    CHECK(cudaMemcpy3D(&c));
    unsigned char *hhm = zeros(64 * 4 * 3);
    box(hhm, 64, 4, 0, 0, 0, host, HP, HR, 1, 2, 3, 60, 4, 3);
    ok = ok && same(hh, hhm, 64 * 4 * 3, "pitched3d host");

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(p.ptr));
    CHECK(cudaFree(q.ptr));
    free(model), free(qmodel), free(host), free(host2), free(back), free(qback), free(hh), free(hhm);
    verdict("pitched3d", ok, "contents");
}

static void arrays(void)
{
    const size_t W = 37, H = 19, E = 4, RB = W * E;
    cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
    cudaArray_t a, b;
    CHECK(cudaMallocArray(&a, &fd, W, H));
    CHECK(cudaMallocArray(&b, &fd, W, H));
    cudaChannelFormatDesc gd;
    cudaExtent ext;
    unsigned flags = 99;
    CHECK(cudaArrayGetInfo(&gd, &ext, &flags, a));
    printf("arrays info desc=%d,%d,%d,%d,%d extent=%zu,%zu,%zu flags=%u\n", gd.x, gd.y, gd.z, gd.w,
           (int)gd.f, ext.width, ext.height, ext.depth, flags);
    CHECK(cudaGetChannelDesc(&gd, b));
    printf("arrays channel desc=%d,%d,%d,%d,%d\n", gd.x, gd.y, gd.z, gd.w, (int)gd.f);

    unsigned char *ma = pattern(RB * H, 1), *mb = pattern(RB * H, 5);
    // host -> array: the whole array, then a box with another pitch at an offset
    CHECK(cudaMemcpy2DToArray(a, 0, 0, ma, RB, RB, H, cudaMemcpyHostToDevice));
    unsigned char *h2 = pattern(200 * 10, 2);
    CHECK(cudaMemcpy2DToArray(a, 12, 2, h2, 200, 80, 10, cudaMemcpyHostToDevice));
    box(ma, RB, H, 12, 2, 0, h2, 200, 10, 0, 0, 0, 80, 10, 1);
    // the 1D forms: inside one row, and whole rows
    unsigned char *h3 = pattern(3 * RB, 3);
    CHECK(cudaMemcpyToArray(a, 8, 5, h3, 40, cudaMemcpyHostToDevice));
    memcpy(ma + 5 * RB + 8, h3, 40);
    CHECK(cudaMemcpyToArray(a, 0, 10, h3, 3 * RB, cudaMemcpyHostToDevice));
    memcpy(ma + 10 * RB, h3, 3 * RB);

    // device (pitched) -> array
    void *d;
    size_t dp;
    CHECK(cudaMallocPitch(&d, &dp, RB, H));
    CHECK(cudaMemcpy2D(d, dp, mb, RB, RB, H, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DToArray(b, 0, 0, d, dp, RB, H, cudaMemcpyDeviceToDevice));
    // array -> array, 2D and 1D (inside one row)
    CHECK(cudaMemcpy2DArrayToArray(b, 20, 3, a, 4, 1, 60, 7, cudaMemcpyDeviceToDevice));
    box(mb, RB, H, 20, 3, 0, ma, RB, H, 4, 1, 0, 60, 7, 1);
    CHECK(cudaMemcpyArrayToArray(b, 100, 15, a, 0, 0, 44, cudaMemcpyDeviceToDevice));
    memcpy(mb + 15 * RB + 100, ma, 44);
    // asynchronous host -> array, and cudaMemcpyDefault both ways of pointer
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    unsigned char *h6 = pattern(2 * RB, 6);
    CHECK(cudaMemcpy2DToArrayAsync(b, 0, 17, h6, RB, RB, 2, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    memcpy(mb + 17 * RB, h6, 2 * RB);
    CHECK(cudaMemcpy2DToArray(a, 0, 18, h6, RB, RB, 1, cudaMemcpyDefault));
    memcpy(ma + 18 * RB, h6, RB);
    CHECK(cudaMemcpy2DToArray(a, 16, 0, d, dp, 32, 2, cudaMemcpyDefault));
    box(ma, RB, H, 16, 0, 0, mb, RB, H, 0, 0, 0, 32, 2, 1);  // d still holds b's first contents
    // (b's rows 0..1 were not changed after the device copy: d matches mb there)

    int ok = 1;
    unsigned char *ba = read_array(a, RB, H), *bb = read_array(b, RB, H);
    ok = same(ba, ma, RB * H, "array a") && same(bb, mb, RB * H, "array b");
    printf("arrays a=%08x b=%08x\n", fnv(ma, RB * H), fnv(mb, RB * H));

    // array -> host: a box into a host buffer of another pitch, the 1D forms
    unsigned char *hb = zeros(64 * 6), *hm = zeros(64 * 6);
    CHECK(cudaMemcpy2DFromArray(hb, 64, a, 16, 4, 48, 6, cudaMemcpyDeviceToHost));
    box(hm, 64, 6, 0, 0, 0, ma, RB, H, 16, 4, 0, 48, 6, 1);
    ok = ok && same(hb, hm, 64 * 6, "from array box");
    unsigned char *h1 = zeros(2 * RB);
    CHECK(cudaMemcpyFromArray(h1, a, 24, 7, 60, cudaMemcpyDeviceToHost));
    ok = ok && same(h1, ma + 7 * RB + 24, 60, "from array 1d");
    CHECK(cudaMemcpyFromArray(h1, b, 0, 12, 2 * RB, cudaMemcpyDeviceToHost));
    ok = ok && same(h1, mb + 12 * RB, 2 * RB, "from array rows");
    // array -> device, checked through the device
    CHECK(cudaMemcpy2DFromArray(d, dp, b, 8, 2, 64, 9, cudaMemcpyDeviceToDevice));
    unsigned char *db = zeros(64 * 9), *dm = zeros(64 * 9);
    CHECK(cudaMemcpy2D(db, 64, d, dp, 64, 9, cudaMemcpyDeviceToHost));
    box(dm, 64, 9, 0, 0, 0, mb, RB, H, 8, 2, 0, 64, 9, 1);
    ok = ok && same(db, dm, 64 * 9, "array to device");
    // asynchronous array -> host
    unsigned char *hs = zeros(RB * H);
    CHECK(cudaMemcpy2DFromArrayAsync(hs, RB, b, 0, 0, RB, H, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    ok = ok && same(hs, mb, RB * H, "from array async");

    // managed memory on the linear side, named as host memory (as CUDA allows it)
    unsigned char *um, *back2 = zeros(2 * RB), *h9 = pattern(2 * RB, 9);
    CHECK(cudaMallocManaged(&um, 2 * RB));
    CHECK(cudaMemcpy2DFromArray(um, RB, a, 0, 0, RB, 2, cudaMemcpyDeviceToHost));
    ok = ok && same(um, ma, 2 * RB, "array to managed");
    memcpy(um, h9, 2 * RB);
    CHECK(cudaMemcpy2DToArray(a, 0, 0, um, RB, RB, 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DFromArray(back2, RB, a, 0, 0, RB, 2, cudaMemcpyDeviceToHost));
    ok = ok && same(back2, h9, 2 * RB, "managed to array");
    CHECK(cudaFree(um));
    // pinned host memory on the host side
    unsigned char *pin;
    CHECK(cudaMallocHost(&pin, 2 * RB));
    CHECK(cudaMemcpy2DFromArrayAsync(pin, RB, a, 0, 0, RB, 2, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    ok = ok && same(pin, h9, 2 * RB, "array to pinned");
    CHECK(cudaFreeHost(pin));
    free(back2), free(h9);

    // a 1D array (height 0)
    cudaChannelFormatDesc id = cudaCreateChannelDesc<int>();
    cudaArray_t f;
    CHECK(cudaMallocArray(&f, &id, 50));
    CHECK(cudaArrayGetInfo(&gd, &ext, &flags, f));
    printf("arrays 1d extent=%zu,%zu,%zu\n", ext.width, ext.height, ext.depth);
    unsigned char *mf = pattern(200, 7), *bf = zeros(80);
    CHECK(cudaMemcpyToArray(f, 0, 0, mf, 200, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyFromArray(bf, f, 40, 0, 80, cudaMemcpyDeviceToHost));
    ok = ok && same(bf, mf + 40, 80, "1d array");
    // a 1D array whose row is wider than one message (80000 bytes)
    cudaArray_t g;
    CHECK(cudaMallocArray(&g, &fd, 20000));
    unsigned char *mg = pattern(80000, 8), *bg = zeros(80000);
    CHECK(cudaMemcpyToArray(g, 0, 0, mg, 80000, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyFromArray(bg, g, 4000, 0, 70000, cudaMemcpyDeviceToHost));
    ok = ok && same(bg, mg + 4000, 70000, "wide 1d array");
    CHECK(cudaFreeArray(g));
    free(mg), free(bg);

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeArray(a));
    CHECK(cudaFreeArray(b));
    CHECK(cudaFreeArray(f));
    CHECK(cudaFreeArray(NULL));
    CHECK(cudaFree(d));
    free(ma), free(mb), free(h2), free(h3), free(h6), free(ba), free(bb), free(hb), free(hm);
    free(h1), free(db), free(dm), free(hs), free(mf), free(bf);
    verdict("arrays", ok, "contents");
}

static void arrays3d(void)
{
    const size_t W = 9, H = 5, D = 4, E = 4, RB = W * E;
    cudaChannelFormatDesc ud = cudaCreateChannelDesc<uchar4>();
    cudaArray_t c, e;
    CHECK(cudaMalloc3DArray(&c, &ud, make_cudaExtent(W, H, D), 0));
    CHECK(cudaMalloc3DArray(&e, &ud, make_cudaExtent(W, H, D), 0));
    cudaExtent ext;
    unsigned flags;
    cudaChannelFormatDesc cd;
    CHECK(cudaArrayGetInfo(&cd, &ext, &flags, c));
    printf("arrays3d extent=%zu,%zu,%zu flags=%u\n", ext.width, ext.height, ext.depth, flags);
    unsigned char *mc = pattern(RB * H * D, 11), *me = pattern(RB * H * D, 12);

    cudaMemcpy3DParms p;
    // host -> array, whole
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(mc, RB, W, H);
    p.dstArray = c;
    p.extent = make_cudaExtent(W, H, D);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    p.srcPtr = make_cudaPitchedPtr(me, RB, W, H);
    p.dstArray = e;
    CHECK(cudaMemcpy3D(&p));
    // host -> array from an offset in a host box of another pitch (positions and the extent in
    // the array's elements on both sides: srcPos.x = 4 starts 16 bytes into the host row on the
    // H100, not 4 as the manual's "unsigned char elements for pointers" suggests)
    const size_t HP = 50, HR = 6, HD = 5;
    unsigned char *host = pattern(HP * HR * HD, 13);
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(host, HP, 48, HR);
    p.srcPos = make_cudaPos(4, 1, 1);
    p.dstArray = c;
    p.dstPos = make_cudaPos(1, 0, 0);
    p.extent = make_cudaExtent(7, 5, 3);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    box(mc, RB, H, 1 * E, 0, 0, host, HP, HR, 4 * E, 1, 1, 7 * E, 5, 3);
    // array -> array
    memset(&p, 0, sizeof p);
    p.srcArray = c;
    p.srcPos = make_cudaPos(2, 1, 0);
    p.dstArray = e;
    p.dstPos = make_cudaPos(0, 0, 1);
    p.extent = make_cudaExtent(5, 3, 2);
    p.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaMemcpy3D(&p));
    box(me, RB, H, 0, 0, 1, mc, RB, H, 2 * E, 1, 0, 5 * E, 3, 2);
    // array <-> pitched linear memory
    cudaPitchedPtr lin;
    CHECK(cudaMalloc3D(&lin, make_cudaExtent(64, 6, 3)));
    CHECK(cudaMemset3D(lin, 0x5a, make_cudaExtent(64, 6, 3)));
    const size_t LP = lin.pitch;
    unsigned char *ml = zeros(LP * 6 * 3);
    memset(ml, 0x5a, LP * 6 * 3);
    memset(&p, 0, sizeof p);
    p.srcArray = c;
    p.srcPos = make_cudaPos(1, 1, 1);
    p.dstPtr = lin;
    p.dstPos = make_cudaPos(8, 2, 0);  // in the array's elements: 32 bytes into the row
    p.extent = make_cudaExtent(4, 3, 2);
    p.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaMemcpy3D(&p));
    box(ml, LP, 6, 8 * E, 2, 0, mc, RB, H, 1 * E, 1, 1, 4 * E, 3, 2);
    memset(&p, 0, sizeof p);
    p.srcPtr = lin;
    p.dstArray = e;
    p.dstPos = make_cudaPos(5, 1, 2);
    p.extent = make_cudaExtent(4, 4, 2);
    p.kind = cudaMemcpyDefault;
    CHECK(cudaMemcpy3D(&p));
    box(me, RB, H, 5 * E, 1, 2, ml, LP, 6, 0, 0, 0, 4 * E, 4, 2);
    // asynchronous host -> array, one slice
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    unsigned char *slice = pattern(RB * H, 14);
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(slice, RB, W, H);
    p.dstArray = c;
    p.dstPos = make_cudaPos(0, 0, 3);
    p.extent = make_cudaExtent(W, H, 1);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3DAsync(&p, s));
    CHECK(cudaStreamSynchronize(s));
    memcpy(mc + 3 * RB * H, slice, RB * H);

    // read back: arrays -> host, linear -> host
    unsigned char *bc = zeros(RB * H * D), *be = zeros(RB * H * D), *bl = zeros(LP * 6 * 3);
    memset(&p, 0, sizeof p);
    p.srcArray = c;
    p.dstPtr = make_cudaPitchedPtr(bc, RB, W, H);
    p.extent = make_cudaExtent(W, H, D);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    p.srcArray = e;
    p.dstPtr = make_cudaPitchedPtr(be, RB, W, H);
    CHECK(cudaMemcpy3DAsync(&p, s));
    CHECK(cudaStreamSynchronize(s));
    memset(&p, 0, sizeof p);
    p.srcPtr = lin;
    p.dstPtr = make_cudaPitchedPtr(bl, LP, 64, 6);
    p.extent = make_cudaExtent(64, 6, 3);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    int ok = same(bc, mc, RB * H * D, "array c") && same(be, me, RB * H * D, "array e");
    for (size_t r = 0; r < 6 * 3 && ok; r++)
        ok = same(bl + r * LP, ml + r * LP, 64, "linear");
    printf("arrays3d c=%08x e=%08x\n", fnv(mc, RB * H * D), fnv(me, RB * H * D));

    // slices of 20 KiB: three go in one message of pilot's, then two
    cudaChannelFormatDesc f4 = cudaCreateChannelDesc<float4>();
    cudaArray_t v;
    CHECK(cudaMalloc3DArray(&v, &f4, make_cudaExtent(40, 32, 5), 0));
    const size_t VR = 40 * 16, VN = VR * 32 * 5;
    unsigned char *mv = pattern(VN, 15), *bv = zeros(VN);
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(mv, VR, 40, 32);
    p.dstArray = v;
    p.extent = make_cudaExtent(40, 32, 5);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    memset(&p, 0, sizeof p);
    p.srcArray = v;
    p.dstPtr = make_cudaPitchedPtr(bv, VR, 40, 32);
    p.extent = make_cudaExtent(40, 32, 5);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    ok = ok && same(bv, mv, VN, "array v");
    CHECK(cudaFreeArray(v));
    free(mv), free(bv);

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeArray(c));
    CHECK(cudaFreeArray(e));
    CHECK(cudaFree(lin.ptr));
    free(mc), free(me), free(host), free(slice), free(bc), free(be), free(bl), free(ml);
    verdict("arrays3d", ok, "contents");
}

static void sample(cudaTextureObject_t tex, const float2 *pts, int n, float *out)
{
    float2 *dp;
    float *dout;
    CHECK(cudaMalloc(&dp, n * sizeof *dp));
    CHECK(cudaMalloc(&dout, n * sizeof *dout));
    CHECK(cudaMemcpy(dp, pts, n * sizeof *dp, cudaMemcpyHostToDevice));
    tex_sample<<<1, 32>>>(tex, dp, dout, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out, dout, n * sizeof *out, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(dp));
    CHECK(cudaFree(dout));
}

static void print_floats(const char *what, const float *v, int n)
{
    printf("texture %s", what);
    for (int i = 0; i < n; i++)
        printf(" %g", v[i]);
    printf("\n");
}

static void texture(void)
{
    // an 8 x 4 float array holding y * 10 + x
    const int W = 8, H = 4;
    float vals[H][W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            vals[y][x] = (float)(y * 10 + x);
    cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &fd, W, H));
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, vals, W * sizeof(float), W * sizeof(float), H,
                              cudaMemcpyHostToDevice));
    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = arr;
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t clamp, wrap, border;
    CHECK(cudaCreateTextureObject(&clamp, &rd, &td, NULL));
    const float2 pts[] = {{0.5f, 0.5f}, {7.5f, 3.5f}, {3.25f, 2.75f}, {-2.5f, 1.5f},
                          {9.5f, 2.5f}, {2.5f, -1.0f}, {4.5f, 8.0f}, {-3.0f, -3.0f}};
    const int n = (int)(sizeof pts / sizeof pts[0]);
    float out[16];
    sample(clamp, pts, n, out);
    print_floats("clamp", out, n);
    int ok = out[0] == 0 && out[1] == 37 && out[2] == 23 && out[3] == 10 && out[4] == 27 &&
             out[5] == 2 && out[6] == 34 && out[7] == 0;

    td.addressMode[0] = td.addressMode[1] = cudaAddressModeWrap;
    td.normalizedCoords = 1;
    CHECK(cudaCreateTextureObject(&wrap, &rd, &td, NULL));
    const float2 norm[] = {{0.0625f, 0.125f}, {1.3125f, 0.375f}, {-0.1875f, 0.625f},
                           {2.9375f, -0.125f}};
    sample(wrap, norm, 4, out);
    print_floats("wrap", out, 4);
    ok = ok && out[0] == 0 && out[1] == 12 && out[2] == 26 && out[3] == 37;

    td.addressMode[0] = td.addressMode[1] = cudaAddressModeBorder;
    td.normalizedCoords = 0;
    CHECK(cudaCreateTextureObject(&border, &rd, &td, NULL));
    const float2 bpts[] = {{-1.5f, 0.5f}, {8.5f, 1.5f}, {1.5f, 1.5f}, {6.5f, 4.5f}};
    sample(border, bpts, 4, out);
    print_floats("border", out, 4);
    ok = ok && out[0] == 0 && out[1] == 0 && out[2] == 11 && out[3] == 0;

    cudaResourceDesc got;
    CHECK(cudaGetTextureObjectResourceDesc(&got, wrap));
    cudaTextureDesc gtd;
    CHECK(cudaGetTextureObjectTextureDesc(&gtd, wrap));
    // (not readMode: the driver keeps it only for integer formats)
    printf("texture desc type=%d same_array=%d address=%d,%d filter=%d normalized=%d\n",
           (int)got.resType, got.res.array.array == arr, (int)gtd.addressMode[0],
           (int)gtd.addressMode[1], (int)gtd.filterMode, gtd.normalizedCoords);

    // pitch2D over cudaMallocPitch memory of ints (y * 100 + x), clamped
    const int PW = 5, PH = 4;
    int ivals[PH][PW];
    for (int y = 0; y < PH; y++)
        for (int x = 0; x < PW; x++)
            ivals[y][x] = y * 100 + x;
    void *pm;
    size_t pitch;
    CHECK(cudaMallocPitch(&pm, &pitch, PW * sizeof(int), PH));
    CHECK(cudaMemcpy2D(pm, pitch, ivals, PW * sizeof(int), PW * sizeof(int), PH,
                       cudaMemcpyHostToDevice));
    cudaResourceDesc pd;
    memset(&pd, 0, sizeof pd);
    pd.resType = cudaResourceTypePitch2D;
    pd.res.pitch2D.devPtr = pm;
    pd.res.pitch2D.desc = cudaCreateChannelDesc<int>();
    pd.res.pitch2D.width = PW;
    pd.res.pitch2D.height = PH;
    pd.res.pitch2D.pitchInBytes = pitch;
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    cudaTextureObject_t ptex;
    CHECK(cudaCreateTextureObject(&ptex, &pd, &td, NULL));
    const float2 ppts[] = {{0.5f, 0.5f}, {4.5f, 3.5f}, {6.5f, 1.5f}, {2.5f, -4.0f}};
    float2 *dp;
    int *dout, iout[4];
    CHECK(cudaMalloc(&dp, sizeof ppts));
    CHECK(cudaMalloc(&dout, sizeof iout));
    CHECK(cudaMemcpy(dp, ppts, sizeof ppts, cudaMemcpyHostToDevice));
    tex_sample_int<<<1, 32>>>(ptex, dp, dout, 4);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(iout, dout, sizeof iout, cudaMemcpyDeviceToHost));
    printf("texture pitch2d %d %d %d %d\n", iout[0], iout[1], iout[2], iout[3]);
    ok = ok && iout[0] == 0 && iout[1] == 304 && iout[2] == 104 && iout[3] == 2;

    // linear memory, tex1Dfetch
    int lin[10];
    for (int i = 0; i < 10; i++)
        lin[i] = i * i - 7;
    int *dl, *dlo, lout[10];
    CHECK(cudaMalloc(&dl, sizeof lin));
    CHECK(cudaMalloc(&dlo, sizeof lout));
    CHECK(cudaMemcpy(dl, lin, sizeof lin, cudaMemcpyHostToDevice));
    cudaResourceDesc ld;
    memset(&ld, 0, sizeof ld);
    ld.resType = cudaResourceTypeLinear;
    ld.res.linear.devPtr = dl;
    ld.res.linear.desc = cudaCreateChannelDesc<int>();
    ld.res.linear.sizeInBytes = sizeof lin;
    cudaTextureDesc ltd;
    memset(&ltd, 0, sizeof ltd);
    ltd.readMode = cudaReadModeElementType;
    cudaTextureObject_t ltex;
    CHECK(cudaCreateTextureObject(&ltex, &ld, &ltd, NULL));
    tex_fetch_linear<<<1, 32>>>(ltex, dlo, 10);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(lout, dlo, sizeof lout, cudaMemcpyDeviceToHost));
    printf("texture linear");
    for (int i = 0; i < 10; i++) {
        printf(" %d", lout[i]);
        ok = ok && lout[i] == lin[i];
    }
    printf("\n");

    CHECK(cudaDestroyTextureObject(clamp));
    CHECK(cudaDestroyTextureObject(wrap));
    CHECK(cudaDestroyTextureObject(border));
    CHECK(cudaDestroyTextureObject(ptex));
    CHECK(cudaDestroyTextureObject(ltex));
    CHECK(cudaFreeArray(arr));
    CHECK(cudaFree(pm));
    CHECK(cudaFree(dp));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(dl));
    CHECK(cudaFree(dlo));
    verdict("texture", ok, "sampled values");
}

static void surface(void)
{
    const int W = 16, H = 8;
    cudaChannelFormatDesc ud = cudaCreateChannelDesc<unsigned>();
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &ud, W, H, cudaArraySurfaceLoadStore));
    unsigned init[H][W], back[H][W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            init[y][x] = 7;
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, init, sizeof init[0], sizeof init[0], H,
                              cudaMemcpyHostToDevice));
    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = arr;
    cudaSurfaceObject_t surf;
    CHECK(cudaCreateSurfaceObject(&surf, &rd));
    cudaResourceDesc got;
    CHECK(cudaGetSurfaceObjectResourceDesc(&got, surf));
    printf("surface desc type=%d same_array=%d\n", (int)got.resType, got.res.array.array == arr);
    surf_fill<<<dim3(2, 2), dim3(8, 4)>>>(surf, W, H, 1000);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy2DFromArray(back, sizeof back[0], arr, 0, 0, sizeof back[0], H,
                                cudaMemcpyDeviceToHost));
    int ok = 1;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            ok = ok && back[y][x] == ((x + y) % 3 ? 1000u + (unsigned)(y * W + x) : 7u);
    printf("surface row0 %u %u %u %u sum=%08x\n", back[0][0], back[0][1], back[0][2], back[0][3],
           fnv((const unsigned char *)back, sizeof back));
    CHECK(cudaDestroySurfaceObject(surf));
    CHECK(cudaFreeArray(arr));
    verdict("surface", ok, "surface contents");
}

static void errors(void)
{
    const size_t W = 16, H = 8, RB = W * 4;
    cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
    cudaArray_t a;
    CHECK(cudaMallocArray(&a, &fd, W, H));
    unsigned char *ma = pattern(RB * H, 21), *junk = pattern(4096, 22);
    CHECK(cudaMemcpy2DToArray(a, 0, 0, ma, RB, RB, H, cudaMemcpyHostToDevice));
#define SHOW(name, call)                                                 \
    do {                                                                 \
        cudaError_t e_ = (call);                                         \
        printf("errors %s=%s\n", name, cudaGetErrorName(e_));           \
        cudaGetLastError();                                              \
    } while (0)
    SHOW("to_array_wide", cudaMemcpy2DToArray(a, 40, 0, junk, 64, 32, 2, cudaMemcpyHostToDevice));
    SHOW("to_array_tall", cudaMemcpy2DToArray(a, 0, 6, junk, 64, 16, 3, cudaMemcpyHostToDevice));
    SHOW("from_array_wide", cudaMemcpy2DFromArray(junk, 64, a, 8, 0, 60, 2, cudaMemcpyDeviceToHost));
    SHOW("to_array_pitch", cudaMemcpy2DToArray(a, 0, 0, junk, 8, 16, 2, cudaMemcpyHostToDevice));
    cudaMemcpy3DParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(junk, 64, 16, 8);
    p.dstArray = a;
    p.dstPos = make_cudaPos(10, 0, 0);
    p.extent = make_cudaExtent(8, 2, 1);
    p.kind = cudaMemcpyHostToDevice;
    SHOW("copy3d_outside", cudaMemcpy3D(&p));
    p.dstPos = make_cudaPos(0, 0, 0);
    p.srcArray = a;
    SHOW("copy3d_two_sources", cudaMemcpy3D(&p));
    cudaChannelFormatDesc three = cudaCreateChannelDesc(8, 8, 8, 0, cudaChannelFormatKindUnsigned);
    cudaArray_t bad;
    SHOW("three_channels", cudaMallocArray(&bad, &three, 4, 4));
    // nothing above changed the array
    unsigned char *back = read_array(a, RB, H);
    int ok = same(back, ma, RB * H, "array after errors");
    CHECK(cudaFreeArray(a));
    free(ma), free(junk), free(back);
    verdict("errors", ok, "array changed");
}

// cudaMemcpy3DPeer between two devices' pitched memory (one device: nothing to copy across).
static void peer3d(void)
{
    int n = 0;
    CHECK(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("peer3d devices=1\n");
        verdict("peer3d", 1, "");
        return;
    }
    cudaPitchedPtr a, b;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc3D(&a, make_cudaExtent(64, 4, 3)));
    const size_t AP = a.pitch;
    unsigned char *ma = pattern(AP * 4 * 3, 41);
    cudaMemcpy3DParms c;
    memset(&c, 0, sizeof c);
    c.srcPtr = make_cudaPitchedPtr(ma, AP, 64, 4);
    c.dstPtr = a;
    c.extent = make_cudaExtent(64, 4, 3);
    c.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&c));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc3D(&b, make_cudaExtent(96, 5, 3)));
    const size_t BP = b.pitch;
    CHECK(cudaMemset3D(b, 0, make_cudaExtent(96, 5, 3)));
    unsigned char *mb = zeros(BP * 5 * 3);
    cudaMemcpy3DPeerParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = a;
    p.srcDevice = 0;
    p.srcPos = make_cudaPos(4, 1, 0);
    p.dstPtr = b;
    p.dstDevice = 1;
    p.dstPos = make_cudaPos(10, 2, 1);
    p.extent = make_cudaExtent(50, 3, 2);
    CHECK(cudaMemcpy3DPeer(&p));
    box(mb, BP, 5, 10, 2, 1, ma, AP, 4, 4, 1, 0, 50, 3, 2);
    unsigned char *back = zeros(BP * 5 * 3);
    memset(&c, 0, sizeof c);
    c.srcPtr = b;
    c.dstPtr = make_cudaPitchedPtr(back, BP, 96, 5);
    c.extent = make_cudaExtent(96, 5, 3);
    c.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&c));
    int ok = 1;
    for (size_t r = 0; r < 5 * 3 && ok; r++)
        ok = same(back + r * BP, mb + r * BP, 96, "peer3d");
    printf("peer3d devices>=2\n");
    CHECK(cudaFree(b.ptr));
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(a.ptr));
    free(ma), free(mb), free(back);
    verdict("peer3d", ok, "contents");
}

// ---- pilot-only modes ----

static int hold(void)
{
    cudaChannelFormatDesc ud = cudaCreateChannelDesc<unsigned>();
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &ud, 64, 4, cudaArraySurfaceLoadStore));
    unsigned char *m = pattern(256 * 4, 31);
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, m, 256, 256, 4, cudaMemcpyHostToDevice));
    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = arr;
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    cudaTextureObject_t tex;
    cudaSurfaceObject_t surf;
    CHECK(cudaCreateTextureObject(&tex, &rd, &td, NULL));
    CHECK(cudaCreateSurfaceObject(&surf, &rd));
    printf("hold %llx %llx %llx\nholding\n", (unsigned long long)(uintptr_t)arr,
           (unsigned long long)tex, (unsigned long long)surf);
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 2;
    unsigned char *back = read_array(arr, 256, 4);
    int ok = same(back, m, 256 * 4, "held array");
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaDestroySurfaceObject(surf));
    CHECK(cudaFreeArray(arr));
    verdict("hold", ok, "contents");
    return g_failed;
}

static int forge(const char *a, const char *t, const char *s)
{
    cudaArray_t arr = (cudaArray_t)(uintptr_t)strtoull(a, NULL, 16);
    cudaTextureObject_t tex = strtoull(t, NULL, 16);
    cudaSurfaceObject_t surf = strtoull(s, NULL, 16);
    unsigned char buf[256];
    SHOW("read", cudaMemcpy2DFromArray(buf, 256, arr, 0, 0, 256, 1, cudaMemcpyDeviceToHost));
    SHOW("write", cudaMemcpyToArray(arr, 0, 0, buf, 16, cudaMemcpyHostToDevice));
    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = arr;
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    cudaTextureObject_t mine;
    SHOW("texture_over", cudaCreateTextureObject(&mine, &rd, &td, NULL));
    SHOW("destroy_texture", cudaDestroyTextureObject(tex));
    SHOW("destroy_surface", cudaDestroySurfaceObject(surf));
    SHOW("free_array", cudaFreeArray(arr));
    return 0;
}

// Pilot only: an array freed by one allocation and the same size allocated again reads zeros
// (pilot zeroes arrays it frees; natively a process may see its own old data).
static int scrub(void)
{
    cudaChannelFormatDesc fd = cudaCreateChannelDesc<float4>();
    const size_t row = 64 * 16, rows = 64 * 16;
    unsigned char *full = zeros(row * rows);
    memset(full, 0xab, row * rows);
    cudaArray_t a, b;
    CHECK(cudaMalloc3DArray(&a, &fd, make_cudaExtent(64, 64, 16), 0));
    cudaMemcpy3DParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(full, row, 64, 64);
    p.dstArray = a;
    p.extent = make_cudaExtent(64, 64, 16);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    CHECK(cudaFreeArray(a));
    CHECK(cudaMalloc3DArray(&b, &fd, make_cudaExtent(64, 64, 16), 0));
    memset(&p, 0, sizeof p);
    p.srcArray = b;
    p.dstPtr = make_cudaPitchedPtr(full, row, 64, 64);
    p.extent = make_cudaExtent(64, 64, 16);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    size_t nonzero = 0;
    for (size_t i = 0; i < row * rows; i++)
        nonzero += full[i] != 0;
    printf("scrub nonzero=%zu\n", nonzero);
    CHECK(cudaFreeArray(b));
    free(full);
    return 0;
}

static int hog(int count)
{
    cudaChannelFormatDesc fd = cudaCreateChannelDesc<float4>();
    int made = 0;
    cudaError_t err = cudaSuccess;
    for (; made < count; made++) {
        cudaArray_t a;
        err = cudaMalloc3DArray(&a, &fd, make_cudaExtent(64, 64, 16), 0);  // 1 MiB
        if (err != cudaSuccess)
            break;
    }
    printf("hog made=%d err=%s\nholding\n", made, cudaGetErrorName(err));
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))  // hold them until told
        return 0;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "hold") == 0)
        return hold();
    if (argc >= 5 && strcmp(argv[1], "forge") == 0)
        return forge(argv[2], argv[3], argv[4]);
    if (argc >= 2 && strcmp(argv[1], "scrub") == 0)
        return scrub();
    if (argc >= 3 && strcmp(argv[1], "hog") == 0)
        return hog(atoi(argv[2]));
    static const struct {
        const char *name;
        void (*fn)(void);
    } scenarios[] = {{"helpers", helpers}, {"pitched3d", pitched3d}, {"arrays", arrays},
                     {"arrays3d", arrays3d}, {"texture", texture}, {"surface", surface},
                     {"errors", errors}, {"peer3d", peer3d}};
    int ran = 0;
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (argc < 2 || strcmp(argv[1], scenarios[i].name) == 0) {
            scenarios[i].fn();
            ran = 1;
        }
    if (!ran) {
        printf("unknown scenario %s\n", argv[1]);
        return 2;
    }
    return g_failed;
}
