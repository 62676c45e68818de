#!/usr/bin/env bash
# Builds the public CUDA programs that tests/gpu/real_programs.sh compares natively and under
# pilot, and writes the manifest that script reads. Run hack/fetch_real_programs.sh first.
#
#   hack/build_real_programs.sh [--src DIR] [--out DIR] [-j N] [NAME...]
#
#   --src DIR  the fetched sources (default .realprogs-src: cuda-samples/ and rodinia/)
#   --out DIR  what the GPU machine needs, and nothing else (default .realprogs, git-ignored;
#              carry it): bin/NAME, data/NAME/ (input files a program looks for in its working
#              directory; those over 256 KiB gzipped), manifest.tsv, SOURCES.tsv, build.log
#   -j N       parallel nvcc jobs (default: number of CPUs)
#   NAME...    build only these (the manifest still lists every program; unbuilt ones are
#              marked not-built)
#
# MC_EstimatePiInlineP and MC_SingleAsianOptionP need cuRAND's device headers (curand_kernel.h, no
# library). A toolkit without them (like the nvcc-only install this was prepared on) can take them
# from the nvidia-curand wheel (CUDA 13: nvidia-curand 10.4.x, headers in nvidia/cu13/include):
#   pip download --no-deps -d /tmp/w nvidia-curand && mkdir -p .realprogs-src/curand &&
#   unzip -q /tmp/w/nvidia_curand-*.whl 'nvidia/cu13/include/*' -d /tmp/w/x &&
#   mv /tmp/w/x/nvidia/cu13/include .realprogs-src/curand/include
# or point CURAND_INCLUDE at a directory holding curand_kernel.h.
#
# Every program is built the same way: nvcc -cudart shared -arch=$NVCC_ARCH -O2 (NVCC_ARCH
# defaults to sm_90), plus -std=c++17 --extended-lambda -I<cuda-samples>/Common for the CUDA
# samples (what their CMake files add), plus the few flags a program needs (listed per program
# below: -rdc=true -lcudadevrt for dynamic parallelism, -fopenmp, include dirs). The samples'
# CMake files build with -rdc=true everywhere; here only the programs that need it use it, so
# most fatbins are whole-program ones. Rodinia predates CUDA 12: its removed
# cudaThreadSynchronize is mapped to cudaDeviceSynchronize with -D (no source is edited).
#
# manifest.tsv columns (tab-separated, header first):
#   name    unique name of the run (= binary name)
#   exe     binary relative to OUT, or - (excluded / not built)
#   args    arguments, separated by spaces (none contain spaces), or -
#   data    data directory relative to OUT whose files are copied into the working directory
#           before each run, or -
#   filter  how stdout is compared (tests/gpu/real_programs.sh implements these):
#             verbatim   byte for byte
#             generic    drop lines that report times, rates or throughputs (case-insensitive:
#                        time, elapsed, throughput, bandwidth, a number followed by a time unit
#                        (bare or in parentheses),
#                        xB/s, FLOP(S), per second, .../s, "Exec:"); everything else verbatim
#             rc         only the exit status is compared (output not reproducible natively)
#           followed by any of ";drop=ERE" (also drop lines matching ERE), ";keep=ERE" (keep
#           only lines matching ERE), ";sort" (sort the lines: for output of several threads,
#           processes or device threads whose order is not fixed), applied left to right. Files
#           the program writes into its working directory are compared byte for byte too
#           (except with rc).
#   expect  ok (must match), or why pilot is expected to differ today:
#             printf    device-side printf/assert: the text is printed by the CUDA driver in
#                       pilotd's process, so it lands in pilotd's log, not the program's stdout
#             um        managed memory / pageable memory access from the GPU
#             texture   texture or surface objects, CUDA arrays
#             coop      cudaLaunchCooperativeKernel
#             graph     CUDA graphs / stream capture
#             callback  host callbacks (cudaStreamAddCallback, cudaLaunchHostFunc)
#             mempool   stream-ordered allocator (cudaMallocAsync, memory pools)
#             launchex  cudaLaunchKernelExC (launch attributes), used by Thrust/CUB here
#             ipc       CUDA IPC handles between processes (fork)
#           excluded / not-built: not run (note says why)
#   suite   cuda-samples or rodinia
#   note    free text
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$REPO/.realprogs-src
OUT=$REPO/.realprogs
NVCC_ARCH=${NVCC_ARCH:-sm_90}
JOBS=$(nproc 2>/dev/null || echo 2)
ONLY=()

while [ $# -gt 0 ]; do
    case $1 in
        --src) SRC=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -j) JOBS=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "unknown option: $1" >&2; exit 2 ;;
        *) ONLY+=("$1"); shift ;;
    esac
