// The driver's linker (cuLink*), as Numba links every kernel and NVRTC programs link
// relocatable code: a kernel in one PTX calls a device function defined in another (both
// from `nvcc -ptx -rdc=true -arch=sm_90`); linked into one cubin, loaded and launched. Then
// what the linker refuses: a kernel whose function no input defines (the error log says why)
// and no state.
#include <cstdio>
#include <cstring>

#include <cuda.h>

#include "drv_check.h"

// extern "C" __global__ void link_scale(float *v, int n) { ... v[i] = link_twice(v[i]) + 1; }
static const char kernel_ptx[] =
    ".version 9.0\n"
    ".target sm_90\n"
    ".address_size 64\n"
    "\n"
    "\t// .globl\tlink_scale\n"
    ".extern .func  (.param .b32 func_retval0) _Z10link_twicef\n"
    "(\n"
    "\t.param .b32 _Z10link_twicef_param_0\n"
    ")\n"
    ";\n"
    "\n"
    ".visible .entry link_scale(\n"
    "\t.param .u64 link_scale_param_0,\n"
    "\t.param .u32 link_scale_param_1\n"
    ")\n"
    "{\n"
    "\t.reg .pred \t%p<2>;\n"
    "\t.reg .f32 \t%f<4>;\n"
    "\t.reg .b32 \t%r<6>;\n"
    "\t.reg .b64 \t%rd<5>;\n"
    "\n"
    "\n"
    "\tld.param.u64 \t%rd1, [link_scale_param_0];\n"
    "\tld.param.u32 \t%r2, [link_scale_param_1];\n"
    "\tmov.u32 \t%r3, %ctaid.x;\n"
    "\tmov.u32 \t%r4, %ntid.x;\n"
    "\tmov.u32 \t%r5, %tid.x;\n"
    "\tmad.lo.s32 \t%r1, %r3, %r4, %r5;\n"
    "\tsetp.ge.s32 \t%p1, %r1, %r2;\n"
    "\t@%p1 bra \t$L__BB0_2;\n"
    "\n"
    "\tcvta.to.global.u64 \t%rd2, %rd1;\n"
    "\tmul.wide.s32 \t%rd3, %r1, 4;\n"
    "\tadd.s64 \t%rd4, %rd2, %rd3;\n"
    "\tld.global.f32 \t%f1, [%rd4];\n"
    "\t{ // callseq 0, 0\n"
    "\t.reg .b32 temp_param_reg;\n"
    "\t.param .b32 param0;\n"
    "\tst.param.f32 \t[param0+0], %f1;\n"
    "\t.param .b32 retval0;\n"
    "\tcall.uni (retval0), \n"
    "\t_Z10link_twicef, \n"
    "\t(\n"
    "\tparam0\n"
    "\t);\n"
    "\tld.param.f32 \t%f2, [retval0+0];\n"
    "\t} // callseq 0\n"
    "\tadd.f32 \t%f3, %f2, 0f3F800000;\n"
    "\tst.global.f32 \t[%rd4], %f3;\n"
    "\n"
    "$L__BB0_2:\n"
    "\tret;\n"
    "\n"
    "}\n";

// __device__ float link_twice(float x) { return 2.0f * x; }
static const char function_ptx[] =
    ".version 9.0\n"
    ".target sm_90\n"
    ".address_size 64\n"
    "\n"
    "\t// .globl\t_Z10link_twicef\n"
    "\n"
    ".visible .func  (.param .b32 func_retval0) _Z10link_twicef(\n"
    "\t.param .b32 _Z10link_twicef_param_0\n"
    ")\n"
    "{\n"
    "\t.reg .f32 \t%f<3>;\n"
    "\n"
    "\n"
    "\tld.param.f32 \t%f1, [_Z10link_twicef_param_0];\n"
    "\tadd.f32 \t%f2, %f1, %f1;\n"
    "\tst.param.f32 \t[func_retval0+0], %f2;\n"
    "\tret;\n"
    "\n"
    "}\n";

int main()
{
    CHECK(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    char info[4096], error[4096];
    CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_WALL_TIME};
    void *values[] = {info, (void *)sizeof info, error, (void *)sizeof error, (void *)3, nullptr};
    CUlinkState link;
    CHECK(cuLinkCreate(6, options, values, &link));
    CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)kernel_ptx, sizeof kernel_ptx, "kernel.ptx",
                        0, nullptr, nullptr));
    CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)function_ptx, sizeof function_ptx,
                        "function.ptx", 0, nullptr, nullptr));
    void *cubin = nullptr;
    size_t size = 0;
    CHECK(cuLinkComplete(link, &cubin, &size));
    printf("linked: an image of some bytes: %d\n", cubin != nullptr && size > 0);
    printf("error log after a link that worked is empty: %d\n",
           (size_t)values[3] == 0 || error[0] == '\0');

    CUmodule module;
    CUfunction fn;
    CHECK(cuModuleLoadData(&module, cubin));
    CHECK(cuLinkDestroy(link));  // the module keeps what it loaded
    CHECK(cuModuleGetFunction(&fn, module, "link_scale"));
    const int n = 1000;
    float host[n];
    for (int i = 0; i < n; i++)
        host[i] = (float)i;
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, sizeof host));
    CHECK(cuMemcpyHtoD(d, host, sizeof host));
    int count = n;
    void *args[] = {&d, &count};
    CHECK(cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    CHECK(cuMemcpyDtoH(host, d, sizeof host));
    int wrong = 0;
    for (int i = 0; i < n; i++)
        wrong += host[i] != 2.0f * (float)i + 1.0f;
    printf("the linked kernel computed 2x+1: wrong %d\n", wrong);
    CHECK(cuMemFree(d));
    CHECK(cuModuleUnload(module));

    // PTX that calls a function no input defines: the link fails and its error log says so
    CUlinkState broken;
    error[0] = '\0';
    values[3] = (void *)sizeof error;
    CHECK(cuLinkCreate(6, options, values, &broken));
    CUresult added = cuLinkAddData(broken, CU_JIT_INPUT_PTX, (void *)kernel_ptx, sizeof kernel_ptx,
                                   "kernel.ptx", 0, nullptr, nullptr);
    CUresult done = added == CUDA_SUCCESS ? cuLinkComplete(broken, &cubin, &size) : added;
    printf("a kernel calling an undefined function does not link: %d\n", done != CUDA_SUCCESS);
    printf("and the error log says something: %d\n", error[0] != '\0');
    CHECK(cuLinkDestroy(broken));
    printf("no state is refused: %d\n", cuLinkComplete(nullptr, &cubin, &size) != CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
