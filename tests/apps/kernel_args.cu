// kernel_args: kernels with by-value parameters of every common size and alignment, a
// 104-byte struct with mixed alignment between scalar parameters, and a kernel without
// parameters. The kernels write what they received (and a few derived values) to device
// memory; the host prints them with exact formats and checks them. PASS/FAIL at the end.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) {                                               \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_),       \
                   __FILE__, __LINE__, #call);                                   \
            printf("FAIL\n");                                                    \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

struct S {
    int a;
    double b;
    char c[3];
};  // 24 bytes, 8-aligned

struct Out {
    int s_a;
    int s_c[3];
    double s_b;
    int ch;
    int sh;
    double d;
    float f;
    float f_times_1_5;      // f * 1.5f (float)
    unsigned long long u;
    unsigned long long u_xor;  // u ^ 0xffffffff00000000
    unsigned long long u_shr;  // u >> 7
    double b_plus_d;        // s.b + d
    double d_times_f;       // d * (double)f
    long long in_sum;       // in[0] + in[1] + in[2]
    int sum_small;          // s.a + ch + sh
    int pad;
};

// Mixed alignment: offsets 0, 8, 16, 24, 28, 48, 56, 76, 80, 88; sizeof == 104.
struct Big {
    char tag;
    double d0;
    short s[3];
    int i0;
    char name[13];
    unsigned long long u;
    float f[5];
    char tail;
    double d1;
    int last[3];
};

__global__ void args_kernel(S s, char ch, short sh, double d, float f, unsigned long long u,
                            const int *in, Out *out)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    out->s_a = s.a;
    for (int k = 0; k < 3; k++)
        out->s_c[k] = s.c[k];
    out->s_b = s.b;
    out->ch = ch;
    out->sh = sh;
    out->d = d;
    out->f = f;
    out->f_times_1_5 = f * 1.5f;
    out->u = u;
    out->u_xor = u ^ 0xffffffff00000000ULL;
    out->u_shr = u >> 7;
    out->b_plus_d = s.b + d;
    out->d_times_f = d * (double)f;
    out->in_sum = (long long)in[0] + in[1] + in[2];
    out->sum_small = s.a + ch + sh;
}

__global__ void big_kernel(int before, Big b, char after, Big *out, long long *extra)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    out->tag = b.tag;
    out->d0 = b.d0;
    for (int k = 0; k < 3; k++)
        out->s[k] = b.s[k];
    out->i0 = b.i0;
    for (int k = 0; k < 13; k++)
        out->name[k] = b.name[k];
    out->u = b.u;
    for (int k = 0; k < 5; k++)
        out->f[k] = b.f[k];
    out->tail = b.tail;
    out->d1 = b.d1;
    for (int k = 0; k < 3; k++)
        out->last[k] = b.last[k];
    extra[0] = before;
    extra[1] = after;
    extra[2] = (long long)b.last[0] + b.last[1] + b.last[2] + b.i0 + before + after;
}

__global__ void noargs_kernel()
{
}

