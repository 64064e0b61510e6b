/* One header between the kernels and the GPU toolkit: the .cu files are
 * written against CUDA's names, and a HIP build (STRATA_HIP, hipcc or
 * CMake's HIP language) maps each name used here to HIP's. Add a mapping
 * here when a kernel needs a new runtime call or intrinsic; a kernel file
 * gets an #if only where HIP lacks a whole feature (today: the BLAS GEMM
 * path, ST_GPU_HAVE_BLAS).
 *
 * C files may include it too (host code, tests): they get the runtime API
 * and its name mappings only; the device-side part needs C++.
 *
 * Warps: the kernels are written for 32-lane warps (shuffles, masks, block
 * sizes, `lane = threadIdx.x % 32`). ST_WARP is that constant: a *logical*
 * warp of 32 lanes, on every target. ST_WAVE is the hardware's wave size in
 * a device pass (32 on NVIDIA and RDNA, 64 on gfx9 / GCN such as gfx906).
 * On a wave64 target a wave holds two logical warps; what keeps them apart
 * is that every shuffle here passes the width ST_WARP, so no lane reads
 * across the 32-lane halves, and that nothing uses ballots, lane masks or
 * warpSize (check-hip.sh's grep keeps it so). A block of 32 threads then
 * fills half a wave: correct, half the lanes idle.
 */
#ifndef STRATA_BACKEND_CUDA_COMPAT_H
#define STRATA_BACKEND_CUDA_COMPAT_H

#define ST_WARP      32
#define ST_FULL_MASK 0xffffffffu
#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN_WAVEFRONT_SIZE)
#define ST_WAVE __AMDGCN_WAVEFRONT_SIZE
#else
#define ST_WAVE 32 /* CUDA, and every host pass (whose value is not the target's) */
#endif

#ifdef STRATA_HIP
#define ST_GPU_IS_HIP     1 /* the build's targets are "gfxNNNN" names; a device names its own */
#define __grid_constant__   /* CUDA's annotation of a kernel argument read in place; HIP copies it */

#ifdef __cplusplus
#include <stdint.h>

#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#include <hip/hip_runtime_api.h>
#endif

/* ---- runtime API (C and C++) ---- */
#define cudaError_t                                 hipError_t
#define cudaSuccess                                 hipSuccess
#define cudaErrorNoDevice                           hipErrorNoDevice
#define cudaErrorInsufficientDriver                 hipErrorInsufficientDriver
#define cudaGetErrorString                          hipGetErrorString
#define cudaGetLastError                            hipGetLastError
#define cudaGetDeviceCount                          hipGetDeviceCount
#define cudaGetDeviceProperties                     hipGetDeviceProperties
#define cudaDeviceProp                              hipDeviceProp_t
#define cudaSetDevice                               hipSetDevice
#define cudaGetDevice                               hipGetDevice
#define cudaDeviceSynchronize                       hipDeviceSynchronize
#define cudaMemGetInfo                              hipMemGetInfo
#define cudaMalloc                                  hipMalloc
#define cudaFree                                    hipFree
#define cudaMallocHost                              hipHostMalloc
#define cudaFreeHost                                hipHostFree
#define cudaHostRegister                            hipHostRegister
#define cudaHostUnregister                          hipHostUnregister
#define cudaHostRegisterPortable                    hipHostRegisterPortable
#define cudaHostRegisterMapped                      hipHostRegisterMapped
#define cudaErrorNotSupported                       hipErrorNotSupported
#define cudaMemcpy                                  hipMemcpy
#define cudaMemcpyAsync                             hipMemcpyAsync
#define cudaMemset                                  hipMemset
#define cudaMemsetAsync                             hipMemsetAsync
#define cudaMemcpyHostToDevice                      hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost                      hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice                    hipMemcpyDeviceToDevice
#define cudaStream_t                                hipStream_t
#define cudaStreamCreate                            hipStreamCreate
#define cudaStreamDestroy                           hipStreamDestroy
#define cudaStreamSynchronize                       hipStreamSynchronize
#define cudaStreamIsCapturing                       hipStreamIsCapturing
#define cudaStreamCaptureStatus                     hipStreamCaptureStatus
#define cudaStreamCaptureStatusNone                 hipStreamCaptureStatusNone
#define cudaStreamBeginCapture                      hipStreamBeginCapture
#define cudaStreamEndCapture                        hipStreamEndCapture
#define cudaStreamCaptureModeThreadLocal            hipStreamCaptureModeThreadLocal
#define cudaGraph_t                                 hipGraph_t
#define cudaGraphExec_t                             hipGraphExec_t
#define cudaGraphInstantiate(exec, graph, flags)    hipGraphInstantiate(exec, graph, nullptr, nullptr, 0)
#define cudaGraphLaunch                             hipGraphLaunch
#define cudaGraphDestroy                            hipGraphDestroy
#define cudaGraphExecDestroy                        hipGraphExecDestroy
#define cudaEvent_t                                 hipEvent_t
#define cudaEventCreate                             hipEventCreate
#define cudaEventDestroy                            hipEventDestroy
#define cudaEventRecord                             hipEventRecord
#define cudaEventSynchronize                        hipEventSynchronize
#define cudaEventElapsedTime                        hipEventElapsedTime
#define cudaFuncSetAttribute                        hipFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaDriverGetVersion                        hipDriverGetVersion
#define cudaDeviceGetAttribute                      hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount              hipDeviceAttributeMultiprocessorCount
#define cudaRuntimeGetVersion                       hipRuntimeGetVersion