done

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CS=$SRC/cuda-samples
# curand_kernel.h (device-side cuRAND, header only) for the two MC_* samples: the toolkit's own if
# it has one, else $SRC/curand/include (see --help), else they are not built.
if [ -z "${CURAND_INCLUDE:-}" ]; then
    CURAND_INCLUDE=
    for d in "${CUDA_HOME:-/nonexistent}/include" /usr/local/cuda/include \
            "$(dirname "$(readlink -f "$NVCC")")/../include" "$SRC/curand/include"; do
        if [ -f "$d/curand_kernel.h" ]; then CURAND_INCLUDE=$d; break; fi
    done
fi
# -lcuda for the driver API samples: the toolkit's stub, else pilot's own libpilot-cuda.so (its
# SONAME is libcuda.so.1, so the binary needs the same library natively); else they are not built.
LIBCUDA_DIR=
for d in "${CUDA_HOME:-/nonexistent}/lib64/stubs" /usr/local/cuda/lib64/stubs \
        "$(dirname "$(readlink -f "$NVCC")")/../lib64/stubs"; do
    if [ -f "$d/libcuda.so" ]; then LIBCUDA_DIR=$d; break; fi
done
ROD=$SRC/rodinia
[ -d "$CS/Samples" ] || { echo "no CUDA samples under $CS: run hack/fetch_real_programs.sh" >&2; exit 1; }