int main(void)
{
    int failed = 0;

    // ---- scalars and a small struct ----
    S s;
    memset(&s, 0, sizeof s);
    s.a = -123456789;
    s.b = 3.141592653589793;
    s.c[0] = 'x';
    s.c[1] = 'y';
    s.c[2] = 'z';
    const char ch = 'Z';
    const short sh = -12345;
    const double d = -2.5e-300;
    const float f = 1.1f;
    const unsigned long long u = 0xfedcba9876543210ULL;
    const int in_host[3] = {2000000000, 2000000000, -7};

    int *din;
    Out *dout;
    CHECK(cudaMalloc(&din, sizeof in_host));
    CHECK(cudaMalloc(&dout, sizeof(Out)));
    CHECK(cudaMemcpy(din, in_host, sizeof in_host, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0, sizeof(Out)));
    args_kernel<<<1, 32>>>(s, ch, sh, d, f, u, din, dout);
    CHECK(cudaGetLastError());
    Out o;
    CHECK(cudaMemcpy(&o, dout, sizeof o, cudaMemcpyDeviceToHost));

    printf("s.a %d\n", o.s_a);
    printf("s.b %.17g\n", o.s_b);
    printf("s.c %d %d %d\n", o.s_c[0], o.s_c[1], o.s_c[2]);
    printf("ch %d\n", o.ch);
    printf("sh %d\n", o.sh);
    printf("d %.17g\n", o.d);
    printf("f %.9g\n", (double)o.f);
    printf("f*1.5f %.9g\n", (double)o.f_times_1_5);
    printf("u %llu\n", o.u);
    printf("u^mask %llu\n", o.u_xor);
    printf("u>>7 %llu\n", o.u_shr);
    printf("s.b+d %.17g\n", o.b_plus_d);
    printf("d*f %.17g\n", o.d_times_f);
    printf("in_sum %lld\n", o.in_sum);
    printf("sum_small %d\n", o.sum_small);

    Out w;
    memset(&w, 0, sizeof w);
    w.s_a = s.a;
    for (int k = 0; k < 3; k++)
        w.s_c[k] = s.c[k];
    w.s_b = s.b;
    w.ch = ch;
    w.sh = sh;
    w.d = d;
    w.f = f;
    w.f_times_1_5 = f * 1.5f;
    w.u = u;
    w.u_xor = u ^ 0xffffffff00000000ULL;
    w.u_shr = u >> 7;
    w.b_plus_d = s.b + d;
    w.d_times_f = d * (double)f;
    w.in_sum = (long long)in_host[0] + in_host[1] + in_host[2];
    w.sum_small = s.a + ch + sh;
    if (memcmp(&o, &w, sizeof o) != 0) {
        printf("args_kernel: output differs from host computation\n");
        failed = 1;
    }

    // ---- a 104-byte struct between an int and a char ----
    Big b;
    memset(&b, 0, sizeof b);
    b.tag = 'T';
    b.d0 = 1.0 / 3.0;
    b.s[0] = -1;
    b.s[1] = 32767;
    b.s[2] = -32768;
    b.i0 = 0x12345678;
    memcpy(b.name, "pilot-kernel", 13);
    b.u = 18446744073709551557ULL;  // largest 64-bit prime
    for (int k = 0; k < 5; k++)
        b.f[k] = (float)(k + 1) / 7.0f;
    b.tail = '!';
    b.d1 = -6.02214076e23;
    b.last[0] = 1;
    b.last[1] = -2;
    b.last[2] = 2147483647;
    const int before = -99;
    const char after = 'q';

    Big *dbig;
    long long *dextra;
    CHECK(cudaMalloc(&dbig, sizeof(Big)));
    CHECK(cudaMalloc(&dextra, 3 * sizeof(long long)));
    CHECK(cudaMemset(dbig, 0, sizeof(Big)));
    CHECK(cudaMemset(dextra, 0, 3 * sizeof(long long)));
    big_kernel<<<1, 1>>>(before, b, after, dbig, dextra);
    CHECK(cudaGetLastError());
    Big ob;
    long long extra[3];
    CHECK(cudaMemcpy(&ob, dbig, sizeof ob, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(extra, dextra, sizeof extra, cudaMemcpyDeviceToHost));

    printf("sizeof(Big) %zu\n", sizeof(Big));
    printf("big.tag %d\n", ob.tag);
    printf("big.d0 %.17g\n", ob.d0);
    printf("big.s %d %d %d\n", ob.s[0], ob.s[1], ob.s[2]);
    printf("big.i0 %d\n", ob.i0);
    printf("big.name %.13s\n", ob.name);
    printf("big.u %llu\n", ob.u);
    printf("big.f %.9g %.9g %.9g %.9g %.9g\n", (double)ob.f[0], (double)ob.f[1],
           (double)ob.f[2], (double)ob.f[3], (double)ob.f[4]);
    printf("big.tail %d\n", ob.tail);
    printf("big.d1 %.17g\n", ob.d1);
    printf("big.last %d %d %d\n", ob.last[0], ob.last[1], ob.last[2]);
    printf("before %lld after %lld sum %lld\n", extra[0], extra[1], extra[2]);
    if (memcmp(&ob, &b, sizeof ob) != 0) {
        printf("big_kernel: struct differs from what was passed\n");
        failed = 1;
    }
    if (extra[0] != before || extra[1] != after ||
        extra[2] != 1LL - 2 + 2147483647 + 0x12345678 + before + after) {
        printf("big_kernel: scalar parameters around the struct are wrong\n");
        failed = 1;
    }

    // ---- no parameters ----
    noargs_kernel<<<2, 64>>>();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    printf("noargs ok\n");

    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(dbig));
    CHECK(cudaFree(dextra));
    printf(failed ? "FAIL\n" : "PASS\n");
    return failed ? 1 : 0;
}