/* hipBLAS is optional: Debian (bookworm, ROCm 5.2) packages hipcc and the
 * HIP runtime but neither hipBLAS nor rocBLAS. Without it the bf16 GEMM
 * path of the matrix products is compiled out (gemm.cu) and every token
 * count takes the matrix-vector kernels in groups of 8 (gemm_dispatch.cu):
 * correct, but prompt processing is slower than with a BLAS. */
#if defined(STRATA_HIP_BLAS) /* CMake says whether it found hipBLAS */
#define ST_GPU_HAVE_BLAS STRATA_HIP_BLAS
#elif defined(__has_include)
#if __has_include(<hipblas/hipblas.h>)
#define ST_GPU_HAVE_BLAS 1
#endif
#endif
#ifndef ST_GPU_HAVE_BLAS
#define ST_GPU_HAVE_BLAS 0
#endif

#ifdef __cplusplus
/* ---- device side and BLAS (C++ only) ---- */

/* Wave sizes: 32 (RDNA, or a gfx10+ target with -mwavefrontsize32) and 64
 * (gfx9, or RDNA with -mwavefrontsize64) are both right for the kernels,
 * see ST_WARP above; anything else stops the device pass. */
#if defined(__HIP_DEVICE_COMPILE__) && ST_WAVE != 32 && ST_WAVE != 64
#error "Strata's GPU kernels need waves of 32 or 64 lanes"
#endif

#if ST_GPU_HAVE_BLAS
/* hipBLAS 2.x (ROCm 6) takes hipDataType/hipblasComputeType_t in GemmEx
 * only with HIPBLAS_V2 (3.x always does); 1.x (ROCm 5) has the older
 * hipblasDatatype_t for both. Not compiled here (no hipBLAS in Debian). */
#define HIPBLAS_V2
#include <hipblas/hipblas.h>
#define cublasHandle_t             hipblasHandle_t
#define cublasStatus_t             hipblasStatus_t
#define CUBLAS_STATUS_SUCCESS      HIPBLAS_STATUS_SUCCESS
#define cublasCreate               hipblasCreate
#define cublasDestroy              hipblasDestroy
#define cublasSetStream            hipblasSetStream
#define cublasGemmEx               hipblasGemmEx
#define cublasGemmStridedBatchedEx hipblasGemmStridedBatchedEx
#define CUBLAS_OP_T                HIPBLAS_OP_T
#define CUBLAS_OP_N                HIPBLAS_OP_N
#define CUBLAS_GEMM_DEFAULT        HIPBLAS_GEMM_DEFAULT
#if defined(hipblasVersionMajor) && hipblasVersionMajor >= 2
#define CUDA_R_32F         HIP_R_32F
#define CUDA_R_16BF        HIP_R_16BF
#define CUDA_R_16F         HIP_R_16F
#define CUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#else
#define CUDA_R_32F         HIPBLAS_R_32F
#define CUDA_R_16BF        HIPBLAS_R_16B
#define CUDA_R_16F         HIPBLAS_R_16F
#define CUBLAS_COMPUTE_32F HIPBLAS_R_32F
#endif
#else
/* No BLAS: only the handle type and status remain, so that the scratch
 * struct (mm_impl.cuh) and CUBLAS_CHECK (common.cuh) read the same. */
typedef void *cublasHandle_t;
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
#endif

/* bf16 for the GEMM path's conversions. ROCm 5.2 has no CUDA-style bf16
 * API (hip_bf16.h came later), and the kernels need only storage and
 * round-to-nearest-even from f32, so it is spelled out here for every ROCm. */