# ---- the programs ----
# name | dir | sources | extra nvcc flags | args | data files | filter | expect | note
# dir: cs:<path under cuda-samples/Samples> or rod:<path under rodinia>. Sources are relative
# to dir; data files are taken from dir/data (cuda-samples) or dir (rodinia); a data file written
# X.cu>Y.fatbin is X.cu of dir built with nvcc -fatbin into Y (the driver API samples load one).
PROGRAMS=$(cat <<'EOF'
vectorAdd|cs:0_Introduction/vectorAdd|vectorAdd.cu|-|-|-|generic|ok|
template|cs:0_Introduction/template|template.cu template_cpu.cpp|-|-|-|generic|ok|
mergeSort|cs:0_Introduction/mergeSort|mergeSort.cu main.cpp mergeSort_host.cpp mergeSort_validate.cpp bitonic.cu|-|-|-|generic|ok|
clock|cs:0_Introduction/clock|clock.cu|-|-|-|generic;drop=clocks/block|ok|clock() cycle count per block is dropped (varies run to run)
cudaOpenMP|cs:0_Introduction/cudaOpenMP|cudaOpenMP.cu|-Xcompiler -fopenmp -lgomp|-|-|generic|ok|OpenMP: one CPU thread per GPU
simpleTemplates|cs:0_Introduction/simpleTemplates|simpleTemplates.cu|-|-|-|generic|ok|
simpleVoteIntrinsics|cs:0_Introduction/simpleVoteIntrinsics|simpleVoteIntrinsics.cu|-|-|-|generic|ok|
simpleOccupancy|cs:0_Introduction/simpleOccupancy|simpleOccupancy.cu|-|-|-|generic|ok|cudaOccupancyMaxPotentialBlockSize (header template over occupancy + function attributes)
deviceQuery|cs:1_Utilities/deviceQuery|deviceQuery.cpp|-|-|-|generic|ok|every device property printed
topologyQuery|cs:1_Utilities/topologyQuery|topologyQuery.cu|-|-|-|generic|ok|one GPU: only the GPU<->CPU attributes
convolutionSeparable|cs:2_Concepts_and_Techniques/convolutionSeparable|convolutionSeparable.cu convolutionSeparable_gold.cpp main.cpp|-|-|-|generic|ok|__constant__ kernel via cudaMemcpyToSymbol
histogram|cs:2_Concepts_and_Techniques/histogram|histogram64.cu histogram256.cu histogram_gold.cpp main.cpp|-|-|-|generic|ok|
radixSortThrust|cs:2_Concepts_and_Techniques/radixSortThrust|radixSortThrust.cu|-|-|-|generic|ok|Thrust sort (CUB kernels)
reduction|cs:2_Concepts_and_Techniques/reduction|reduction.cpp reduction_kernel.cu|-|-|-|generic|ok|
scalarProd|cs:2_Concepts_and_Techniques/scalarProd|scalarProd.cu scalarProd_cpu.cpp|-|-|-|generic|ok|
scan|cs:2_Concepts_and_Techniques/scan|main.cpp scan.cu scan_gold.cpp|-|-|-|generic|ok|
sortingNetworks|cs:2_Concepts_and_Techniques/sortingNetworks|main.cpp bitonicSort.cu oddEvenMergeSort.cu sortingNetworks_validate.cpp|-|-|-|generic|ok|
threadFenceReduction|cs:2_Concepts_and_Techniques/threadFenceReduction|threadFenceReduction.cu|-|-|-|generic|ok|__device__ counter reset through cudaMemcpyToSymbol
eigenvalues|cs:2_Concepts_and_Techniques/eigenvalues|main.cu bisect_large.cu bisect_small.cu bisect_util.cu gerschgorin.cpp matlab.cpp|-|-|diagonal.dat superdiagonal.dat reference.dat|generic|ok|reads its matrix and reference from data files
MC_EstimatePiInlineP|cs:2_Concepts_and_Techniques/MC_EstimatePiInlineP|src/main.cpp src/piestimator.cu src/test.cpp|-Iinc @CURAND@|-|-|generic|ok|device-side cuRAND (header only, no library)
MC_SingleAsianOptionP|cs:2_Concepts_and_Techniques/MC_SingleAsianOptionP|src/main.cpp src/pricingengine.cu src/test.cpp|-Iinc @CURAND@|-|-|generic|ok|device-side cuRAND (header only, no library)
StreamPriorities|cs:3_CUDA_Features/StreamPriorities|StreamPriorities.cu|-|-|-|generic|ok|
cudaTensorCoreGemm|cs:3_CUDA_Features/cudaTensorCoreGemm|cudaTensorCoreGemm.cu|-|-|-|generic|ok|WMMA fp16 GEMM, large dynamic shared memory (cudaFuncSetAttribute)
bf16TensorCoreGemm|cs:3_CUDA_Features/bf16TensorCoreGemm|bf16TensorCoreGemm.cu|-|-|-|generic|ok|WMMA bf16 GEMM
newdelete|cs:3_CUDA_Features/newdelete|newdelete.cu|-|-|-|generic|ok|device-side new/delete (device heap limit)
warpAggregatedAtomicsCG|cs:3_CUDA_Features/warpAggregatedAtomicsCG|warpAggregatedAtomicsCG.cu|-|-|-|generic|ok|
cdpSimpleQuicksort|cs:3_CUDA_Features/cdpSimpleQuicksort|cdpSimpleQuicksort.cu|-rdc=true -lcudadevrt|-|-|generic|ok|dynamic parallelism (-rdc, cudadevrt)
cdpAdvancedQuicksort|cs:3_CUDA_Features/cdpAdvancedQuicksort|cdpAdvancedQuicksort.cu cdpBitonicSort.cu|-rdc=true -lcudadevrt|-|-|generic|ok|dynamic parallelism, two .cu files device-linked
cdpQuadtree|cs:3_CUDA_Features/cdpQuadtree|cdpQuadtree.cu|-rdc=true -lcudadevrt|-|-|generic|ok|dynamic parallelism
cdpBezierTessellation|cs:3_CUDA_Features/cdpBezierTessellation|BezierLineCDP.cu|-rdc=true -lcudadevrt|-|-|generic|ok|dynamic parallelism
BlackScholes|cs:5_Domain_Specific/BlackScholes|BlackScholes.cu BlackScholes_gold.cpp|-|-|-|generic|ok|
binomialOptions|cs:5_Domain_Specific/binomialOptions|binomialOptions.cpp binomialOptions_gold.cpp binomialOptions_kernel.cu|-|-|-|generic|ok|
fastWalshTransform|cs:5_Domain_Specific/fastWalshTransform|fastWalshTransform.cu fastWalshTransform_gold.cpp|-|-|-|generic|ok|
quasirandomGenerator|cs:5_Domain_Specific/quasirandomGenerator|quasirandomGenerator.cpp quasirandomGenerator_gold.cpp quasirandomGenerator_kernel.cu|-|-|-|generic|ok|
SobolQRNG|cs:5_Domain_Specific/SobolQRNG|sobol.cpp sobol_gold.cpp sobol_gpu.cu sobol_primitives.cpp|-|-|-|generic|ok|
dxtc|cs:5_Domain_Specific/dxtc|dxtc.cu|-|-|teapot512_std.ppm teapot512_ref.dds|generic|ok|writes its compressed image (compared too)
FDTD3d|cs:5_Domain_Specific/FDTD3d|src/FDTD3d.cpp src/FDTD3dGPU.cu src/FDTD3dReference.cpp|-Iinc|-|-|generic|ok|
LargeKernelParameter|cs:6_Performance/LargeKernelParameter|LargeKernelParameter.cu|-|-|-|generic|ok|32,764-byte kernel parameter list
alignedTypes|cs:6_Performance/alignedTypes|alignedTypes.cu|-|-|-|generic|ok|
transpose|cs:6_Performance/transpose|transpose.cu|-|-|-|generic|ok|
systemWideAtomics|cs:0_Introduction/systemWideAtomics|systemWideAtomics.cu|-|-|-|generic|um|GPU atomics on malloc()ed memory: needs pageableMemoryAccess (HMM), waives (rc 2) without it
simplePrintf|cs:0_Introduction/simplePrintf|simplePrintf.cu|-|-|-|generic;sort|ok|
cdpSimplePrint|cs:3_CUDA_Features/cdpSimplePrint|cdpSimplePrint.cu|-rdc=true -lcudadevrt|-|-|generic;sort|printf|dynamic parallelism + device printf
simpleCooperativeGroups|cs:0_Introduction/simpleCooperativeGroups|simpleCooperativeGroups.cu|-|-|-|generic;sort|ok|thread-block groups only (no cooperative launch); results printed from the device
simpleAssert|cs:0_Introduction/simpleAssert|simpleAssert.cu|-|-|-|generic|ok|device assert: message printed by the driver, and cudaErrorAssert leaves the (shared) context unusable
asyncAPI|cs:0_Introduction/asyncAPI|asyncAPI.cu|-|-|-|generic;drop=^CPU executed|ok|cudaMallocHost
matrixMul|cs:0_Introduction/matrixMul|matrixMul.cu|-|-|-|generic|ok|cudaMallocHost
fp16ScalarProduct|cs:0_Introduction/fp16ScalarProduct|fp16ScalarProduct.cu|-|-|-|generic;drop=^Result |ok|cudaMallocHost
simpleAtomicIntrinsics|cs:0_Introduction/simpleAtomicIntrinsics|simpleAtomicIntrinsics.cu simpleAtomicIntrinsics_cpu.cpp|-|-|-|generic|ok|cudaMallocHost
simpleHyperQ|cs:0_Introduction/simpleHyperQ|simpleHyperQ.cu|-|-|-|generic|ok|cudaMallocHost; 32 streams
simpleStreams|cs:0_Introduction/simpleStreams|simpleStreams.cu|-|-|-|generic;drop=^memcopy:;drop=^kernel:;drop=^non-streamed:;drop=^[0-9]+ streams:|ok|cudaHostAlloc / cudaHostRegister
simpleZeroCopy|cs:0_Introduction/simpleZeroCopy|simpleZeroCopy.cu|-|-|-|generic|ok|mapped host memory (cudaHostAlloc + cudaHostGetDevicePointer)
simpleMultiCopy|cs:0_Introduction/simpleMultiCopy|simpleMultiCopy.cu|-|-|-|generic|ok|cudaHostAlloc; copy/compute overlap
shfl_scan|cs:2_Concepts_and_Techniques/shfl_scan|shfl_scan.cu|-|-|-|generic|ok|cudaMallocHost
inlinePTX|cs:2_Concepts_and_Techniques/inlinePTX|inlinePTX.cu|-|-|-|generic|ok|cudaMallocHost
globalToShmemAsyncCopy|cs:3_CUDA_Features/globalToShmemAsyncCopy|globalToShmemAsyncCopy.cu|-|-|-|generic|ok|cudaMallocHost; memcpy_async / cuda::pipeline
binaryPartitionCG|cs:3_CUDA_Features/binaryPartitionCG|binaryPartitionCG.cu|-|-|-|generic|ok|cudaHostAlloc
UnifiedMemoryPerf|cs:6_Performance/UnifiedMemoryPerf|matrixMultiplyPerf.cu commonKernels.cu helperFunctions.cpp|-|-|-|generic;drop=^[0-9]+[[:space:]]|ok|cudaMallocManaged, also pinned and mapped host memory
simpleTexture|cs:0_Introduction/simpleTexture|simpleTexture.cu|-|-|teapot512.pgm ref_rotated.pgm|generic|ok|CUDA array + texture object
simpleCubemapTexture|cs:0_Introduction/simpleCubemapTexture|simpleCubemapTexture.cu|-|-|-|generic|ok|cubemap CUDA array (cudaMalloc3DArray)
simplePitchLinearTexture|cs:0_Introduction/simplePitchLinearTexture|simplePitchLinearTexture.cu|-|-|-|generic|ok|pitch-linear and array textures
simpleSurfaceWrite|cs:0_Introduction/simpleSurfaceWrite|simpleSurfaceWrite.cu|-|-|teapot512.pgm ref_rotated.pgm|generic|ok|surface object writes
convolutionTexture|cs:2_Concepts_and_Techniques/convolutionTexture|convolutionTexture.cu convolutionTexture_gold.cpp main.cpp|-|-|-|generic|ok|
stereoDisparity|cs:5_Domain_Specific/stereoDisparity|stereoDisparity.cu|-|-|stereo.im0.640x533.ppm stereo.im1.640x533.ppm|generic|ok|texture objects over pitched memory
reductionMultiBlockCG|cs:2_Concepts_and_Techniques/reductionMultiBlockCG|reductionMultiBlockCG.cu|-|-|-|generic|ok|grid.sync() through cudaLaunchCooperativeKernel
simpleAWBarrier|cs:0_Introduction/simpleAWBarrier|simpleAWBarrier.cu|-|-|-|generic|ok|cudaHostAlloc (and cudaLaunchCooperativeKernel)
simpleCudaGraphs|cs:3_CUDA_Features/simpleCudaGraphs|simpleCudaGraphs.cu|-|-|-|generic|ok|graphs built by hand and by stream capture, host nodes, cudaHostAlloc
graphMemoryNodes|cs:3_CUDA_Features/graphMemoryNodes|graphMemoryNodes.cu|-|-|-|generic|ok|graph memory nodes, cudaMallocAsync in a capture, an address reused after a free in the same graph
simpleCallback|cs:0_Introduction/simpleCallback|simpleCallback.cu multithreading.cpp|-|-|-|generic;sort|ok|cudaHostAlloc (and cudaStreamAddCallback from worker threads)
streamOrderedAllocation|cs:2_Concepts_and_Techniques/streamOrderedAllocation|streamOrderedAllocation.cu|-|-|-|generic|ok|cudaMallocAsync / cudaFreeAsync, memory pool attributes
simpleAttributes|cs:0_Introduction/simpleAttributes|simpleAttributes.cu|-|-|-|generic|ok|access policy window (cudaStreamSetAttribute, kept as a hint), cudaCtxResetPersistingL2Cache (nothing of the program's persists), cudaHostAlloc
segmentationTreeThrust|cs:2_Concepts_and_Techniques/segmentationTreeThrust|segmentationTree.cu|-|-|test.ppm ref_00.ppm ref_09.ppm|generic|ok|Thrust; this CUB path launches through cudaLaunchKernelExC with programmatic dependent launch
simpleIPC|cs:0_Introduction/simpleIPC|simpleIPC.cu ../../../Common/helper_multiprocess.cpp|-|-|-|generic;drop=lshmName;sort|ok|forks worker processes that open cudaIpc memory and event handles (carried since the twelfth session; identical on an H200, 2026-11-28)
backprop|rod:cuda/backprop|backprop.c facetrain.c imagenet.c backprop_cuda.cu|-lm|65536|-|generic|ok|Rodinia; fixed seed; prints no results (exit status and progress lines)
gaussian|rod:cuda/gaussian|gaussian.cu|-DclockRate=memoryBusWidth -DdeviceOverlap=asyncEngineCount|-s 128|-|generic|ok|Rodinia; prints the matrices and the solution. Its device-property printout names two fields CUDA 13 removed: they are mapped to other fields with -D
lud|rod:cuda/lud/cuda|lud.cu lud_kernel.cu ../common/common.c|-I../common|-s 1024 -v|-|generic|ok|Rodinia; -v verifies against the CPU
nw|rod:cuda/nw|needle.cu|-|2048 10|-|generic|ok|Rodinia Needleman-Wunsch; result.txt compared
pathfinder|rod:cuda/pathfinder|pathfinder.cu|-|20000 100 20|-|generic|ok|Rodinia; prints input row and result row
srad_v2|rod:cuda/srad/srad_v2|srad.cu|-DOUTPUT|256 256 0 127 0 127 0.5 2|-|generic|ok|Rodinia; -DOUTPUT prints the resulting image. srad_cuda_1 reads 512 bytes before its first allocation (compute-sanitizer): faults when pilotd serves two GPUs (bench/RESULTS.md)
streamcluster|rod:cuda/streamcluster|streamcluster_cuda_cpu.cpp streamcluster_cuda.cu streamcluster_header.cu|-|10 20 256 65536 65536 1000 none output.txt 1|-|generic|ok|Rodinia; output.txt compared
vectorAddDrv|cs:0_Introduction/vectorAddDrv|vectorAddDrv.cpp|@LIBCUDA@|-|vectorAdd_kernel.cu>vectorAdd_kernel64.fatbin|generic|ok|driver API: cuModuleLoadData of a fatbin, cuLaunchKernel (pilot run preloads libpilot-cuda.so)
matrixMulDrv|cs:0_Introduction/matrixMulDrv|matrixMulDrv.cpp|@LIBCUDA@|-|matrixMul_kernel.cu>matrixMul_kernel64.fatbin|generic|ok|driver API: context, module, cuLaunchKernel with a parameter buffer
simpleDrvRuntime|cs:0_Introduction/simpleDrvRuntime|simpleDrvRuntime.cpp|@LIBCUDA@|-|vectorAdd_kernel.cu>vectorAdd_kernel64.fatbin|generic|ok|driver API and runtime mixed in one program
deviceQueryDrv|cs:1_Utilities/deviceQueryDrv|deviceQueryDrv.cpp|@LIBCUDA@|-|-|generic|ok|device attributes through the driver API
particlefilter_float|rod:cuda/particlefilter|ex_particle_CUDA_float_seq.cu|-use_fast_math|-x 128 -y 128 -z 10 -np 1000|-|rc|ok|Rodinia; seeds its RNG from time(0), so only the exit status is compared
EOF
)

# ---- programs not run, and why (the GPU run lists them too) ----
EXCLUDED=$(cat <<'EOF'
UnifiedMemoryStreams, batchCUBLAS, matrixMulCUBLAS, simpleCUBLAS, simpleCUBLAS_LU|cs:cuBLAS|cuBLAS samples: this toolkit has no cuBLAS to build them; tests/gpu/cublas_samples.sh builds and compares them on the GPU machine
clock_nvrtc, matrixMul_nvrtc, simpleAssert_nvrtc, simpleAtomicIntrinsics_nvrtc, vectorAdd_nvrtc, inlinePTX_nvrtc, BlackScholes_nvrtc, binomialOptions_nvrtc, quasirandomGenerator_nvrtc|cs:*_nvrtc|NVRTC + driver API (cuModuleLoad, cuLaunchKernel): bypass the runtime pilot interposes
simpleTextureDrv, vectorAddMMAP, matrixMulDynlinkJIT, threadMigration, ptxjit, cudaCompressibleMemory, memMapIPCDrv|cs:driver API|driver API programs using what libpilot-cuda.so does not carry: texture references, the virtual memory calls, JIT linking, contexts across threads, compressible memory, IPC
simpleMPI|cs:0_Introduction/simpleMPI|MPI
simpleP2P, simpleMultiGPU, p2pBandwidthLatencyTest, streamOrderedAllocationP2P, conjugateGradientMultiDeviceCG, simpleCUFFT_MGPU, simpleCUFFT_2d_MGPU, MonteCarloMultiGPU|cs:multi-GPU|need several GPUs (not run on a one-GPU machine; most use pinned host memory too); MonteCarloMultiGPU also needs cuRAND
streamOrderedAllocationIPC|cs:2_Concepts_and_Techniques/streamOrderedAllocationIPC|IPC of memory pools between processes + driver API
simpleCUDA2GL, simpleTexture3D, boxFilter, imageDenoising, particles, FunctionPointers, bindlessTexture, Mandelbrot, SobelFilter, bicubicTexture, bilateralFilter, fluidsGL, marchingCubes, nbody, postProcessGL, recursiveGaussian, simpleGL, smokeParticles, volumeFiltering, volumeRender|cs:graphics|OpenGL/GLUT interop (no display on the GPU machine; most use textures too)
simpleVulkan, simpleVulkanMMAP, vulkanImageCUDA, simpleD3D11, simpleD3D11Texture, simpleD3D12, EGLStream_CUDA_CrossGPU, EGLStream_CUDA_Interop|cs:graphics APIs|Vulkan / Direct3D / EGL interop
MC_EstimatePiP, MC_EstimatePiQ, MC_EstimatePiInlineQ, MersenneTwisterGP11213, randomFog|cs:cuRAND|host cuRAND library (randomFog also OpenGL)
simpleCUBLASXT, conjugateGradient, conjugateGradientPrecond, conjugateGradientUM, conjugateGradientCudaGraphs, conjugateGradientMultiBlockCG|cs:cuBLASXt/cuSPARSE|cuBLASXt / cuSPARSE libraries (not carried)
cuSolverDn_LinearSolver, cuSolverRf, cuSolverSp_LinearSolver, cuSolverSp_LowlevelCholesky, cuSolverSp_LowlevelQR|cs:cuSOLVER|cuSOLVER / cuSPARSE libraries
simpleCUFFT, simpleCUFFT_callback, convolutionFFT2D, oceanFFT|cs:cuFFT|cuFFT library (oceanFFT also OpenGL)
FilterBorderControlNPP, boxFilterNPP, cannyEdgeDetectorNPP, freeImageInteropNPP, histEqualizationNPP, watershedSegmentationNPP|cs:NPP|NPP library (and FreeImage)
nvJPEG, nvJPEG_encoder|cs:nvJPEG|nvJPEG library
cudaNvSci, jitLto|cs:other libraries|NvSci (Tegra/driver) / nvJitLink + NVRTC
lineOfSight|cs:4_CUDA_Libraries/lineOfSight|texture objects over CUDA arrays (textures are covered by the six texture programs above)
jacobiCudaGraphs, graphConditionalNodes, graphMemoryFootprint, cudaGraphsPerfScaling|cs:graphs|CUDA graphs (covered by simpleCudaGraphs and graphMemoryNodes)
dmmaTensorCoreGemm, immaTensorCoreGemm, tf32TensorCoreGemm|cs:3_CUDA_Features|same WMMA structure as cudaTensorCoreGemm / bf16TensorCoreGemm, which are run
dct8x8, HSOpticalFlow|cs:texture + data|texture objects over CUDA arrays plus image data (textures covered above)
NV12toBGRandResize|cs:5_Domain_Specific/NV12toBGRandResize|texture objects and managed memory, 4.8 MB of input video frames
interval|cs:2_Concepts_and_Techniques/interval|needs Boost.Interval headers (not installed on the build machine)
dwtHaar1D|cs:5_Domain_Specific/dwtHaar1D|its input signal_2_18.dat and reference are absent from the fetched snapshot (Git LFS-sized files)
7_libNVVM/*|cs:7_libNVVM|libNVVM + driver API
8_Platform_Specific/Tegra/*|cs:8_Platform_Specific|Tegra / cuDLA / NvMedia only
hotspot, hotspot3D, bfs, b+tree, cfd, kmeans, nn, myocyte, heartwall, leukocyte, srad_v1, dwt2d, huffman, mummergpu|rod:cuda|Rodinia programs whose inputs are the separately downloaded Rodinia data set (not in git); kmeans, leukocyte, mummergpu also use texture references, removed in CUDA 12
hybridsort|rod:cuda/hybridsort|texture references (removed in CUDA 12)
particlefilter_naive|rod:cuda/particlefilter|same program as particlefilter_float (double precision)
lavaMD|rod:cuda/lavaMD|draws its input with srand(time(NULL)) and checks no CUDA error: nothing to compare but an exit status that is always 0
EOF
)

# a full build starts from nothing, so no binary of a program dropped from the list lingers
[ ${#ONLY[@]} = 0 ] && rm -rf "${OUT:?}/bin" "${OUT:?}/data"
mkdir -p "$OUT/bin" "$OUT/data"
LOGDIR=$(mktemp -d /tmp/realprogs-build.XXXXXX)
trap 'rm -rf "$LOGDIR"' EXIT
if [ -z "$LIBCUDA_DIR" ]; then
    pilot_cuda=$("${PYTHON:-python3}" -c 'import pilot.shim, pathlib; print(pathlib.Path(pilot.shim.__file__).parent / "libpilot-cuda.so")' 2>/dev/null || true)
    if [ -f "$pilot_cuda" ]; then
        LIBCUDA_DIR=$LOGDIR/libcuda
        mkdir -p "$LIBCUDA_DIR"
        ln -s "$pilot_cuda" "$LIBCUDA_DIR/libcuda.so"
    fi
fi

wanted() {  # wanted NAME: is NAME selected on the command line (or nothing selected)?
    [ ${#ONLY[@]} = 0 ] && return 0
    local n
    for n in "${ONLY[@]}"; do [ "$n" = "$1" ] && return 0; done
    return 1
}

dir_of() {  # dir_of cs:PATH|rod:PATH -> absolute directory
    case $1 in
        cs:*) printf '%s/Samples/%s' "$CS" "${1#cs:}" ;;
        rod:*) printf '%s/%s' "$ROD" "${1#rod:}" ;;
        *) echo "bad dir $1" >&2; return 1 ;;
    esac
}

# build_one NAME DIR SOURCES FLAGS: compiles into $OUT/bin/NAME; log in $LOGDIR/NAME.log
build_one() {
    local name=$1 dir=$2 sources=$3 flags=$4 d
    local -a cmd
    d=$(dir_of "$dir")
    cmd=("$NVCC" -cudart shared "-arch=$NVCC_ARCH" -O2)
    case $dir in
        cs:*) cmd+=(-std=c++17 --extended-lambda "-I$CS/Common") ;;
        rod:*) cmd+=(-w -DcudaThreadSynchronize=cudaDeviceSynchronize) ;;
    esac
    if [[ $flags == *@LIBCUDA@* ]]; then
        if [ -n "$LIBCUDA_DIR" ]; then
            flags=${flags//@LIBCUDA@/-L$LIBCUDA_DIR -lcuda}
        else
            echo "no libcuda.so to link with: install pilot (pip) or give the toolkit's stubs" \
                >"$LOGDIR/$name.log"
            echo 1 >"$LOGDIR/$name.rc"
            return 0
        fi
    fi
    if [[ $flags == *@CURAND@* ]]; then
        if [ -n "$CURAND_INCLUDE" ]; then
            flags=${flags//@CURAND@/-I$CURAND_INCLUDE}
        else
            flags=${flags//@CURAND@/}
            echo "no curand_kernel.h found: set CURAND_INCLUDE (see --help)" >"$LOGDIR/$name.log"
        fi
    fi
    # shellcheck disable=SC2206  # flags and sources are word lists without globs
    [ "$flags" = - ] || cmd+=($flags)
    # shellcheck disable=SC2206
    cmd+=(-o "$OUT/bin/$name" $sources)
    rm -f "$OUT/bin/$name"
    printf '$ (cd %s && %s)\n' "${d#"$SRC"/}" "${cmd[*]}" >"$LOGDIR/$name.log"
    local rc=0
    (cd "$d" && "${cmd[@]}") >>"$LOGDIR/$name.log" 2>&1 || rc=$?
    echo "$rc" >"$LOGDIR/$name.rc"
}

copy_data() {  # copy_data NAME DIR FILES (X.cu>Y.fatbin: X.cu of DIR built into the fatbin Y)
    local name=$1 dir=$2 files=$3 d f src
    rm -rf "${OUT:?}/data/$name"
    [ "$files" = - ] && return 0
    d=$(dir_of "$dir")
    [ -d "$d/data" ] && src=$d/data || src=$d
    mkdir -p "$OUT/data/$name"
    for f in $files; do
        if [[ $f == *'>'* ]]; then
            (cd "$d" && "$NVCC" -fatbin "-arch=$NVCC_ARCH" -O2 "-I$CS/Common" \
                -o "$OUT/data/$name/${f#*>}" "${f%%>*}") || return 1
            continue
        fi
        cp "$src/$f" "$OUT/data/$name/" || return 1
        # large inputs travel gzipped (tests/gpu/real_programs.sh unpacks them)
        if [ "$(stat -c %s "$src/$f")" -gt 262144 ]; then gzip -9 -f "$OUT/data/$name/$f"; fi
    done
}

echo "[build] $NVCC ($("$NVCC" --version | tail -n 1)), -arch=$NVCC_ARCH, $JOBS jobs, into $OUT" >&2
running=0
while IFS='|' read -r name dir sources flags _args data _rest; do
    [ -n "$name" ] || continue
    wanted "$name" || continue
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    copy_data "$name" "$dir" "$data" || echo "[build] $name: data files missing" >&2
    build_one "$name" "$dir" "$sources" "$flags" &
    running=$((running + 1))
done <<<"$PROGRAMS"
wait

built=0
failed=0
{
    echo "build of $(date -u +%FT%TZ) with $("$NVCC" --version | tail -n 1)"
} >"$OUT/build.log"
manifest=$OUT/manifest.tsv
printf 'name\texe\targs\tdata\tfilter\texpect\tsuite\tnote\n' >"$manifest.new"
while IFS='|' read -r name dir sources flags args data filter expect note; do
    [ -n "$name" ] || continue
    suite=cuda-samples
    [ "${dir%%:*}" = rod ] && suite=rodinia
    exe=bin/$name
    if [ -f "$LOGDIR/$name.rc" ]; then
        if [ "$(cat "$LOGDIR/$name.rc")" = 0 ]; then
            built=$((built + 1))
        else
            failed=$((failed + 1))
            echo "[build] FAILED: $name (see $OUT/build.log)" >&2
        fi
        { echo; echo "### $name"; cat "$LOGDIR/$name.log"; } >>"$OUT/build.log"
    fi
    if [ ! -x "$OUT/$exe" ]; then
        exe=-
        note="nvcc failed or not built (build.log); ${note}"
        expect=not-built
    fi
    [ "$data" = - ] || data=data/$name
    [ -n "$note" ] || note=-
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$exe" "$args" "$data" "$filter" "$expect" "$suite" "$note" >>"$manifest.new"
done <<<"$PROGRAMS"
while IFS='|' read -r names dir reason; do
    [ -n "$names" ] || continue
    suite=cuda-samples
    [ "${dir%%:*}" = rod ] && suite=rodinia
    printf '%s\t-\t-\t-\t-\texcluded\t%s\t%s\n' "$names" "$suite" "$reason" >>"$manifest.new"
done <<<"$EXCLUDED"
mv "$manifest.new" "$manifest"
[ -f "$SRC/SOURCES.tsv" ] && cp "$SRC/SOURCES.tsv" "$OUT/SOURCES.tsv"

echo "[build] built $built, failed $failed; manifest $manifest; $(du -sh "$OUT" | cut -f1) in $OUT" >&2
[ "$failed" = 0 ]