struct st_bf16 {
    uint16_t x;
};
struct st_bf162 {
    st_bf16 x, y;
};
static __host__ __device__ inline st_bf16 st_float2bf16_rn(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    st_bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) r.x = (uint16_t)((u >> 16) | 0x40); /* NaN stays a quiet NaN */
    else r.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);           /* ties to even */
    return r;
}
static __host__ __device__ inline st_bf162 st_floats2bf162_rn(float a, float b) {
    st_bf162 r;
    r.x = st_float2bf16_rn(a);
    r.y = st_float2bf16_rn(b);
    return r;
}
#define __nv_bfloat16         st_bf16
#define __nv_bfloat162        st_bf162
#define __float2bfloat16_rn   st_float2bf16_rn
#define __floats2bfloat162_rn st_floats2bf162_rn

/* dp4a: signed 4 x int8 dot product plus an accumulator, per architecture
 * (the builtins differ; check-hip.sh finds each instruction in the code):
 *  - gfx906/908/90a and RDNA2 (gfx103x): the signed v_dot4_i32_i8
 *    (v_dot4c_i32_i8 on RDNA2), __builtin_amdgcn_sdot4;
 *  - RDNA3, RDNA3.5, RDNA4 (gfx11xx, gfx1150/1151, gfx12xx) have no signed
 *    form, only the mixed-sign v_dot4_i32_iu8, here with both operands
 *    marked signed, __builtin_amdgcn_sudot4;
 *  - other targets (and the host pass) add the four products. */
static __device__ __forceinline__ int st_dp4a(int a, int b, int c) {
#if defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) ||                    \
    defined(__gfx1150__) || defined(__gfx1151__) || defined(__gfx1200__) || defined(__gfx1201__)
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#elif defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__) || defined(__gfx1033__) ||                  \
    defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__) || defined(__gfx906__) ||                     \
    defined(__gfx908__) || defined(__gfx90a__)
    return __builtin_amdgcn_sdot4(a, b, c, false);
#else
    return c + (int)(int8_t)a * (int)(int8_t)b + (int)(int8_t)(a >> 8) * (int)(int8_t)(b >> 8) +
           (int)(int8_t)(a >> 16) * (int)(int8_t)(b >> 16) + (int)(int8_t)(a >> 24) * (int)(int8_t)(b >> 24);
#endif
}
#define __dp4a st_dp4a

/* __byte_perm (selectors 0-7 only, as the kernels use it) and
 * __funnelshift_r (shift & 31, via alignbit) are HIP device functions with
 * CUDA's meaning; nothing to map. */

/* __syncwarp: ROCm 5.x has none. A wave runs in lockstep, so what is left
 * is ordering: the lanes' shared-memory writes before the point are
 * visible to the wave's reads after it, and the compiler moves nothing
 * across (release fence, wave barrier, acquire fence). */
static __device__ __forceinline__ void st_syncwarp(void) {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
#define __syncwarp(...) st_syncwarp()

/* HIP's shuffles take no mask: every lane of the wave takes part, which is
 * what the kernels' full masks ask for. The width defaults to ST_WARP, not
 * to HIP's warpSize: on a wave64 target a shuffle then stays inside its
 * 32-lane logical warp, with CUDA's meaning within a warp (a source lane
 * taken modulo the width, an xor or shift past it reading the lane
 * itself). On wave32 it is the same width as HIP's default. A width given
 * (4th argument) wins. */
template <typename T> static __device__ __forceinline__ T st_shfl_xor(T v, int mask, int width = ST_WARP) {
    return __shfl_xor(v, mask, width);
}
template <typename T> static __device__ __forceinline__ T st_shfl(T v, int src, int width = ST_WARP) {
    return __shfl(v, src & (width - 1), width); /* HIP 5.2 adds src unmasked to the segment's base */
}
template <typename T> static __device__ __forceinline__ T st_shfl_down(T v, unsigned int d, int width = ST_WARP) {
    return __shfl_down(v, d, width);
}
template <typename T> static __device__ __forceinline__ T st_shfl_up(T v, unsigned int d, int width = ST_WARP) {
    return __shfl_up(v, d, width);
}
#define __shfl_xor_sync(mask, ...)  st_shfl_xor(__VA_ARGS__)
#define __shfl_sync(mask, ...)      st_shfl(__VA_ARGS__)
#define __shfl_down_sync(mask, ...) st_shfl_down(__VA_ARGS__)
#define __shfl_up_sync(mask, ...)   st_shfl_up(__VA_ARGS__)
#endif /* __cplusplus */

#else /* CUDA */
#define ST_GPU_IS_HIP    0
#define ST_GPU_HAVE_BLAS 1
#ifdef __cplusplus
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#else
#include <cuda_runtime_api.h>
#endif
#endif

#endif
